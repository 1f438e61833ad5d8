"""Shared-prefix verification (the prefix encoded once, every item a branch of it) equals running
every prefix + item + suffix on its own, and the dense tree-masked forward it replaced."""

import copy
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tokenizer_fixtures import byte_level_bpe, healthbench_criteria, healthbench_rows, metaspace_bpe

import jaxrubric
from jaxrubric import sharding as shd
from jaxrubric.models.config import LoraConfig
from jaxrubric.rubric import dense_tree
from jaxrubric.rubric import templates as T
from jaxrubric.rubric import verifier as V
from jaxrubric.rubric.grammar import build_rubric_grammar, parse_rubric_tokens

TOL = 1e-5
PAD = 2
VOCAB = 1500  # the byte-level fixture tokenizer's


_tree_logits = jax.jit(V.answer_logits, static_argnames="pad_id")
_dense_logits = jax.jit(dense_tree.answer_logits, static_argnames="pad_id")
_per_item_logits = jax.jit(V.answer_logits_per_item, static_argnames="pad_id")
_verify = jax.jit(V.verify, static_argnames=("pad_id", "micro_batches"))
_verify_per_item = jax.jit(V.verify_per_item, static_argnames="pad_id")


@pytest.fixture(scope="module")
def models():
    """One tiny model per architecture, built once (initialisation compiles)."""
    return {t: jaxrubric.init_model(jaxrubric.tiny_config(t, vocab_size=VOCAB), seed=1)
            for t in ("llama", "qwen3")}


def _random_inputs(vocab, batch=2, responses=2, groups=2, items=3, item_len=5, prefix_len=9,
                   seed=0):
    """Prefixes and items of different lengths, one invalid item per group."""
    rng = np.random.RandomState(seed)
    prefix = rng.randint(3, vocab, (batch, responses, prefix_len))
    prefix_lengths = rng.randint(3, prefix_len + 1, (batch, responses))
    prefix_lengths[0, 0] = prefix_len
    item_tokens = rng.randint(3, vocab, (batch, groups, items, item_len))
    item_lengths = rng.randint(1, item_len + 1, (batch, groups, items))
    item_lengths[0, 0, 0] = item_len
    valid = np.ones((batch, groups, items), bool)
    valid[:, :, -1] = False
    item_lengths[:, :, -1] = 0
    return prefix, prefix_lengths, item_tokens, item_lengths, valid


def _plain_logits(model, prefix, prefix_lengths, items, item_lengths, suffix):
    """Reference: every prefix + item + suffix as a plain causal sequence, no mask, no positions.

    Sequences are right-padded into one batch; causality keeps the padding after the last
    real token out of its logits, which are read there.
    """
    batch, responses = prefix_lengths.shape
    _, groups, num_items = item_lengths.shape
    seqs = [np.concatenate([prefix[b, k, :prefix_lengths[b, k]],
                            items[b, g, m, :item_lengths[b, g, m]], suffix])
            for b, k, g, m in np.ndindex(batch, responses, groups, num_items)]
    width = max(map(len, seqs))
    ids = np.stack([np.pad(s, (0, width - len(s)), constant_values=PAD) for s in seqs])
    logits = np.asarray(jax.jit(model)(jnp.asarray(ids)))
    last = logits[np.arange(len(seqs)), [len(s) - 1 for s in seqs]]
    return last.reshape(batch, responses, groups, num_items, -1)


@pytest.mark.slow
@pytest.mark.parametrize("model_type", ["llama", "qwen3"])
def test_tree_forward_equals_separate_sequences(models, model_type):
    model = models[model_type]
    suffix = np.array([11, 12, 13])
    inputs = _random_inputs(model.config.vocab_size)
    ref = _plain_logits(model, *inputs[:4], suffix)
    tree = _tree_logits(model, *inputs[:4], suffix, pad_id=PAD)
    assert tree.shape == ref.shape
    # Invalid items (length 0) are still computed: prefix + suffix alone.
    assert np.abs(np.asarray(tree) - ref).max() <= TOL
    dense = _dense_logits(model, *inputs[:4], suffix, pad_id=PAD)
    assert np.abs(np.asarray(dense) - ref).max() <= TOL
    if model_type == "llama":
        per_item = _per_item_logits(model, *inputs[:4], suffix)
        assert np.abs(np.asarray(per_item) - ref).max() <= TOL


def test_branch_layout():
    items = np.array([[[[20, 21, 9], [30, 9, 9]]]])  # B=1, G=1, M=2, Li=3
    tokens, real = V.branch_inputs(items, np.array([[[2, 1]]]), np.array([40, 41]), pad_id=0)
    np.testing.assert_array_equal(tokens[0], [[20, 21, 0, 40, 41], [30, 0, 0, 40, 41]])
    np.testing.assert_array_equal(real[0], [[1, 1, 0, 1, 1], [1, 0, 0, 1, 1]])


def test_dense_tree_layout():
    prefix = np.array([[[5, 6, 7, 0]]])
    items = np.array([[[[20, 21, 0], [30, 0, 0]]]])  # B=1, G=1, M=2, Li=3
    tokens, positions, mask, answers = dense_tree.tree_inputs(
        prefix, np.array([[3]]), items, np.array([[[2, 1]]]), np.array([40, 41]), pad_id=0)
    np.testing.assert_array_equal(tokens[0, 0], [5, 6, 7, 0, 20, 21, 0, 40, 41, 30, 0, 0, 40, 41])
    np.testing.assert_array_equal(answers, [8, 13])
    real = np.asarray(positions[0, 0])[[0, 1, 2, 4, 5, 7, 8, 9, 12, 13]]
    np.testing.assert_array_equal(real, [0, 1, 2, 3, 4, 5, 6, 3, 4, 5])
    seen = np.asarray(mask[0, 0])
    np.testing.assert_array_equal(np.where(seen[13])[0], [0, 1, 2, 9, 12, 13])
    np.testing.assert_array_equal(np.where(seen[8])[0], [0, 1, 2, 4, 5, 7, 8])
    assert seen.diagonal().all()  # padding rows attend to themselves only


READOUT = V.VerifierReadout(suffix=(11, 12, 13), yes_ids=(40, 41), no_ids=(50,))


def test_verify_reads_yes_over_no_and_masks_invalid_items(models):
    model, readout = models["llama"], READOUT
    inputs = _random_inputs(model.config.vocab_size, seed=4)
    logits = np.asarray(_tree_logits(model, *inputs[:4], np.array(readout.suffix), pad_id=PAD))
    got = _verify(model, readout, *inputs, pad_id=PAD)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    yes, no = probs[..., [40, 41]].sum(-1), probs[..., 50]
    valid = inputs[4][:, None]
    expected = np.where(valid, yes / (yes + no), 0.0)
    assert got.p_yes.shape == (2, 2, 2, 3) and got.p_yes.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(got.p_yes), expected, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(got.verdicts), valid & (expected > 0.5))


def _dense_p_yes(model, readout, prefix, prefix_lengths, items, item_lengths, valid):
    """`verify`'s p_yes from the dense tree-masked forward."""
    logits = _dense_logits(model, prefix, prefix_lengths, items, item_lengths,
                           np.array(readout.suffix), pad_id=PAD)
    p_yes = np.asarray(V.yes_probability(logits, readout.yes_ids, readout.no_ids))
    return np.where(valid[:, None], p_yes, 0.0)


def _judge(variant):
    """The verifier model of a variant: a plain tiny Llama, a Qwen3 whose attention runs in
    blocks of 8 queries (the 9-token prefixes in two overlapping blocks, the branches one
    position of all 9 at a time), or a Qwen3 with LoRA adapters that are not zero."""
    if variant == "llama":
        return jaxrubric.init_model(jaxrubric.tiny_config("llama", vocab_size=VOCAB), seed=1)
    if variant == "qwen3, attention in blocks":
        return jaxrubric.init_model(jaxrubric.tiny_config("qwen3", vocab_size=VOCAB,
                                                          attention_chunk=8), seed=1)
    lora = LoraConfig(rank=4, targets=("q_proj", "v_proj", "down_proj"))
    model = jaxrubric.init_model(jaxrubric.tiny_config("qwen3", vocab_size=VOCAB, lora=lora),
                                 seed=1)
    for i, (name, p) in enumerate(sorted(model.layers.items())):
        if name.endswith("_lora_b"):
            p[...] = 0.1 * jax.random.normal(jax.random.key(i), p.shape)
    return model


@pytest.mark.slow
@pytest.mark.parametrize("variant, micro_batches", [
    ("llama", 1), ("llama", 2), ("qwen3, attention in blocks", 1), ("qwen3 with LoRA", 2)])
def test_shared_prefix_verdicts_equal_per_item_and_the_dense_tree(variant, micro_batches):
    """fp32 p_yes of `verify` (the prefix once, items as branches) against one sequence per
    item and the dense tree: prefixes and items of varied lengths, an invalid (empty) item in
    each of 3 groups, 2 prompts of 2 responses."""
    model = _judge(variant)
    inputs = _random_inputs(VOCAB, groups=3, seed=9)
    got = _verify(model, READOUT, *inputs, pad_id=PAD, micro_batches=micro_batches)
    ref = _verify_per_item(model, READOUT, *inputs, pad_id=PAD)
    np.testing.assert_allclose(np.asarray(got.p_yes), np.asarray(ref.p_yes), atol=TOL)
    np.testing.assert_allclose(np.asarray(got.p_yes), _dense_p_yes(model, READOUT, *inputs),
                               atol=TOL)
    np.testing.assert_array_equal(np.asarray(got.verdicts), np.asarray(ref.verdicts))
    assert not np.asarray(got.p_yes)[..., -1].any()  # the invalid items


def test_yes_no_ids_are_every_single_token_spelling():
    tok = byte_level_bpe()
    yes, no = V.yes_no_token_ids(tok)
    assert tok.convert_tokens_to_ids("Ġyes") in yes and tok.convert_tokens_to_ids("Ġno") in no
    assert {tok.decode([i]).strip() for i in yes} == {"yes"}
    assert {tok.decode([i]).strip() for i in no} <= {"no", "No", "NO"}
    with pytest.raises(ValueError, match="single-token yes"):
        V.yes_no_token_ids(metaspace_bpe())
    extended = copy.deepcopy(metaspace_bpe())
    extended.add_tokens(["Yes", "YES", "No"])
    yes, no = V.yes_no_token_ids(extended)
    assert [extended.decode([i]) for i in yes] == ["Yes", "YES"]
    assert [extended.decode([i]).strip() for i in no] == ["no", "No"]


def _real_batch(tok, batch=2, responses=2, groups=2, max_items=3, item_len=32):
    """Real prompts, responses and parsed rubrics, tokenised by ``tok``."""
    rows = healthbench_rows()
    criteria = healthbench_criteria()
    enc = functools.partial(tok.encode, add_special_tokens=False)
    prompts = [enc(rows[b]["prompt"][-1]["content"][:200]) for b in range(batch)]
    answers = [[enc(criteria[5 * b + k][:150]) for k in range(responses)] for b in range(batch)]
    rubrics = []
    for b in range(batch):
        for g in range(groups):
            lines = [f"[{1 + (b + g + m) % 5}] {criteria[7 * b + 3 * g + m][:60]}\n"
                     for m in range(1 + (b + g) % max_items)]
            rubrics.append(enc("".join(lines)) + [tok.eos_token_id])
    width = max(map(len, rubrics))
    rubric_ids = np.full((batch * groups, width), tok.pad_token_id)
    for i, r in enumerate(rubrics):
        rubric_ids[i, :len(r)] = r
    grammar = build_rubric_grammar(tok, max_items=max_items, max_item_tokens=item_len)
    parsed = jax.jit(parse_rubric_tokens, static_argnums=2)(
        rubric_ids.reshape(batch, groups, width), grammar, tok.pad_token_id)
    assert bool(parsed.complete.all())
    p_ids = np.full((batch, max(map(len, prompts))), tok.pad_token_id)
    for b, p in enumerate(prompts):
        p_ids[b, :len(p)] = p
    r_width = max(len(a) for row in answers for a in row)
    r_ids = np.full((batch, responses, r_width), tok.pad_token_id)
    for b, k in np.ndindex(batch, responses):
        r_ids[b, k, :len(answers[b][k])] = answers[b][k]
    lengths = (np.array([len(p) for p in prompts]),
               np.array([[len(a) for a in row] for row in answers]))
    return (p_ids, lengths[0], r_ids, lengths[1]), parsed


@pytest.mark.slow
def test_end_to_end_with_a_real_tokenizer_and_parsed_rubrics(models):
    tok = byte_level_bpe()
    assert len(tok) == VOCAB
    template = T.verifier_template(tok)
    readout = V.verifier_readout(tok, template)
    (p_ids, p_len, r_ids, r_len), parsed = _real_batch(tok)
    prefix = jax.jit(functools.partial(V.verifier_prefix, template, pad_id=tok.pad_token_id))(
        p_ids, p_len, r_ids, r_len)
    # Every branch's real tokens after the prefix's read as the verifier prompt for that item.
    branches, real = jax.jit(V.branch_inputs)(parsed.items, parsed.item_lengths, readout.suffix)
    b, k, g, m = 1, 0, 1, 1
    n = int(prefix.lengths[b, k])
    branch = g * parsed.items.shape[2] + m
    item = np.asarray(parsed.items[b, g, m, :parsed.item_lengths[b, g, m]])
    criterion = tok.decode(item.tolist())
    ids = np.concatenate([np.asarray(prefix.tokens[b, k, :n]),
                          np.asarray(branches[b, branch])[np.asarray(real[b, branch])]])
    text = tok.decode(ids.tolist(), skip_special_tokens=False)
    prompt = tok.decode(p_ids[b, :p_len[b]].tolist())
    response = tok.decode(r_ids[b, k, :r_len[b, k]].tolist())
    assert text == template.render(prompt, response, criterion)
    assert len(ids) == n + int(parsed.item_lengths[b, g, m]) + len(readout.suffix)

    model = models["qwen3"]
    args = (prefix.tokens, prefix.lengths, parsed.items, parsed.item_lengths, parsed.valid)
    got = _verify(model, readout, *args, pad_id=tok.pad_token_id)
    ref = _verify_per_item(model, readout, *args)
    np.testing.assert_allclose(np.asarray(got.p_yes), np.asarray(ref.p_yes), atol=TOL)
    assert not np.asarray(got.p_yes)[~np.broadcast_to(np.asarray(parsed.valid)[:, None],
                                                      got.p_yes.shape)].any()


def test_sharded_inputs_and_params_give_the_same_verdicts(models):
    mesh = shd.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    halves = [_random_inputs(VOCAB, seed=s) for s in (6, 7)]
    inputs = [np.concatenate(parts) for parts in zip(*halves)]  # batch 4
    singles = [_verify(models["llama"], READOUT, *half, pad_id=PAD) for half in halves]
    model = shd.shard_model(copy.deepcopy(models["llama"]), mesh)
    assert model.layers["q_proj"][...].sharding.spec == jax.sharding.PartitionSpec(
        None, "fsdp", "tensor", None)
    placed = [jax.device_put(x, shd.batch_sharding(mesh, x.ndim)) for x in inputs]
    got = _verify(model, READOUT, *placed, pad_id=PAD)
    assert got.p_yes.sharding.spec[0] == ("data", "fsdp")
    np.testing.assert_allclose(np.asarray(got.p_yes),
                               np.concatenate([np.asarray(x.p_yes) for x in singles]), atol=TOL)
    np.testing.assert_array_equal(np.asarray(got.verdicts),
                                  np.concatenate([np.asarray(x.verdicts) for x in singles]))


@pytest.mark.slow
def test_on_the_8_device_mesh_in_micro_batches_verdicts_equal_per_item(models):
    """Weights sharded fsdp 2 x tensor 2, 8 prompts over data x fsdp in 2 micro-batches: the
    verdicts of one sequence per item and of the dense tree, on one device."""
    mesh = shd.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    inputs = _random_inputs(VOCAB, batch=8, groups=3, seed=8)
    model = shd.shard_model(copy.deepcopy(models["llama"]), mesh)
    placed = [jax.device_put(x, shd.batch_sharding(mesh, x.ndim)) for x in inputs]
    got = _verify(model, READOUT, *placed, pad_id=PAD, micro_batches=2)
    assert got.p_yes.sharding.spec[0] == ("data", "fsdp")
    ref = _verify_per_item(models["llama"], READOUT, *inputs, pad_id=PAD)
    np.testing.assert_allclose(np.asarray(got.p_yes), np.asarray(ref.p_yes), atol=TOL)
    np.testing.assert_allclose(np.asarray(got.p_yes),
                               _dense_p_yes(models["llama"], READOUT, *inputs), atol=TOL)
    np.testing.assert_array_equal(np.asarray(got.verdicts), np.asarray(ref.verdicts))


def test_verdict_loss_is_the_cross_entropy_of_the_verdicts_on_valid_items(models):
    model, readout = models["qwen3"], READOUT
    inputs = _random_inputs(model.config.vocab_size, seed=5)
    labels = np.random.RandomState(0).randint(0, 2, (2, 2, 2, 3)).astype(np.float32)
    loss, metrics = jax.jit(V.verdict_loss, static_argnames="pad_id")(
        model, readout, *inputs, labels, pad_id=PAD)
    p = np.asarray(_verify(model, readout, *inputs, pad_id=PAD).p_yes, np.float64)
    valid = np.broadcast_to(inputs[4][:, None], p.shape)
    p = np.where(valid, p, 0.5)  # invalid items read 0: keep their logs finite
    nll = -(labels * np.log(p) + (1 - labels) * np.log1p(-p))
    np.testing.assert_allclose(float(loss), nll[valid].mean(), rtol=1e-5)
    np.testing.assert_allclose(float(metrics["accuracy"]),
                               ((p > 0.5) == (labels > 0.5))[valid].mean(), rtol=1e-6)
