"""Micro-batched rollouts and updates give what the whole batch gives: the row split, sampling,
verification, a whole round (with chunked attention too), and the config checks."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from tokenizer_fixtures import byte_level_bpe

import jaxrubric
from jaxrubric import coevolve, microbatch, sampling
from jaxrubric import sharding as shd
from jaxrubric.config import ConfigFileError, load_config
from jaxrubric.rubric import verifier as ver

TINY = "configs/tiny_dynamic_rubric.py"


def test_split_is_strided_and_merge_inverts_it():
    """Micro-batch j holds rows j, j + n, ...: each device's contiguous block of rows keeps
    its share of every micro-batch."""
    x = jnp.arange(12).reshape(6, 2)
    parts = microbatch.split({"x": x}, 3)["x"]
    assert parts.shape == (3, 2, 2)
    np.testing.assert_array_equal(parts[1], x[1::3])
    np.testing.assert_array_equal(microbatch.merge(parts), x)
    with pytest.raises(ValueError, match="4 micro-batches do not split the 6 rows"):
        microbatch.split(x, 4)


@pytest.fixture(scope="module")
def model():
    return jaxrubric.init_model(jaxrubric.tiny_config("qwen3"), seed=5)


def test_micro_batched_sampling_draws_the_same_samples(model):
    rng = np.random.default_rng(0)
    lengths = jnp.asarray([6, 3, 5, 2])
    mask = jnp.arange(6)[None] >= 6 - lengths[:, None]
    tokens = jnp.where(mask, jnp.asarray(rng.integers(3, 257, (4, 6))), 2)

    @nnx.jit(static_argnums=1)
    def draw(model, micro_batches):
        return sampling.sample(model, tokens, mask, lengths, jax.random.key(3), num_samples=2,
                               max_new_tokens=6, temperature=1.0, top_p=0.95,
                               stop_token_ids=(1, 40, 41, 42), micro_batches=micro_batches)

    results = {n: draw(model, n) for n in (1, 2, 4)}
    want = results[1]
    assert len(set(np.asarray(want.lengths).ravel().tolist())) > 1  # some rows stop early
    for n in (2, 4):
        got = results[n]
        for field in ("tokens", "lengths", "finished"):
            np.testing.assert_array_equal(getattr(got, field), getattr(want, field))
        for field in ("logprobs", "sampling_logprobs"):
            np.testing.assert_allclose(getattr(got, field), getattr(want, field), atol=1e-5)


def test_micro_batched_verification_gives_the_same_verdicts(model):
    rng = np.random.RandomState(1)
    prefix = jnp.asarray(rng.randint(3, 257, (4, 2, 9)))
    prefix_lengths = jnp.asarray(rng.randint(3, 10, (4, 2)))
    items = jnp.asarray(rng.randint(3, 257, (4, 2, 3, 5)))
    item_lengths = jnp.asarray(rng.randint(1, 6, (4, 2, 3)))
    valid = jnp.asarray(rng.uniform(size=(4, 2, 3)) < 0.8)
    readout = ver.VerifierReadout((7, 8), (9,), (10,))

    @nnx.jit(static_argnums=1)
    def judge(model, micro_batches):
        return ver.verify(model, readout, prefix, prefix_lengths, items, item_lengths, valid,
                          pad_id=2, micro_batches=micro_batches)

    want = judge(model, 1)
    got = judge(model, 2)
    np.testing.assert_allclose(got.p_yes, want.p_yes, atol=1e-6)
    np.testing.assert_array_equal(got.verdicts, want.verdicts)


def _round(config: coevolve.RoundConfig, attention_chunk: int):
    """One tiny DynamicRubric round on a 2-way data mesh: the new state and the outputs."""
    tok = byte_level_bpe()
    mesh = shd.make_mesh({"data": 2}, devices=jax.devices()[:2])
    cfg = jaxrubric.tiny_config("qwen3", vocab_size=len(tok), eos_token_ids=(tok.eos_token_id,),
                                pad_token_id=tok.pad_token_id, attention_chunk=attention_chunk)
    policy, generator, verifier = (shd.shard_model(jaxrubric.init_model(cfg, seed=s), mesh)
                                   for s in (1, 2, 3))
    setup = coevolve.build_setup(config, tok, policy, generator, verifier, max_items=3,
                                 max_item_tokens=6, policy_optimizer=optax.sgd(0.5),
                                 generator_optimizer=optax.sgd(0.5))
    state = coevolve.init_state(setup, policy, generator)
    frozen = {"verifier": nnx.state(verifier, nnx.Param),
              **{f"{role}_ref": jax.tree.map(lambda p: p * 1.01, state[role])
                 for role in ("policy", "generator")}}
    batch = coevolve.encode_batch(tok, ["Sort the digits 3 1 2.", "Reverse the word cat."],
                                  [["1 2 3", "1 3 2", "3 2 1"], ["tac", "act"]],
                                  prompt_tokens=16, policy_tokens=32, anchor_tokens=8,
                                  num_anchors=3)
    batch = {k: jax.device_put(v, shd.batch_sharding(mesh, v.ndim)) for k, v in batch.items()}
    new_state, out = coevolve.make_round_step(setup, frozen)(state, batch, jax.random.key(0))
    return jax.device_get((new_state, out))


@pytest.mark.slow
def test_micro_batched_chunked_round_equals_the_whole_batch():
    """Rollouts and updates over 2 micro-batches, attention over blocks of 8 queries: the same
    responses, rubrics, scores, metrics and updated weights as the round without either."""
    config = coevolve.RoundConfig(num_responses=4, num_rubrics=2, response_tokens=8,
                                  logprob_chunk=8, soft_verdicts=True)
    want_state, want = _round(config, 0)
    got_state, got = _round(dataclasses.replace(config, update_micro_batches=2,
                                                rollout_micro_batches=2), 8)
    for name in ("responses", "response_len", "rubrics", "rubric_len"):
        np.testing.assert_array_equal(got["outputs"][name], want["outputs"][name], name)
    np.testing.assert_allclose(got["outputs"]["scores"], want["outputs"]["scores"], atol=1e-5)
    for name, value in want["scalars"].items():
        np.testing.assert_allclose(got["scalars"][name], value, rtol=1e-4, atol=1e-5,
                                   err_msg=name)
    assert want["scalars"]["policy/grad_norm"] > 0 and want["scalars"]["generator/grad_norm"] > 0
    for role in ("policy", "generator"):
        for a, b in zip(jax.tree.leaves(want_state[role]), jax.tree.leaves(got_state[role])):
            np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-6, err_msg=role)


@pytest.mark.parametrize("override, message", [
    ("round.update_micro_batches=3", "config.round.update_micro_batches=3 must divide the "
                                     "policy update's rows (data.batch_size x "
                                     "round.num_responses), 32"),
    ("round.rollout_micro_batches=3", "config.round.rollout_micro_batches=3 must divide the "
                                      "prompts (data.batch_size), 8"),
    ("round.update_micro_batches=0", "update_micro_batches must be >= 1"),
    ("verifier.attention_chunk=-1", "config.verifier.attention_chunk must be >= 0"),
])
def test_config_checks_name_the_key(override, message):
    with pytest.raises(ConfigFileError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_config(TINY, [override])
