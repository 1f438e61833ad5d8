"""Shared-prefix updates (`round.share_prefix`): a GRPO group's prompt encoded once, its samples
as branches attending to it, gives the log-probs, gradients and updates of the unshared rows,
for every loss aggregation, with micro-batches, LoRA and a KL reference, on one device and on
the 8-device mesh. Below them, the decoder's shared-prefix forward itself: branches with padding
anywhere (the verifier's item slots) read as their unpadded rows, and branch queries in blocks
(`attention_chunk`) give the hidden states and gradients of the single einsum."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import jaxrubric
from jaxrubric import sharding as shd
from jaxrubric.methods import update
from jaxrubric.methods.data import RoleState, base_weights, trainable
from jaxrubric.methods.round_config import RoleConfig, RoundConfig
from jaxrubric.methods.setup import RoleSpec
from jaxrubric.models.config import LoraConfig
from jaxrubric.rl import grpo

pytestmark = pytest.mark.slow  # every test compiles shared and unshared updates to compare

B, S, P, N = 4, 3, 6, 5


@functools.cache
def _case(lora: bool):
    """A tiny decoder; B left-padded prompts (different pads), S completions of each with
    ragged lengths, old log-probs and token-level advantages."""
    adapters = LoraConfig(rank=4, targets=("q_proj", "v_proj", "down_proj")) if lora else None
    model = jaxrubric.init_model(jaxrubric.tiny_config("qwen3", num_layers=1, lora=adapters),
                                 seed=5)
    for i, (name, p) in enumerate(sorted(model.layers.items())):
        if name.endswith("_lora_b"):
            p[...] = 0.1 * jax.random.normal(jax.random.key(i), p.shape)
    rng = np.random.default_rng(3)
    prompt = jnp.asarray(rng.integers(3, 257, (B, P)), jnp.int32)
    prompt_mask = jnp.asarray(np.arange(P)[None] >= np.array([[0], [2], [1], [4]]))
    completion = jnp.asarray(rng.integers(3, 257, (B, S, N)), jnp.int32)
    lengths = rng.integers(1, N + 1, (B, S))
    lengths[1, 2] = 0  # a sample with no valid token
    mask = jnp.asarray(np.arange(N) < lengths[..., None])
    sampler = update.shared_completion_logprobs(model, prompt, prompt_mask, completion, 2)
    sampler = sampler + jnp.asarray(rng.normal(0, 0.3, (B, S, N)), jnp.float32)
    advantages = jnp.asarray(rng.normal(size=(B, S, N)), jnp.float32)
    return model, (prompt, prompt_mask, completion, mask, sampler, advantages)


def _rows(x: jax.Array) -> jax.Array:
    return x.reshape(B * S, *x.shape[2:])


def test_shared_log_probs_equal_each_row_on_its_own():
    model, (prompt, prompt_mask, completion, *_) = _case(False)
    shared, entropy = update.shared_completion_logprobs(model, prompt, prompt_mask, completion, 2,
                                                      return_entropy=True)
    rows, row_entropy = update.completion_logprobs(
        model, jnp.repeat(prompt, S, 0), jnp.repeat(prompt_mask, S, 0), _rows(completion), 2,
        return_entropy=True)
    np.testing.assert_allclose(_rows(shared), rows, atol=1e-5)
    np.testing.assert_allclose(_rows(entropy), row_entropy, atol=1e-5)


def _update(lora: bool, aggregation: str, micro_batches: int, shared: bool, mesh=None,
            kl: str = "sampled"):
    """Two SGD steps of the case's rows, shared or not; with `mesh`, weights and prompts placed
    on it by the rules table; `kl`: `RoleSpec.kl`."""
    model, (prompt, prompt_mask, completion, mask, sampler, advantages) = _case(lora)
    graph = nnx.graphdef(model)
    params, base = nnx.state(model, trainable(model)), base_weights(model)
    if mesh is not None:
        params = jax.device_put(params, shd.state_shardings(params, mesh))
        prompt, prompt_mask, completion, mask, sampler, advantages = (
            jax.device_put(x, shd.batch_sharding(mesh, x.ndim))
            for x in (prompt, prompt_mask, completion, mask, sampler, advantages))
    cfg = RoundConfig(aggregation=aggregation, num_updates=2, logprob_chunk=2,
                           update_micro_batches=micro_batches)
    opt = optax.sgd(0.5)
    spec = RoleSpec(graph, opt, RoleConfig(beta=0.1, kl=kl), compiled_out=False)
    ref = None if lora else jax.tree.map(lambda p: p * 1.01, params)
    if shared:
        inputs = (prompt, prompt_mask, completion, mask, sampler, advantages)
    else:
        inputs = (jnp.repeat(prompt, S, 0), jnp.repeat(prompt_mask, S, 0), _rows(completion),
                  _rows(mask), _rows(sampler), _rows(advantages))
    step = jax.jit(lambda p: update.grpo_role_update(
        cfg, spec, RoleState(p, opt.init(p)), base, ref, *inputs, jax.random.key(0)))
    return step(params)


@pytest.mark.parametrize("aggregation, lora, kl", [
    *((name, False, "sampled") for name in sorted(grpo.LOSS_AGGREGATIONS)),
    ("token-mean", True, "sampled"), ("token-mean", False, "forward"),
    ("seq-mean-token-mean", True, "forward")])
def test_shared_update_equals_the_unshared_update(aggregation, lora, kl):
    """Two SGD steps (the second one clipped), KL to the reference (LoRA: the base), each
    aggregation, and the forward KL over the vocabulary: the whole batch of rows against the
    shared update in 2 micro-batches of prompts (micro-batching alone is held exact by
    tests/rl/test_grpo.py)."""
    want_state, want = _update(lora, aggregation, 1, shared=False, kl=kl)
    got_state, got = _update(lora, aggregation, 2, shared=True, kl=kl)
    for a, b in zip(jax.tree.leaves(want_state), jax.tree.leaves(got_state), strict=True):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5, atol=1e-6)
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-6, err_msg=name)
    assert float(want["kl"]) > 0 and float(want["clip_frac"]) > 0


@pytest.mark.parametrize("kl", ["sampled", "forward"])
def test_the_shared_update_on_the_8_device_mesh_equals_the_unshared_update(kl):
    """Weights sharded fsdp 4 x tensor 2, prompts split over the batch axes (the GRPO group's
    samples stay with their prompt): the same update as the unshared rows on one device."""
    mesh = shd.make_mesh({"fsdp": 4, "tensor": 2})
    want_state, want = _update(False, "token-mean", 1, shared=False, kl=kl)
    got_state, got = _update(False, "token-mean", 1, shared=True, mesh=mesh, kl=kl)
    assert {x.sharding.mesh for x in jax.tree.leaves(got_state.params)} == {mesh}
    for a, b in zip(jax.tree.leaves(want_state), jax.tree.leaves(got_state), strict=True):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["loss"], want["loss"], rtol=1e-5, atol=1e-6)


def _padded_case(**overrides):
    """A tiny decoder; 2 prefixes of 6 slots (2 left pads; 1 right pad) under 3 branches of 7
    slots each, padded before, inside and after their real tokens (one branch all real)."""
    model = jaxrubric.init_model(jaxrubric.tiny_config("qwen3", **overrides), seed=2)
    rng = np.random.default_rng(4)
    prefix = jnp.asarray(rng.integers(3, 257, (2, 6)), jnp.int32)
    prefix_mask = jnp.asarray([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0]], bool)
    branches = jnp.asarray(rng.integers(3, 257, (2, 3, 7)), jnp.int32)
    branch_mask = jnp.asarray([[[1, 1, 0, 0, 1, 1, 1], [1, 0, 0, 0, 0, 1, 1],
                                [1, 1, 1, 1, 1, 1, 1]],
                               [[0, 1, 1, 0, 1, 0, 1], [1, 1, 1, 1, 0, 1, 1],
                                [1, 1, 0, 1, 1, 1, 0]]], bool)
    return model, (prefix, prefix_mask, branches, branch_mask)


def test_padded_branches_equal_their_unpadded_rows():
    model, (prefix, prefix_mask, branches, branch_mask) = _padded_case()
    prefix_h, branch_h = jax.jit(lambda p, pm, br, bm: model.shared_prefix_hidden(
        p, pm, br, branch_mask=bm))(prefix, prefix_mask, branches, branch_mask)
    for b, s in np.ndindex(2, 3):
        real_p, real_b = np.asarray(prefix_mask[b]), np.asarray(branch_mask[b, s])
        row = jnp.concatenate([prefix[b][real_p], branches[b, s][real_b]])[None]
        want, _ = model.hidden_states(row)
        np.testing.assert_allclose(prefix_h[b][real_p], want[0, :real_p.sum()], atol=1e-5)
        np.testing.assert_allclose(branch_h[b, s][real_b], want[0, real_p.sum():], atol=1e-5)


@pytest.mark.parametrize("chunk", [4, 7])
def test_branch_queries_in_blocks_equal_the_single_einsum(chunk):
    """chunk 4: one position of the 3 branches per block; 7: two, the last block overlapping
    the one before (7 positions). Hidden states and parameter gradients, remat full."""
    outs = []
    for attention_chunk in (0, chunk):
        model, inputs = _padded_case(attention_chunk=attention_chunk, remat="full")
        graph, params = nnx.split(model)
        weights = jax.random.normal(jax.random.key(0), (2, 3, 7, model.config.hidden_size))

        def loss(p):
            _, hidden = nnx.merge(graph, p).shared_prefix_hidden(*inputs[:3],
                                                                 branch_mask=inputs[3])
            return jnp.sum(jnp.where(inputs[3][..., None], hidden, 0) * weights), hidden

        outs.append(jax.jit(jax.grad(loss, has_aux=True))(params))
    (want_grads, want), (got_grads, got) = outs
    np.testing.assert_allclose(got, want, atol=1e-5)
    for a, b in zip(jax.tree.leaves(want_grads), jax.tree.leaves(got_grads), strict=True):
        # Sums over every token: gradients reach ~300, so fp32 rounding of the largest entry.
        assert np.abs(np.asarray(b - a)).max() <= 1e-5 * max(np.abs(np.asarray(a)).max(), 1)
