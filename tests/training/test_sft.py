"""SFT: encoding, the chunked loss against full-logit references, training, sharding."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import jaxrubric
from jaxrubric import sampling, sft
from jaxrubric import sharding as shd

PAD, BOS, EOS = 2, 0, 1
VOCAB = 40


def tiny_model(seed: int = 0) -> jaxrubric.Decoder:
    return jaxrubric.init_model(jaxrubric.tiny_config("qwen3", vocab_size=VOCAB), seed=seed)


def random_batch(seed: int, rows: int = 8) -> sft.SFTBatch:
    """Prompts of 1-5 and targets of 1-8 random tokens (ids >= 3) in rows of 16, weighted."""
    rng = np.random.default_rng(seed)
    prompts = [[BOS, *rng.integers(3, VOCAB, rng.integers(0, 5))] for _ in range(rows)]
    targets = [list(rng.integers(3, VOCAB, rng.integers(1, 9))) for _ in range(rows)]
    return sft.encode_examples(None, prompts, targets, max_len=16, pad_id=PAD,
                               loss_weight=rng.uniform(0.2, 2.0, rows).tolist())


def reference_loss(model: jaxrubric.Decoder, batch: sft.SFTBatch) -> jax.Array:
    """Weighted token-mean NLL from full `[B, L, V]` logits and `jax.nn.log_softmax`."""
    logits = model(jnp.asarray(batch.tokens), attention_mask=jnp.asarray(batch.attention_mask))
    logp = jax.nn.log_softmax(logits[:, :-1], axis=-1)
    target_logp = jnp.take_along_axis(logp, jnp.asarray(batch.tokens)[:, 1:, None], -1)[..., 0]
    weight = jnp.asarray(batch.loss_mask[:, 1:]) * jnp.asarray(batch.loss_weight)[:, None]
    return -jnp.sum(weight * target_logp) / jnp.sum(weight)


def numpy_reference(logits: np.ndarray, batch: sft.SFTBatch) -> tuple[float, float]:
    """(loss, accuracy) in float64, position by position, from full logits."""
    total = nll = correct = 0.0
    for b, t in zip(*np.nonzero(batch.loss_mask)):
        row = np.float64(logits[b, t - 1])
        logz = np.log(np.sum(np.exp(row - row.max()))) + row.max()
        w = batch.loss_weight[b]
        total += w
        nll -= w * (row[batch.tokens[b, t]] - logz)
        correct += w * (np.argmax(row) == batch.tokens[b, t])
    return nll / total, correct / total


# --------------------------------------------------------------------------------------------
# Encoding
# --------------------------------------------------------------------------------------------


def test_encode_examples_layout():
    batch = sft.encode_examples(None, [[0, 5, 6], [0]], [[7, 1], [8, 9, 1]], max_len=6, pad_id=PAD)
    np.testing.assert_array_equal(batch.tokens, [[0, 5, 6, 7, 1, PAD], [0, 8, 9, 1, PAD, PAD]])
    np.testing.assert_array_equal(batch.loss_mask, [[0, 0, 0, 1, 1, 0], [0, 1, 1, 1, 0, 0]])
    np.testing.assert_array_equal(batch.attention_mask, [[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 0, 0]])
    assert batch.tokens.dtype == np.int32 and batch.loss_mask.dtype == bool
    assert batch.loss_weight is None


def test_encode_examples_text_with_a_tokenizer():
    class CharTokenizer:
        def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
            assert not add_special_tokens
            return [ord(c) - 94 for c in text]

    batch = sft.encode_examples(CharTokenizer(), ["ab"], ["cde"], max_len=6, pad_id=PAD,
                                loss_weight=[0.5])
    np.testing.assert_array_equal(batch.tokens, [[3, 4, 5, 6, 7, PAD]])
    np.testing.assert_array_equal(batch.loss_mask, [[0, 0, 1, 1, 1, 0]])
    np.testing.assert_array_equal(batch.loss_weight, [0.5])
    with pytest.raises(TypeError, match="row 0: prompt is a string; pass a tokenizer"):
        sft.encode_examples(None, ["ab"], [[3]], max_len=6, pad_id=PAD)


@pytest.mark.parametrize("prompts, targets, message", [
    ([[0, 3], [0, 3, 4, 5]], [[6], [6, 7, 8]], r"row 1: prompt 4 \+ target 3 = 7 tokens, more "
                                               r"than max_len 6"),
    ([[0, 3], [0]], [[6], []], "row 1: empty target"),
    ([[]], [[6]], "row 0: empty prompt"),
    ([[0]], [[6], [7]], "1 prompts but 2 targets"),
    ([], [], "no examples"),
])
def test_encode_examples_rejects_bad_rows(prompts, targets, message):
    with pytest.raises(ValueError, match=message):
        sft.encode_examples(None, prompts, targets, max_len=6, pad_id=PAD)


def test_place_batch_needs_rows_that_split_over_the_mesh():
    mesh = shd.make_mesh({"fsdp": 8})
    with pytest.raises(ValueError, match="batch of 6 rows does not split 8 ways"):
        sft.place_batch(mesh, random_batch(0, rows=6))
    placed = sft.place_batch(mesh, random_batch(0))
    assert placed.tokens.sharding == shd.batch_sharding(mesh, 2)
    assert placed.loss_weight.sharding == shd.batch_sharding(mesh, 1)


# --------------------------------------------------------------------------------------------
# The loss on one device
# --------------------------------------------------------------------------------------------

GRAPH = nnx.graphdef(tiny_model())


def test_masked_labels_and_padding_carry_no_loss():
    """Padding, and a final target token taken out of the loss mask, can be anything.

    The loss is read from single-device steps with a zero learning rate (parameters kept):
    every call of differing token values must reuse the one compiled program.
    """
    optimizer = optax.sgd(0.0)
    params = nnx.state(tiny_model(), nnx.Param)
    opt_state = optimizer.init(params)
    step = sft.make_sft_step(GRAPH, optimizer, chunk_size=4)

    def loss(batch: sft.SFTBatch) -> float:
        nonlocal params, opt_state
        params, opt_state, metrics = step(params, opt_state, sft.place_batch(None, batch))
        return float(metrics["loss"])

    batch = random_batch(2)
    last = batch.attention_mask.sum(1) - 1  # each row's final target token
    rows = np.arange(len(last))
    mask = batch.loss_mask.copy()
    mask[rows, last] = False
    masked = batch._replace(loss_mask=mask)
    tokens = batch.tokens.copy()
    tokens[rows, last] = (tokens[rows, last] + 7) % VOCAB
    tokens[~batch.attention_mask] = 5
    assert loss(masked._replace(tokens=tokens)) == loss(masked)
    assert loss(batch._replace(tokens=tokens)) != loss(batch)
    assert step.jitted._cache_size() == 1
    assert {x.sharding for x in jax.tree.leaves((params, opt_state))} == {
        jax.sharding.SingleDeviceSharding(jax.devices()[0])}


# --------------------------------------------------------------------------------------------
# One sharded training run, looked at from several sides
# --------------------------------------------------------------------------------------------

SEQUENCES = [  # prompt -> target; prompts share prefixes (never a contradiction), EOS ends targets
    ([BOS, 3, 4], [10, 11, 12, 13, 14, EOS]),
    ([BOS, 3, 5], [20, 21, 22, 23, EOS]),
    ([BOS, 6], [30, 31, 32, 33, 34, 35, EOS]),
    ([BOS, 7, 8, 9], [15, 25, 35, 5, EOS]),
    ([BOS, 7, 8], [16, 9, 16, EOS]),
    ([BOS, 3], [6, 5, 4, 7, 8, 9, 10, EOS]),
    ([BOS, 10, 11], [36, 3, EOS]),
    ([BOS, 12], [12, 12, 13, 13, EOS]),
]
WEIGHTS = [1.0, 2.0, 0.5, 1.0, 1.5, 1.0, 0.7, 1.2]


def keep_gradient() -> optax.GradientTransformation:
    """Passes updates through unchanged and keeps the latest gradient as its state."""
    return optax.GradientTransformation(
        lambda params: jax.tree.map(jnp.zeros_like, params),
        lambda updates, state, params=None: (updates, updates))


@pytest.fixture(scope="module")
def sharded_run() -> dict:
    """`train_sft` on the 8-device mesh, with `make_sft_step` wrapped so the test sees the
    compiled step and NumPy copies of the first step's parameters, gradient and metrics (the
    arrays themselves are donated by the next step). Rows of 12 tokens predict 11 positions:
    with `chunk_size=4` the vocabulary projection runs in 3 chunks, the last one padded."""
    make_step, seen = sft.make_sft_step, {}

    def recording_make_sft_step(*args, **kwargs):
        seen["step"] = step = make_step(*args, **kwargs)

        def recording(params, opt_state, batch):
            before = None if "params" in seen else jax.tree.map(np.array, params)
            params, opt_state, metrics = step(params, opt_state, batch)
            if before is not None:
                seen.update(params=before, grads=jax.tree.map(np.array, opt_state[0]),
                            metrics={k: float(v) for k, v in metrics.items()})
            return params, opt_state, metrics

        return recording

    mesh = shd.make_mesh({"fsdp": 8})
    model = shd.shard_model(tiny_model(seed=3), mesh)
    seen["shardings"] = jax.tree.map(lambda x: x.sharding, nnx.state(model, nnx.Param))
    prompts, targets = map(list, zip(*SEQUENCES))
    batch = sft.encode_examples(None, prompts, targets, max_len=12, pad_id=PAD,
                                loss_weight=WEIGHTS)
    optimizer = optax.chain(keep_gradient(), optax.adam(1e-2))
    logged = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sft, "make_sft_step", recording_make_sft_step)
        params, history = sft.train_sft(model, optimizer, iter([batch] * 100), steps=100,
                                        log_every=50, progress=False, chunk_size=4,
                                        on_log=logged.append)
    return {**seen, "model": model, "trained": params, "history": history, "batch": batch,
            "logged": logged}


def test_first_step_matches_single_device_full_logit_references(sharded_run):
    """The sharded step's loss and metrics against NumPy on single-device full logits, and its
    gradient against `jax.nn.log_softmax` on full logits, along random directions."""
    batch, params, grads = sharded_run["batch"], sharded_run["params"], sharded_run["grads"]
    metrics = sharded_run["metrics"]

    def reference(p):
        model = nnx.merge(GRAPH, p)
        logits = model(jnp.asarray(batch.tokens), attention_mask=jnp.asarray(batch.attention_mask))
        return reference_loss(model, batch), logits

    directional = jax.jit(lambda p, v: jax.jvp(reference, (p,), (v,)))
    rng = np.random.default_rng(0)
    for _ in range(2):
        v = jax.tree.map(lambda x: rng.normal(size=x.shape).astype(np.float32), params)
        (loss, logits), (slope, _) = directional(params, v)
        want = sum(np.vdot(g, d) for g, d in zip(jax.tree.leaves(grads), jax.tree.leaves(v)))
        np.testing.assert_allclose(want, slope, rtol=1e-4)
    np_loss, np_accuracy = numpy_reference(np.asarray(logits), batch)
    np.testing.assert_allclose(loss, np_loss, rtol=1e-5)
    np.testing.assert_allclose(metrics["loss"], np_loss, rtol=1e-5)
    np.testing.assert_allclose(metrics["accuracy"], np_accuracy, rtol=1e-6)
    assert metrics["target_tokens"] == batch.loss_mask.sum()
    np.testing.assert_allclose(metrics["grad_norm"], np.sqrt(sum(
        np.sum(np.square(g)) for g in jax.tree.leaves(grads))), rtol=1e-5)


def test_training_compiles_once_keeps_shardings_and_updates_the_model(sharded_run):
    assert sharded_run["step"].jitted._cache_size() == 1
    assert jax.tree.map(lambda x: x.sharding, sharded_run["trained"]) == sharded_run["shardings"]
    jax.tree.map(np.testing.assert_array_equal, nnx.state(sharded_run["model"], nnx.Param),
                 sharded_run["trained"])


def test_tiny_model_memorises_sequences(sharded_run):
    history = sharded_run["history"]
    assert [h["step"] for h in history] == [50, 100]
    assert sharded_run["logged"] == history  # handed to on_log as each was read
    assert history[-1]["loss"] < 0.01 and history[-1]["accuracy"] == 1.0
    assert sharded_run["metrics"]["loss"] > 1.0
    prompts, targets = map(list, zip(*SEQUENCES))
    out = sampling.generate(sharded_run["model"], prompts, max_new_tokens=8,
                            rng=jax.random.key(0), temperature=0, pad_id=PAD)
    for row, target in enumerate(targets):
        assert out.tokens[row, 0, :len(target)].tolist() == target
        assert int(out.lengths[row, 0]) == len(target)


def test_train_sft_rejects_too_few_batches():
    model = tiny_model()
    with pytest.raises(ValueError, match="batches ran out after 0 of 3 steps"):
        sft.train_sft(model, optax.adam(1e-2), iter([]), steps=3, log_every=1, progress=False)
    with pytest.raises(ValueError, match="steps and log_every must be >= 1"):
        sft.train_sft(model, optax.adam(1e-2), iter([]), steps=0, log_every=1, progress=False)
