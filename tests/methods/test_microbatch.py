"""Micro-batched rollouts and updates give what the whole batch gives: the row split, sampling,
verification and the config checks. A whole micro-batched round (with chunked attention too)
is checked against the plain round in tests/methods/test_placement.py."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from helpers import tiny_model_config, tiny_tokenizer

import jaxrubric
from jaxrubric import microbatch, sampling
from jaxrubric import sharding as shd
from jaxrubric.config import ConfigFileError, load_config
from jaxrubric.rubric import grammar as gr
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


@pytest.fixture(scope="module")
def grammar_model():
    """A rubric grammar over the tiny BPE vocabulary and a model over it."""
    tok = tiny_tokenizer()
    grammar = gr.build_rubric_grammar(tok, weights=range(1, 4), max_items=2, max_item_tokens=3)
    return grammar, jaxrubric.init_model(tiny_model_config(tok), seed=5)


# Every way a row's distribution is set: the model's own (T = 1, one log-softmax), tempered,
# top-k, top-p, and the rubric grammar; each with its stop tokens (rows stop at different steps).
SAMPLING_CASES = {
    "model distribution": dict(temperature=1.0),
    "tempered top-k": dict(temperature=0.7, top_k=20),
    "top-p": dict(temperature=1.0, top_p=0.95),
    "grammar": dict(temperature=1.0),
}


def _sampling_case(name, model, grammar_model):
    """(model, prompts [8, 6], mask, lengths, `sampling.sample` keywords) of one case."""
    kwargs = dict(SAMPLING_CASES[name], num_samples=2, stop_token_ids=tuple(range(40, 80)))
    if name == "grammar":
        kwargs["grammar"], model = grammar_model
        kwargs["stop_token_ids"] = ()  # as in the round: the grammar ends each rubric
    rng = np.random.default_rng(0)
    lengths = jnp.asarray([6, 3, 5, 2, 4, 6, 1, 3])
    mask = jnp.arange(6)[None] >= 6 - lengths[:, None]
    tokens = jnp.where(mask, jnp.asarray(rng.integers(3, 257, (8, 6))), 2)
    return model, tokens, mask, lengths, kwargs


@pytest.mark.slow
@pytest.mark.parametrize("case", SAMPLING_CASES)
def test_micro_batched_sampling_draws_the_same_samples(case, model, grammar_model):
    """Each row keeps its own key: the same tokens whole, in 2 or 4 micro-batches, and in
    micro-batches on the 8-device mesh with the rows and weights sharded."""
    model, tokens, mask, lengths, kwargs = _sampling_case(case, model, grammar_model)
    max_new = kwargs["grammar"].max_rubric_tokens if case == "grammar" else 6

    @nnx.jit(static_argnums=4)
    def draw(model, tokens, mask, lengths, micro_batches):
        return sampling.sample(model, tokens, mask, lengths, jax.random.key(3),
                               max_new_tokens=max_new, micro_batches=micro_batches, **kwargs)

    results = {n: draw(model, tokens, mask, lengths, n) for n in (1, 2, 4)}
    mesh = shd.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    sharded = shd.shard_model(nnx.clone(model), mesh, shd.SAMPLING_RULES)
    rows = [jax.device_put(x, shd.batch_sharding(mesh, x.ndim)) for x in (tokens, mask, lengths)]
    results["mesh"] = draw(sharded, *rows, 2)
    want = results.pop(1)
    assert len(set(np.asarray(want.lengths).ravel().tolist())) > 1  # some rows stop early
    for n, got in results.items():
        for field in ("tokens", "lengths", "finished"):
            np.testing.assert_array_equal(getattr(got, field), getattr(want, field), err_msg=n)
        for field in ("logprobs", "sampling_logprobs"):
            np.testing.assert_allclose(getattr(got, field), getattr(want, field), atol=1e-5,
                                       err_msg=f"{n} {field}")


@pytest.mark.slow
def test_rows_given_one_noise_stream_sample_alike(model):
    """`noise_rows`: rows that share a stream and a prompt sample the same tokens (whole and in
    micro-batches); each row's own index as its stream is the default."""
    model, tokens, mask, lengths, kwargs = _sampling_case("model distribution", model, None)
    tokens, mask, lengths = (jnp.concatenate([x[:4], x[:4]]) for x in (tokens, mask, lengths))

    @nnx.jit(static_argnums=(4, 5))
    def draw(model, tokens, mask, lengths, micro_batches, shared):
        noise_rows = jnp.arange(16) % 8 if shared else None
        return sampling.sample(model, tokens, mask, lengths, jax.random.key(3),
                               max_new_tokens=6, micro_batches=micro_batches,
                               noise_rows=noise_rows, **kwargs)

    own = draw(model, tokens, mask, lengths, 1, False)
    shared = {n: draw(model, tokens, mask, lengths, n, True) for n in (1, 2)}
    for n, got in shared.items():
        # rows 4-7 repeat rows 0-3's prompts: with a shared stream their samples repeat too
        np.testing.assert_array_equal(got.tokens[4:], got.tokens[:4], err_msg=n)
        np.testing.assert_array_equal(got.tokens[:4], own.tokens[:4], err_msg=n)  # streams 0-7
    assert not np.array_equal(own.tokens[4:], own.tokens[:4])  # own streams: other samples


def test_a_micro_batch_draws_only_its_own_rows_noise(model):
    """Every decode step of a micro-batch draws one uniform for each of its `rows / n` rows,
    never the whole batch's (nor one per vocabulary entry)."""
    tokens = jnp.full((8, 6), 5)
    graphdef, state = nnx.split(model)
    for n in (1, 4):
        jaxpr = jax.make_jaxpr(lambda state, n=n: sampling.sample(
            nnx.merge(graphdef, state), tokens, tokens > 0, jnp.full((8,), 6),
            jax.random.key(0), num_samples=2, max_new_tokens=4, micro_batches=n))(state)
        shapes = set(re.findall(r":u32\[([\d,]*)\] = random_bits", str(jaxpr)))
        assert shapes == {f"{16 // n}"}, (n, shapes)


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


TINY_GENRUBRIC = "configs/tiny_genrubric.py"


# The tiny configs: 8 prompts, K = 4 responses, G = 2 rubrics: the updates share each prompt
# under its samples (the default), so update micro-batches split the 8 prompts; unshared, the
# generator's update has 16 rows, the policy's 32 (DynamicRubric; 24 with K = 3).
@pytest.mark.parametrize("config, overrides, message", [
    (TINY, ["round.update_micro_batches=3"],
     "config.round.update_micro_batches=3 must divide the generator update's prompts "
     "(share_prefix), 8"),
    (TINY, ["round.update_micro_batches=16"],
     "config.round.update_micro_batches=16 must divide the generator update's prompts "
     "(share_prefix), 8"),
    (TINY, ["round.share_prefix=false", "round.update_micro_batches=3"],
     "config.round.update_micro_batches=3 must divide the generator update's rows, 16"),
    (TINY, ["round.share_prefix=false", "round.num_responses=3",
            "round.update_micro_batches=16"],
     "config.round.update_micro_batches=16 must divide the policy update's rows, 24"),
    (TINY, ["round.rollout_micro_batches=3"],
     "config.round.rollout_micro_batches=3 must divide the policy's rollout prompts, 8"),
    (TINY, ["data.eval=assets/tiny_anchors.jsonl", "data.eval_batch_size=6",
            "round.rollout_micro_batches=4"],
     "config.round.rollout_micro_batches=4 must divide the held-out prompts "
     "(data.eval_batch_size), 6"),
    (TINY_GENRUBRIC, ["round.rollout_micro_batches=3"],
     "config.round.rollout_micro_batches=3 must divide the generator's rollout prompts, 8"),
    (TINY, ["round.update_micro_batches=0"], "update_micro_batches must be >= 1"),
    (TINY, ["verifier.attention_chunk=-1"], "config.verifier.attention_chunk must be >= 0"),
])
def test_config_checks_name_the_key(config, overrides, message):
    with pytest.raises(ConfigFileError, match=re.escape(message)):
        load_config(config, overrides)
