"""Activations placed like parameters: under an activation layout every chip computes its own
rows only (per-device FLOPs x chips = the one-device program's), and a round's decoding reads
weights laid out for it (no collective of weights inside a decode loop), with the same samples.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxrubric
from jaxrubric import sampling
from jaxrubric import sharding as shd
from jaxrubric.plan import hlo_cost

CHIPS = 8


def _model(mesh, **overrides):
    cfg = jaxrubric.tiny_config("qwen3", **overrides)
    return nnx.split(shd.shard_model(jaxrubric.init_model(cfg, seed=0), mesh))


def _flops(fn, *args) -> float:
    return jax.jit(fn).lower(*args).compile().cost_analysis()["flops"]


def _rows(mesh, x):
    return jax.device_put(x, shd.batch_sharding(mesh, x.ndim))


@pytest.mark.slow
@pytest.mark.parametrize("path", ["plain", "shared_prefix"])
def test_each_chip_computes_only_its_rows(path):
    """Forward and backward of a tiny model on an fsdp=8 mesh: without the layout XLA keeps
    every row on every chip (measured 2.4x the work); with it, the chips' FLOPs add up to the
    one-device program's."""
    mesh = shd.make_mesh({"fsdp": CHIPS})
    graph, state = _model(mesh, intermediate_size=256)
    ids = np.random.RandomState(0).randint(3, 200, (16, 64))
    if path == "plain":
        inputs = (jnp.asarray(ids),)

        def loss(state, tokens):
            return jnp.mean(nnx.merge(graph, state)(tokens))
    else:
        branches = np.random.RandomState(1).randint(3, 200, (16, 4, 16))
        inputs = (jnp.asarray(ids), jnp.asarray(branches))

        def loss(state, prefix, branches):
            model = nnx.merge(graph, state)
            _, hidden = model.shared_prefix_hidden(prefix, jnp.ones(prefix.shape, bool),
                                                   branches)
            return jnp.mean(model.logits(hidden))

    grad = jax.grad(loss)
    one = _flops(grad, *jax.device_put((state, *inputs), jax.devices()[0]))
    placed = (state, *(_rows(mesh, x) for x in inputs))
    unplaced = _flops(grad, *placed) * CHIPS / one
    laid_out = _flops(shd.traced_in(grad, mesh), *placed) * CHIPS / one
    assert laid_out < 1.05, laid_out
    assert unplaced > 1.5, unplaced  # what the layout removes (a check that it can fail)


def largest_loop_state(text: str) -> float:
    """Bytes per device of the largest `while` loop state in compiled HLO: what a decode loop
    carries, weights included (loop-invariant operands travel in the state)."""
    computations, _ = hlo_cost.parse_module(text)
    return max(hlo_cost.nbytes(ins.shape) for body in computations.values() for ins in body
               if ins.opcode == "while")


@pytest.mark.parametrize("kv_heads", [8, 2])
def test_decoding_reads_weights_laid_out_for_it(kv_heads):
    """A round's `sampling.sample` on an fsdp=8 mesh samples the tokens one device samples.
    Its decode loop reads weights laid out for decoding: tensor-parallel over the 8 chips
    where the kv heads divide among them (the loop carries a chip's share of the weights, not
    the whole weights that FSDP-sharded weights are gathered into), else whole weights per
    chip (`sharding.decoding_rules`)."""
    mesh = shd.make_mesh({"fsdp": CHIPS})
    graph, state = _model(mesh, num_heads=8, num_kv_heads=kv_heads, head_dim=8,
                          vocab_multiple=CHIPS)
    rules = shd.decoding_rules(mesh, kv_heads)
    assert rules is (shd.TENSOR_PARALLEL_RULES if kv_heads == 8 else shd.SAMPLING_RULES)
    prompts = np.random.RandomState(0).randint(3, 200, (8, 16))
    inputs = (jnp.asarray(prompts), jnp.ones((8, 16), bool), jnp.full((8,), 16))

    def sample(state, tokens, mask, lengths, rng):
        return sampling.sample(nnx.merge(graph, state), tokens, mask, lengths, rng,
                               num_samples=2, max_new_tokens=8)

    args = (state, *(_rows(mesh, x) for x in inputs), jax.random.key(0))
    program = jax.jit(shd.traced_in(sample, mesh))
    got = program(*args)
    want = jax.jit(sample)(*jax.device_put(args, jax.devices()[0]))
    np.testing.assert_array_equal(np.asarray(got.tokens), np.asarray(want.tokens))
    np.testing.assert_allclose(np.asarray(got.logprobs), np.asarray(want.logprobs), atol=1e-5)
    if kv_heads == 8:
        whole = sum(x.nbytes for x in jax.tree.leaves(state))  # float32, as tiny_config's
        carried = largest_loop_state(program.lower(*args).compile().as_text())
        assert carried < whole / 2, (carried, whole)  # measured: 0.24 of it; untouched, 0.98
