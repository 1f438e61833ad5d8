"""Query-chunked attention (`models.attention`): the same logits and gradients as the dense einsum, less memory."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxrubric
from jaxrubric.models.config import ConfigError
from jaxrubric.models.transformer import KVCache

CHUNK = 4


def _models(model_type="qwen3", **overrides):
    """The same weights twice: dense attention and attention over blocks of `chunk` queries."""
    cfg = jaxrubric.tiny_config(model_type, **overrides)
    return (jaxrubric.init_model(cfg, seed=3),
            jaxrubric.init_model(cfg.replace(attention_chunk=CHUNK), seed=3))


@nnx.jit
def _forward(model, ids, kwargs):
    return model(ids, **kwargs)


@nnx.jit
def _cached(model, ids, cache):
    return model(ids, cache=cache)


def _ids(shape, seed=0):
    return jnp.asarray(np.random.RandomState(seed).randint(3, 257, shape))


def _tree_mask(prefix, branches):
    """A shared prefix then branches that see the prefix and themselves (the verifier's rows)."""
    branch_of = np.concatenate([np.full(prefix, -1)] + [np.full(n, i) for i, n in
                                                         enumerate(branches)])
    idx = np.arange(len(branch_of))
    positions = np.concatenate([np.arange(prefix)] + [prefix + np.arange(n) for n in branches])
    mask = (idx[None, :] <= idx[:, None]) & (
        (branch_of[None, :] == -1) | (branch_of[None, :] == branch_of[:, None]))
    return jnp.asarray(mask[None]), jnp.asarray(positions[None])


def _inputs(kind):
    """Model keyword arguments of each mask kind, 13 tokens (not a multiple of the chunk)."""
    if kind == "causal":
        return _ids((2, 13)), {}
    if kind == "padding":  # left padding in row 0, right padding in row 1
        mask = np.ones((2, 13), bool)
        mask[0, :5] = False
        mask[1, 10:] = False
        return _ids((2, 13), 1), {"attention_mask": jnp.asarray(mask)}
    mask, positions = _tree_mask(5, (3, 1, 4))
    return _ids((1, 13), 2), {"attention_mask": mask, "positions": positions}


@pytest.mark.parametrize("kind", ["causal", "padding", "tree"])
def test_chunked_logits_equal_dense(kind):
    dense, chunked = _models("llama" if kind == "tree" else "qwen3")
    ids, kwargs = _inputs(kind)
    np.testing.assert_allclose(np.asarray(_forward(chunked, ids, kwargs)),
                               np.asarray(_forward(dense, ids, kwargs)), atol=1e-5)


def _param_grads(model, ids, kwargs):
    graph, params = nnx.split(model)
    weights = jax.random.normal(jax.random.key(0), ids.shape + (model.config.padded_vocab_size,))

    def loss(p):
        logits = nnx.merge(graph, p)(ids, **kwargs)
        return jnp.sum(jax.nn.log_softmax(logits) * weights)

    return jax.jit(jax.grad(loss))(params)


@pytest.mark.slow
@pytest.mark.parametrize("kind, remat", [("padding", "full"), ("tree", "none")])
def test_chunked_parameter_gradients_equal_dense(kind, remat):
    dense, chunked = _models("qwen3", remat=remat)
    ids, kwargs = _inputs(kind)
    want, got = _param_grads(dense, ids, kwargs), _param_grads(chunked, ids, kwargs)
    for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_prefill_is_chunked_and_decode_steps_stay_dense():
    """A prompt longer than the chunk fills the cache blockwise; one-token steps after it."""
    dense, chunked = _models("qwen3")
    ids = _ids((2, 12), 4)
    outs = []
    for model in (dense, chunked):
        cache = KVCache.empty(model.config, batch=2, length=14)
        logits, cache = _cached(model, ids[:, :10], cache)
        steps = [logits]
        for t in (10, 11):
            logits, cache = _cached(model, ids[:, t:t + 1], cache)
            steps.append(logits)
        outs.append(np.asarray(jnp.concatenate(steps, axis=1)))
    np.testing.assert_allclose(outs[1], outs[0], atol=1e-5)


@pytest.mark.slow
def test_chunking_cuts_the_compiled_temporaries():
    """XLA's own accounting of a training step's forward + backward on 512 tokens: blocks of
    64 queries hold an eighth of the scores, and no block's probabilities are kept."""
    ids = _ids((2, 512), 5)

    def temp_bytes(chunk):
        cfg = jaxrubric.tiny_config("qwen3", attention_chunk=chunk)
        graph, params = nnx.split(nnx.eval_shape(lambda: jaxrubric.models.transformer.Decoder(
            cfg, rngs=nnx.Rngs(0))))
        loss = lambda p: jnp.mean(nnx.merge(graph, p)(ids))  # noqa: E731
        compiled = jax.jit(jax.grad(loss)).lower(params).compile()
        return compiled.memory_analysis().temp_size_in_bytes

    dense, chunked = temp_bytes(0), temp_bytes(64)
    assert chunked < 0.6 * dense, (chunked, dense)


def test_negative_chunk_is_a_config_error():
    with pytest.raises(ConfigError, match="attention_chunk"):
        jaxrubric.tiny_config("qwen3", attention_chunk=-1)


@pytest.mark.parametrize("steps", [1, 3])
def test_decode_attention_equals_the_dense_form_over_each_samples_prompt_copy(steps):
    """S samples of each prompt reading the prompt's keys once (`decode_attention`) against
    the einsum form over each sample's own copy of its prompt followed by its tokens: padded
    prompts, grouped query heads, slots not yet written, and a step of several tokens."""
    from jaxrubric.models.attention import attention, decode_attention

    b, s, p_len, slots, kv_heads, groups, d = 3, 2, 5, 4, 2, 2, 8
    draw = iter(jax.random.split(jax.random.key(0), 5))
    q = jax.random.normal(next(draw), (b * s, steps, kv_heads * groups, d))
    prefix_k, prefix_v = (jax.random.normal(next(draw), (b, kv_heads, p_len, d))
                          for _ in range(2))
    k, v = (jax.random.normal(next(draw), (b * s, kv_heads, slots, d)) for _ in range(2))
    prefix_valid = jnp.arange(p_len)[None, :] >= jnp.array([[0], [2], [4]])  # left padding
    written = jnp.arange(slots) <= 1

    got = decode_attention(q, prefix_k, prefix_v, prefix_valid, k, v, written)
    copied = lambda x: jnp.repeat(x, s, axis=0)  # noqa: E731
    keys = jnp.concatenate([copied(prefix_k), k], axis=2)
    values = jnp.concatenate([copied(prefix_v), v], axis=2)
    visible = jnp.concatenate([copied(prefix_valid),
                               jnp.broadcast_to(written, (b * s, slots))], axis=1)
    want = attention(q, keys, values, jnp.broadcast_to(visible[:, None, :],
                                                       (b * s, steps, p_len + slots)))
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)
