"""Attention backends (`models.attention`): splash (Pallas, run by its interpreter on CPU) and
the cuDNN wrapper (through `jax.nn.dot_product_attention(implementation="xla")`) give the
einsum form's values and gradients at every position, padding included, for every mask the
round uses; splash under `shard_map` on the 8-device mesh; `auto` picks by the platform
compiled for; splash lowers and compiles for a TPU slice with the TPU compiler."""

from __future__ import annotations

import functools
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as mask_lib

import jaxrubric
from jaxrubric import sharding as shd
from jaxrubric.config import ConfigFileError, load_config
from jaxrubric.models import attention
from jaxrubric.models.attention import CausalPadding, cudnn, splash
from jaxrubric.models.config import ConfigError
from jaxrubric.plan import hlo_cost

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "tiny_dynamic_rubric.py"


def _normal(rng: np.random.Generator, *shape: int) -> jax.Array:
    return jnp.asarray(rng.normal(size=shape), jnp.float32)


def _close(got, want) -> None:
    """Finite, and equal within 1e-5 of each array's scale (its largest entry, at least 1):
    a model's parameter gradients sum hundreds of positions, and the einsum form's own move
    that much (5.7e-5 on entries near 100) when only its query blocks (`attention_chunk`)
    change."""
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        a, b = np.asarray(a), np.asarray(b)
        assert np.isfinite(a).all()
        np.testing.assert_allclose(a, b, atol=1e-5 * max(1.0, np.abs(b).max()), rtol=1e-5)


def _values_and_grads(fn, args):
    """`fn(*args)` and the gradients wrt every argument of a random projection of it."""
    out = jax.jit(fn)(*args)
    weights = jax.tree.map(lambda x: _normal(np.random.default_rng(9), *x.shape), out)

    def loss(*a):
        return sum(jnp.sum(o * w) for o, w in zip(jax.tree.leaves(fn(*a)),
                                                  jax.tree.leaves(weights)))
    return out, jax.jit(jax.grad(loss, argnums=tuple(range(len(args)))))(*args)


def _causal_case(t: int, heads: int, kv_heads: int, key_slots: int | None = None):
    """q, k, v over two rows: row 0 left-padded (its first queries see no key), row 1
    right-padded with a gap in the middle; T = `t`, keys `key_slots` (default T)."""
    rng = np.random.default_rng(t + heads + kv_heads)
    s = key_slots or t
    valid = np.ones((2, t), bool)
    valid[0, :t // 4] = False
    valid[1, t - t // 5:] = False
    valid[1, t // 3:t // 3 + 4] = False
    qkv = (_normal(rng, 2, t, heads, 32), _normal(rng, 2, kv_heads, s, 32),
           _normal(rng, 2, kv_heads, s, 32))
    return qkv, jnp.asarray(valid)


def _packed(t: int) -> tuple[jax.Array, jax.Array]:
    """Three packed sequences then padding (its own id), one padding token inside the second."""
    ids = np.full((2, t), 9)
    ids[:, :60], ids[:, 60:150], ids[:, 150:t - 20] = 1, 2, 3
    ids[1, :30] = 4  # row 1 packs one more
    valid = ids != 9
    valid[:, 70] = False
    return jnp.asarray(valid), jnp.asarray(ids)


def _wrappers(mask: CausalPadding):
    """The backends of a causal call: the einsum form, splash, the cuDNN wrapper."""
    return {
        "xla": lambda q, k, v: attention.self_attention(q, k, v, mask, impl="xla"),
        "splash": lambda q, k, v: attention.self_attention(q, k, v, mask, impl="splash"),
        "cudnn": lambda q, k, v: cudnn.causal(q, k, v, mask, implementation="xla"),
    }


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["splash", "cudnn"])
@pytest.mark.parametrize("case", ["gqa", "mha", "segments"])
def test_causal_backends_equal_the_einsum_form(backend, case):
    """Left and right padding, GQA (4 heads over 2 kv heads) and MHA, packed sequences; 200
    tokens, not a multiple of the kernel's block."""
    heads, kv_heads = (4, 4) if case == "mha" else (4, 2)
    qkv, valid = _causal_case(200, heads, kv_heads)
    mask = CausalPadding(*_packed(200)) if case == "segments" else CausalPadding(valid)
    fns = _wrappers(mask)
    _close(_values_and_grads(fns[backend], qkv), _values_and_grads(fns["xla"], qkv))


@pytest.mark.slow
def test_prefill_reads_the_first_key_slots():
    """A fresh cache's prefill (keys: 150 cache slots for 131 queries), and one kv head."""
    qkv, valid = _causal_case(131, 4, 1, key_slots=150)
    fns = _wrappers(CausalPadding(valid))
    want = _values_and_grads(fns["xla"], qkv)
    _close(_values_and_grads(fns["splash"], qkv), want)
    _close(_values_and_grads(fns["cudnn"], qkv), want)


def _prefix_case(prefix: int, branches: int, length: int, heads: int = 4, kv_heads: int = 2):
    """A prefix and its branches, padding anywhere: row 0's prefix left-padded with a gap,
    a branch ending early, one starting late; row 1's prefix all padding (its prefix queries
    see no key), one branch all padding, one with a gap."""
    rng = np.random.default_rng(prefix + length)
    prefix_valid = np.ones((2, prefix), bool)
    prefix_valid[0, :prefix // 5] = False
    prefix_valid[0, prefix // 2:prefix // 2 + 3] = False
    prefix_valid[1] = False
    branch_valid = np.ones((2, branches, length), bool)
    branch_valid[0, 0, length // 2:] = False
    branch_valid[0, 1, :4] = False
    branch_valid[1, -1] = False
    branch_valid[1, 0, 5:9] = False
    arrays = (_normal(rng, 2, prefix, heads, 32), _normal(rng, 2, kv_heads, prefix, 32),
              _normal(rng, 2, kv_heads, prefix, 32),
              _normal(rng, 2, branches, length, heads, 32),
              _normal(rng, 2, branches, kv_heads, length, 32),
              _normal(rng, 2, branches, kv_heads, length, 32))
    return arrays, jnp.asarray(prefix_valid), jnp.asarray(branch_valid)


def _shared(impl, prefix_valid, branch_valid):
    def fn(q_p, k_p, v_p, q_b, k_b, v_b):
        return attention.shared_prefix_attention(q_p, k_p, v_p, prefix_valid, q_b, k_b, v_b,
                                                 branch_valid, impl=impl)
    return fn


@pytest.mark.slow
def test_shared_prefix_splash_equals_the_einsum_forms():
    """70 prefix tokens under 3 branches of 45: 205 positions, blocks straddling branches."""
    arrays, prefix_valid, branch_valid = _prefix_case(70, 3, 45)
    _close(_values_and_grads(_shared("splash", prefix_valid, branch_valid), arrays),
           _values_and_grads(_shared("xla", prefix_valid, branch_valid), arrays))


def test_shared_prefix_mask_sees_the_prefix_and_its_own_branch():
    """The static mask against the branches' rule written out token by token."""
    prefix, length, total = 5, 3, 16  # two branches, then 5 positions of block padding
    got = splash.SharedPrefixMask(total, prefix, length)[0:total, 0:total]
    branch = [None] * prefix + [0] * length + [1] * length + [2] * length + [3] * 2
    want = np.array([[k <= q and (k < prefix or branch[k] == branch[q]) for k in range(total)]
                     for q in range(total)])
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(splash.SharedPrefixMask(total, prefix, length)[8:11, 2:9],
                                  want[8:11, 2:9])


@pytest.mark.parametrize("length, block", [(1, 128), (200, 256), (640, 128), (1536, 512),
                                           (1100, 128), (3000, 512)])
def test_block_size_adds_no_padding_beyond_the_lanes(length, block):
    assert splash.block_size(length) == block


@pytest.mark.slow
@pytest.mark.parametrize("heads, kv_heads", [(8, 4), (4, 2)])
def test_splash_under_shard_map_equals_the_einsum_form(heads, kv_heads):
    """On a data=2 x tensor=4 mesh: 8 heads over 4 kv heads split four ways; 4 over 2 do not
    divide the tensor axis and stay whole on every device."""
    mesh = shd.make_mesh({"data": 2, "fsdp": 1, "tensor": 4})
    qkv, valid = _causal_case(136, heads, kv_heads)
    mask = CausalPadding(valid)
    qkv = [jax.device_put(x, shd.batch_sharding(mesh, x.ndim)) for x in qkv]
    with shd.activation_layout(mesh):
        got = _values_and_grads(_wrappers(mask)["splash"], qkv)
    _close(got, _values_and_grads(_wrappers(mask)["xla"], qkv))


def _tpu_mesh(shape: dict[str, int]):
    from jaxrubric.plan.topology import tpu_devices
    return shd.make_mesh(shape, devices=tpu_devices("v5e:2x2"))


def test_auto_resolves_by_the_platform_compiled_for():
    assert attention.resolve_impl("auto") == "xla"  # this CPU host, no layout
    with shd.activation_layout(shd.make_mesh({"data": 2, "fsdp": 4})):
        assert attention.resolve_impl("auto") == "xla"
    with shd.activation_layout(_tpu_mesh({"data": 4})):
        assert attention.resolve_impl("auto") == "splash"
        assert attention.resolve_impl("xla") == "xla"


def test_splash_compiles_for_a_tpu_slice():
    """Forward and backward of a causal and a shared-prefix call in bfloat16, lowered under the
    layout of a v5e:2x2 mesh (data=2 x tensor=2) and compiled by the TPU compiler: three splash
    kernels (forward, dq, dkv) in each, which the plan's HLO walk counts over the tiles the
    causal mask leaves (per device: one row, 2 of the 4 heads, 640 of 600 positions in
    128-blocks, 15 of the 25 tiles). At the default matmul
    precision, as the TPU compiles in `test_plan` (Mosaic refuses this session's float32
    precision for bfloat16 operands)."""
    mesh = _tpu_mesh({"data": 2, "tensor": 2})
    qkv, valid = _causal_case(600, 4, 2)
    arrays, prefix_valid, branch_valid = _prefix_case(70, 3, 45)

    def grads(fn, args):
        loss = lambda *a: sum(jnp.sum(o) for o in jax.tree.leaves(fn(*a)))  # noqa: E731
        specs = [jax.ShapeDtypeStruct(x.shape, jnp.bfloat16,
                                      sharding=shd.batch_sharding(mesh, x.ndim)) for x in args]
        with shd.activation_layout(mesh), jax.default_matmul_precision("default"):
            return jax.jit(jax.grad(loss, argnums=tuple(range(len(args))))).lower(
                *specs).compile().as_text()

    causal = grads(lambda q, k, v: attention.self_attention(
        q, k, v, CausalPadding(valid), impl="auto"), qkv)
    shared = grads(_shared("auto", prefix_valid, branch_valid), arrays)
    for text in (causal, shared):
        for kernel in ("splash_mha_fwd", "splash_mha_dq", "splash_mha_dkv"):
            assert kernel in text
    computations, _ = hlo_cost.parse_module(causal)
    instructions = {i.name: i for body in computations.values() for i in body}
    types = {name: i.shape for name, i in instructions.items()}
    kernels = [i for i in instructions.values()
               if i.opcode == "custom-call" and "splash" in i.name]
    shares = [hlo_cost.splash_share(i, instructions) for i in kernels]
    assert shares == [15 / 25] * 3
    assert splash.tile_share(mask_lib.CausalMask((640, 640)), 128) == 15 / 25
    counted = sum(hlo_cost._flops(i, types, s) for i, s in zip(kernels, shares))
    assert counted == pytest.approx(15 / 25 * 2 * (2 + 3 + 4) * 2 * 640 ** 2 * 32)


def test_cudnn_needs_a_gpu():
    qkv, valid = _causal_case(8, 2, 2)
    with pytest.raises(ValueError, match="attention_impl 'cudnn' needs an NVIDIA GPU"):
        attention.self_attention(*qkv, CausalPadding(valid), impl="cudnn")


def test_a_misspelt_attention_impl_is_refused_by_name():
    with pytest.raises(ConfigError, match=r"attention_impl 'splsh' .*did you mean 'splash'"):
        jaxrubric.tiny_config("qwen3", attention_impl="splsh")
    with pytest.raises(ConfigFileError, match=r"config.policy.attention_impl 'splsh' is not one "
                                              r"of .*did you mean 'splash'"):
        load_config(CONFIG, ["policy.attention_impl=splsh"])


# ----------------------------------------------------------------------------- in the model
def _model_pair(model_type: str, **overrides):
    """The same weights behind the einsum form and splash."""
    cfg = jaxrubric.tiny_config(model_type, **overrides)
    return tuple(jaxrubric.init_model(cfg.replace(attention_impl=impl), seed=4)
                 for impl in ("xla", "splash"))


def _ids(shape, seed=0) -> jax.Array:
    return jnp.asarray(np.random.default_rng(seed).integers(3, 257, shape), jnp.int32)


def _kernel_calls(fn, *args) -> int:
    """How many Pallas kernels `fn(*args)` traces to."""
    return str(jax.make_jaxpr(fn)(*args)).count("pallas_call")


def _logits_and_grads(model, forward):
    """`forward(model)`'s outputs and the parameter gradients of a random projection of them
    (checking that the splash model runs the kernel and the einsum one does not)."""
    graph, params = nnx.split(model)
    run = lambda p: forward(nnx.merge(graph, p))  # noqa: E731
    assert bool(_kernel_calls(run, params)) == (model.config.attention_impl == "splash")
    out = jax.jit(run)(params)
    weights = jax.tree.map(lambda x: _normal(np.random.default_rng(5), *x.shape), out)

    def loss(p):
        return sum(jnp.sum(o * w) for o, w in zip(jax.tree.leaves(run(p)),
                                                  jax.tree.leaves(weights)))
    return out, jax.jit(jax.grad(loss))(params)


@pytest.mark.slow
@pytest.mark.parametrize("model_type, kind", [("qwen3", "padding"), ("llama", "padding"),
                                              ("qwen3", "segments")])
def test_model_with_splash_equals_the_einsum_form(model_type, kind):
    """Logits at every position and parameter gradients: rows left- and right-padded, or
    packed sequences with padding."""
    xla, splash_model = _model_pair(model_type)
    ids = _ids((2, 150))
    if kind == "padding":
        valid = np.ones((2, 150), bool)
        valid[0, :40], valid[1, 110:] = False, False
        kwargs = {"attention_mask": jnp.asarray(valid)}
    else:
        valid, segments = _packed(150 + 20)
        kwargs = {"attention_mask": valid[:, :150], "segment_ids": segments[:, :150]}
    forward = lambda model: model(ids, **kwargs)  # noqa: E731
    _close(_logits_and_grads(splash_model, forward), _logits_and_grads(xla, forward))


@pytest.mark.slow
def test_prefill_with_splash_then_decode_steps_equal_the_einsum_form():
    """A left-padded prompt prefilled into a fresh cache (splash), then two decoding steps of
    two samples each (the einsum form over the prompts' and the samples' caches): the same
    logits and caches."""
    from jaxrubric.models.transformer import SampleCache
    from jaxrubric.sampling import prefill

    ids = _ids((2, 12), 1)
    valid = jnp.asarray(np.arange(12)[None] >= np.array([[3], [0]]))
    samples = 2
    positions = jnp.repeat(jnp.sum(valid, axis=1), samples)[:, None]
    new = jnp.repeat(ids, samples, axis=0)

    def run(graph, params, steps=2):
        model = nnx.merge(graph, params)
        prompts, logits = prefill(model, ids, valid)
        cache, out = SampleCache.empty(prompts, samples, 4), [jnp.repeat(logits, samples, 0)]
        for t in range(steps):
            hidden, cache = model.decode_step(new[:, t:t + 1], positions + t, prompts, cache)
            out.append(model.logits(hidden)[:, 0])
        return jnp.stack(out, 1), (prompts, cache)

    def step(graph, params, caches):
        return nnx.merge(graph, params).decode_step(new[:, :1], positions, *caches)

    xla, splash_model = (nnx.split(m) for m in _model_pair("qwen3"))
    # The prefill runs the kernel; a step, its caches traced, stays on the einsum form.
    assert _kernel_calls(functools.partial(run, splash_model[0], steps=0), splash_model[1])
    caches = jax.eval_shape(functools.partial(run, *splash_model))[1]
    assert not _kernel_calls(functools.partial(step, splash_model[0]), splash_model[1], caches)
    run = jax.jit(run, static_argnums=0)
    _close(run(*splash_model), run(*xla))


@pytest.mark.slow
@pytest.mark.parametrize("model_type", ["qwen3", "llama"])
def test_shared_prefix_hidden_with_splash_equals_the_einsum_form(model_type):
    """Left-padded prompts under branches with padding anywhere (a verifier's item slots):
    hidden states of prefix and branches, and parameter gradients."""
    xla, splash_model = _model_pair(model_type)
    (_, _, _, q_b, *_), prefix_valid, branch_valid = _prefix_case(20, 3, 9)
    prefix, branches = _ids((2, 20), 2), _ids(q_b.shape[:3], 3)
    prefix_valid = prefix_valid.at[1, 5:].set(True)  # a prefix with real tokens in row 1 too

    def forward(model):
        return model.shared_prefix_hidden(prefix, prefix_valid, branches,
                                          branch_mask=branch_valid)
    _close(_logits_and_grads(splash_model, forward), _logits_and_grads(xla, forward))


@pytest.mark.slow
def test_model_with_splash_on_the_mesh_equals_the_einsum_form():
    """The decoder's forward traced under the layout of a data=2 x fsdp=2 x tensor=2 mesh,
    the weights sharded by the rules: splash under shard_map gives the einsum form's logits."""
    mesh = shd.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    ids = jax.device_put(_ids((4, 40), 6), shd.batch_sharding(mesh, 2))
    valid = jax.device_put(jnp.asarray(np.arange(40)[None] >= np.array([[0], [5], [9], [30]])),
                           shd.batch_sharding(mesh, 2))
    outs = []
    for model in _model_pair("qwen3"):
        graph, params = nnx.split(shd.shard_model(model, mesh))
        forward = shd.traced_in(lambda p: nnx.merge(graph, p)(ids, attention_mask=valid), mesh)
        outs.append(jax.jit(forward)(params))
    assert "shard_map" in str(jax.make_jaxpr(forward)(params))  # the splash model's
    _close(outs[1], outs[0])


def test_tile_share_counts_the_tiles_a_mask_touches():
    """`splash.tile_share` against a brute-force count of the blocks with any position to
    attend, for the masks the round uses."""
    masks_ = [mask_lib.CausalMask((768, 768)), splash.SharedPrefixMask(768, 200, 70),
              splash.SharedPrefixMask(1024, 300, 30)]
    for mask in masks_:
        dense = np.asarray(mask[0:mask.shape[0], 0:mask.shape[1]])
        for block in (128, 256):
            n = dense.shape[0] // block
            tiles = dense.reshape(n, block, n, block).any(axis=(1, 3))
            assert splash.tile_share(mask, block) == tiles.sum() / n ** 2
