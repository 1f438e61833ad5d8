"""The rubric grammar and its token-level parser, on real trained tokenizers.

The guarantee under test: whatever the logits, masked sampling yields text that a plain
host-side parse of the decoded string reads as a rubric, and the jittable token-level
parser finds the same items, weights and criterion text.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from transformers import AutoTokenizer

from jaxrubric.rubric.grammar import (
    RubricGrammar,
    advance,
    allowed_tokens,
    apply_grammar,
    build_rubric_grammar,
    is_final,
    is_rejected,
    parse_rubric_tokens,
    token_bytes,
)
from helpers import check_against_text
from tokenizer_fixtures import byte_level_bpe, healthbench_criteria, metaspace_bpe, save_tokenizer

POSITIVE = tuple(range(1, 6))
SIGNED = tuple(w for w in range(-5, 6) if w)


@pytest.fixture(scope="session")
def gpt2_tok():
    return byte_level_bpe()


@pytest.fixture(scope="session")
def merged_tok():
    return byte_level_bpe(use_regex=False)


@pytest.fixture(scope="session")
def spm_tok():
    return metaspace_bpe()


def build(tok, weights=POSITIVE, max_items=4, max_item_tokens=12) -> RubricGrammar:
    grammar = build_rubric_grammar(tok, weights=weights, max_items=max_items, max_item_tokens=max_item_tokens)
    return jax.device_put(grammar)


def encode(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def hash_uniform(seed: jax.Array, step: jax.Array, shape: tuple[int, int]) -> jax.Array:
    """Uniforms in (0, 1) from a counter-based integer hash of (seed, step, row, column).

    A cheap stand-in for jax.random, whose generators are slow on a shared CPU.
    """
    rows = jax.lax.broadcasted_iota(jnp.uint32, shape, 0)
    cols = jax.lax.broadcasted_iota(jnp.uint32, shape, 1)
    salt = jnp.uint32(seed) * jnp.uint32(0xC2B2AE35) + jnp.uint32(step) * jnp.uint32(0x27D4EB2F)
    x = rows * jnp.uint32(0x9E3779B1) ^ cols * jnp.uint32(0x85EBCA6B) ^ salt
    for shift, mul in ((16, 0x7FEB352D), (15, 0x846CA68B)):
        x = (x ^ (x >> shift)) * jnp.uint32(mul)
    x = x ^ (x >> 16)
    return ((x >> 8).astype(jnp.float32) + 0.5) / 2.0**24


@functools.partial(jax.jit, static_argnames=("batch", "length"))
def sample_rubrics(grammar, seed, bias, pad_id, *, batch: int, length: int):
    """Constrained sampling from random logits, as a sampler's decode loop would do it.

    Each step draws fresh logits, ``bias`` plus i.i.d. noise in (0, 4), and takes the
    argmax of the masked logits: a random allowed token, favouring biased ones. (Gumbel
    noise would make it softmax sampling, but its logarithms dominate the CPU time.)
    """

    def cond(carry):
        i, state, _ = carry
        return (i < length) & ~jnp.all(is_final(state, grammar))

    def body(carry):
        i, state, out = carry
        logits = bias + 4.0 * hash_uniform(seed, i, (batch, bias.shape[0]))
        token = jnp.argmax(apply_grammar(logits, state, grammar), axis=-1).astype(jnp.int32)
        token = jnp.where(is_final(state, grammar), pad_id, token)
        return i + 1, advance(state, token, grammar), out.at[:, i].set(token)

    start = jnp.full((batch,), grammar.start_state, jnp.int32)
    _, state, out = jax.lax.while_loop(cond, body, (0, start, jnp.full((batch, length), pad_id, jnp.int32)))
    return out, state


class Walk(NamedTuple):
    allowed: np.ndarray  # [L] the mask allowed the token
    rejected: np.ndarray  # [L] a forbidden token has been read, this one included
    final: np.ndarray  # [L] the end token has been read, this one included


def walk(grammar, tokens, length: int = 32) -> Walk:
    """Runs the automaton along tokens [..., L'] (padded to a fixed length: one compilation)."""
    tokens = np.asarray(tokens, np.int32)
    padded = np.zeros((*tokens.shape[:-1], max(length, tokens.shape[-1])), np.int32)
    padded[..., :tokens.shape[-1]] = tokens
    out = jax.device_get(_walk(grammar, jnp.asarray(padded)))
    return Walk(*(x[..., :tokens.shape[-1]] for x in out))


@jax.jit
def _walk(grammar, tokens):
    def one(seq):
        def body(state, token):
            allowed = allowed_tokens(state, grammar)[jnp.clip(token, 0, grammar.vocab_size - 1)]
            nxt = advance(state, token, grammar)
            return nxt, (allowed, is_rejected(nxt, grammar), is_final(nxt, grammar))

        return jax.lax.scan(body, jnp.int32(grammar.start_state), seq)[1]

    return jnp.vectorize(one, signature="(l)->(l),(l),(l)")(tokens)


advance_jit = jax.jit(advance)
allowed_jit = jax.jit(allowed_tokens, static_argnames="vocab_size")


parse = jax.jit(parse_rubric_tokens, static_argnames="pad_id")


def bias_toward_structure(tok, vocab: int, strength: float) -> jnp.ndarray:
    """Logit bias favouring tokens with newlines, brackets, digits or minus signs."""
    bias = np.zeros(vocab, np.float32)
    for i, piece in enumerate(token_bytes(tok)):
        if piece and any(ch in piece for ch in b"\n[]-0123456789"):
            bias[i] = strength
    return jnp.asarray(bias)


def run_sampling(tok, grammar: RubricGrammar, n: int, seed: int, bias_strength: float = 0.0):
    """Samples n rubrics, checks each against the host parse; returns item counts and lengths."""
    vocab = -(-grammar.vocab_size // 128) * 128  # a model's padded vocabulary
    bias = bias_toward_structure(tok, vocab, bias_strength)
    out, state = sample_rubrics(grammar, seed, bias, tok.pad_token_id,
                                batch=n, length=grammar.max_rubric_tokens)
    assert bool(jnp.all(is_final(state, grammar))), "every sample ends within max_rubric_tokens"
    assert int(out.max()) < grammar.vocab_size, "padded vocabulary ids are never sampled"
    parsed = jax.device_get(parse(out, grammar, pad_id=tok.pad_token_id))
    out = np.asarray(out)
    counts = parsed.valid.sum(-1)
    for b in range(n):
        check_against_text(tok, grammar, out[b], jax.tree.map(lambda x, b=b: x[b], parsed))
    return counts, parsed.item_lengths


# ------------------------------------------------------------------------ token strings


def test_token_bytes_byte_level(gpt2_tok):
    pieces = token_bytes(gpt2_tok)
    vocab = gpt2_tok.get_vocab()
    assert len(pieces) == len(gpt2_tok)
    assert pieces[vocab["Ġ"]] == b" " and pieces[vocab["Ċ"]] == b"\n"
    assert pieces[vocab["Ġthe"]] == b" the"
    assert pieces[vocab["Ã"]] == b"\xc3", "a partial UTF-8 byte token keeps its raw byte"
    assert all(pieces[i] is None for i in gpt2_tok.all_special_ids)
    assert pieces[vocab["<|im_start|>"]] is None


def test_token_bytes_metaspace(spm_tok):
    pieces = token_bytes(spm_tok)
    vocab = spm_tok.get_vocab()
    assert spm_tok.decode([vocab["▁the"]]) == "the", "the decoder strips a lone leading space"
    assert pieces[vocab["▁the"]] == b" the"
    assert pieces[vocab["▁"]] == b" "
    assert pieces[vocab["<0x0A>"]] == b"\n" and pieces[vocab["<0xE6>"]] == b"\xe6"
    assert "\n" not in "".join(spm_tok.convert_ids_to_tokens(range(260, len(spm_tok))))
    assert all(pieces[i] is None for i in (0, 1, 2, 3))


def test_token_bytes_from_list():
    assert token_bytes(["a", b"\xe6", None]) == [b"a", b"\xe6", None]


# ------------------------------------------------------------------------ acceptance


@pytest.mark.parametrize("weights", [POSITIVE, SIGNED])
def test_real_rubrics_are_accepted_and_parsed(gpt2_tok, weights):
    grammar = build(gpt2_tok, weights, max_items=16, max_item_tokens=96)
    rng = np.random.default_rng(0)
    criteria = [c for c in healthbench_criteria() if len(encode(gpt2_tok, " " + c)) <= 96]
    rubrics, length = [], 0
    for _ in range(24):
        chosen = rng.choice(len(criteria), size=rng.integers(1, 17), replace=False)
        items = [(int(rng.choice(weights)), criteria[k]) for k in chosen]
        ids = encode(gpt2_tok, "".join(f"[{w}] {c}\n" for w, c in items)) + [gpt2_tok.eos_token_id]
        rubrics.append((items, ids))
        length = max(length, len(ids))
    tokens = np.full((len(rubrics), length + 3), gpt2_tok.pad_token_id, np.int32)
    for b, (_, ids) in enumerate(rubrics):
        tokens[b, :len(ids)] = ids
    walked = walk(grammar, tokens)
    parsed = jax.device_get(parse(tokens, grammar, pad_id=gpt2_tok.pad_token_id))
    for b, (items, ids) in enumerate(rubrics):
        assert walked.allowed[b, :len(ids)].all(), "every token of a valid rubric is allowed"
        assert walked.final[b, len(ids) - 1]
        one = jax.tree.map(lambda x, b=b: x[b], parsed)
        check_against_text(gpt2_tok, grammar, tokens[b], one)
        assert one.weights[:len(items)].tolist() == [w for w, _ in items]
        for j, (_, criterion) in enumerate(items):
            item = one.items[j, :one.item_lengths[j]].tolist()
            assert gpt2_tok.decode(item).strip() == criterion


# ------------------------------------------------------------------------ rejection


def token_spans(tok, ids: list[int]) -> list[tuple[int, int]]:
    """Character span of each token in the decoded text (ASCII texts only)."""
    ends = [len(tok.decode(ids[:k + 1])) for k in range(len(ids))]
    return list(zip([0] + ends[:-1], ends))


@pytest.mark.parametrize(
    ("text", "error_at"),
    [
        ("[3]The answer\n", 3),  # missing space
        ("[0] Zero is no weight\n", 1),
        ("[7] Seven is too heavy\n", 1),
        ("[-2] Negative weights are off\n", 1),
        ("[3] \n", 4),  # empty criterion
        ("[3]  Two spaces\n", 4),
        ("[3] Good\n\n", 9),  # empty line
        ("[3] Good\r\n", 8),
        ("3] No bracket\n", 0),
        ("[3] One\n[2] Two\n[1] Three\n", 16),  # a third item when M = 2
    ],
)
def test_invalid_rubrics_rejected_at_the_right_token(gpt2_tok, text, error_at):
    grammar = build(gpt2_tok, POSITIVE, max_items=2, max_item_tokens=8)
    ids = encode(gpt2_tok, text)
    walked = walk(grammar, ids)
    bad = next(k for k, (a, b) in enumerate(token_spans(gpt2_tok, ids)) if a <= error_at < b)
    assert walked.allowed.tolist() == [True] * bad + [False] * (len(ids) - bad)
    assert walked.rejected.tolist() == [False] * bad + [True] * (len(ids) - bad)


def test_end_token_placement(gpt2_tok):
    grammar = build(gpt2_tok)
    eos = gpt2_tok.eos_token_id
    for ids, accepted in [
        ([eos], False),  # no item yet
        (encode(gpt2_tok, "[3] No newline") + [eos], False),
        (encode(gpt2_tok, "[3] Fine\n") + [eos], True),
    ]:
        walked = walk(grammar, ids)
        assert walked.allowed[-1] == accepted and walked.final[-1] == accepted


def test_item_token_budget(gpt2_tok):
    grammar = build(gpt2_tok, max_items=2, max_item_tokens=5)
    ids = encode(gpt2_tok, "[3]") + [gpt2_tok.get_vocab()["Ġthe"]] * 6 + encode(gpt2_tok, "\n")
    sixth_text_token = 3 + 5  # after "[", "3", "]" and five text tokens
    walked = walk(grammar, ids)
    assert walked.allowed.tolist() == [True] * sixth_text_token + [False] * (len(ids) - sixth_text_token)
    walked = walk(grammar, ids[:sixth_text_token] + encode(gpt2_tok, "\n"))
    assert walked.allowed.all() and not walked.rejected.any()


def test_truncated_and_padded_outputs(gpt2_tok):
    grammar = build(gpt2_tok)
    eos, pad = gpt2_tok.eos_token_id, gpt2_tok.pad_token_id
    ids = encode(gpt2_tok, "[3] First\n[2] Second\n")
    clean = parse(jnp.asarray(ids + [eos, pad, pad]), grammar, pad_id=pad)
    vocab = gpt2_tok.get_vocab()
    junk = parse(jnp.asarray(ids + [eos, vocab["["], vocab["x"]]), grammar, pad_id=pad)
    for a, b in zip(clean, junk):
        np.testing.assert_array_equal(a, b)
    cut = parse(jnp.asarray(ids + encode(gpt2_tok, "[1] Cut off")), grammar, pad_id=pad)
    assert not bool(cut.complete)
    assert cut.valid.tolist() == [True, True, False, False] and cut.weights.tolist() == [3, 2, 0, 0]
    assert int(cut.item_lengths[2]) == 0 and bool(jnp.all(cut.items[2] == pad))


def test_multibyte_characters_complete_before_the_line_ends(gpt2_tok):
    """Byte tokens may spell any character in criterion text, but never leave one half done."""
    grammar = build(gpt2_tok, max_items=2, max_item_tokens=5)
    vocab = gpt2_tok.get_vocab()
    byte_id = {p[0]: i for i, p in enumerate(token_bytes(gpt2_tok)) if p and len(p) == 1}
    assert len(byte_id) == 256
    head = encode(gpt2_tok, "[3] A")
    zhong = [byte_id[b] for b in "中".encode()]  # e4 b8 ad
    newline = byte_id[ord("\n")]
    assert walk(grammar, head + zhong + [newline]).allowed.all()
    assert walk(grammar, head + zhong[:2] + [newline]).allowed.tolist()[-1] is False
    assert walk(grammar, head + [byte_id[0xB8]]).allowed.tolist()[-1] is False, "stray continuation"
    assert walk(grammar, head + [byte_id[0xE0], byte_id[0x80]]).allowed.tolist()[-1] is False, "overlong"
    assert walk(grammar, head + [byte_id[0xC0]]).allowed.tolist()[-1] is False
    # Budget: a started character must fit in the item's remaining text tokens.
    three_left = head + [vocab["Ġthe"]]  # two text tokens used, three left
    assert walk(grammar, three_left + zhong + [newline]).allowed.all()
    assert walk(grammar, three_left + [vocab["Ġthe"]] + zhong[:1]).allowed.tolist()[-1] is False


# ------------------------------------------------------------------------ masking


def test_mask_pads_vocabulary_and_stays_finite(gpt2_tok):
    grammar = build(gpt2_tok)
    after_bracket = advance_jit(grammar.start_state, encode(gpt2_tok, "[")[0], grammar)
    states = jnp.stack([jnp.int32(grammar.start_state), after_bracket])

    @jax.jit
    def mask_and_softmax(logits):
        masked = apply_grammar(logits, states, grammar)
        return masked, jax.nn.softmax(masked.astype(jnp.float32), axis=-1)

    for dtype in (jnp.float32, jnp.bfloat16, jnp.float16):
        masked, probs = jax.device_get(mask_and_softmax(jnp.zeros((2, grammar.vocab_size + 36), dtype)))
        assert masked.dtype == dtype and np.isfinite(masked).all() and np.isfinite(probs).all()
        assert (masked[:, grammar.vocab_size:] < -1e4).all()
        assert probs[:, grammar.vocab_size:].sum() == 0.0
        np.testing.assert_allclose(probs.sum(-1), 1.0, rtol=1e-5)
    with pytest.raises(ValueError):
        apply_grammar(jnp.zeros((grammar.vocab_size - 1,)), states[0], grammar)


def test_merged_vocabulary(merged_tok):
    """Tokens merging brackets, digits, spaces, text and newlines get the documented rule."""
    vocab = merged_tok.get_vocab()
    for piece in ["]Ġ", "3]Ġ", ".Ċ", ".Ċ[", "]ĠTheĠ", "[-"]:
        assert piece in vocab, piece
    grammar = build(merged_tok, SIGNED)

    def state_after(state, ids):
        for i in ids:
            assert allowed_jit(state, grammar)[i]
            state = advance_jit(state, i, grammar)
        return state

    def allowed(state, piece):
        return bool(allowed_jit(state, grammar)[vocab[piece]])

    start = grammar.start_state
    weighed = state_after(start, [vocab["["], vocab["3"]])
    after_close = state_after(weighed, [vocab["]Ġ"]])
    in_text = state_after(after_close, encode(merged_tok, "Some text"))
    assert allowed(start, "[-") and allowed(weighed, "]Ġ") and not allowed(start, "]Ġ")
    assert allowed(start, "[") and not allowed(start, "Ċ")
    assert allowed(in_text, ".Ċ") and allowed(in_text, "Ċ")
    assert not allowed(in_text, ".Ċ["), "text and weight syntax never share a token"
    assert not allowed(weighed, "]ĠTheĠ")
    assert allowed(after_close, "TheĠ") and not allowed(after_close, "Ġ")


# ------------------------------------------------------------------------ sampling


@pytest.mark.slow
@pytest.mark.parametrize(("weights", "seed"), [(POSITIVE, 0), (SIGNED, 1)])
def test_constrained_sampling_always_parses(merged_tok, weights, seed):
    grammar = build(merged_tok, weights, max_items=4, max_item_tokens=12)
    counts, _ = run_sampling(merged_tok, grammar, n=1000, seed=seed)
    assert counts.min() >= 1 and counts.max() == grammar.max_items


def test_constrained_sampling_biased_to_structure(gpt2_tok):
    grammar = build(gpt2_tok, SIGNED, max_items=6, max_item_tokens=10)
    counts, lengths = run_sampling(gpt2_tok, grammar, n=500, seed=2, bias_strength=2.0)
    assert counts.max() == grammar.max_items and (lengths == 1).any()


def test_constrained_sampling_at_the_limits(gpt2_tok):
    grammar = build(gpt2_tok, POSITIVE, max_items=2, max_item_tokens=2)
    counts, lengths = run_sampling(gpt2_tok, grammar, n=300, seed=3, bias_strength=1.0)
    assert set(counts.tolist()) == {1, 2} and lengths.max() == 2


def test_metaspace_tokenizer(spm_tok):
    grammar = build(spm_tok, SIGNED, max_items=3, max_item_tokens=10)
    ids = encode(spm_tok, "[3] The answer mentions rest.\n[-2] Gives a dose ü.\n") + [spm_tok.eos_token_id]
    walked = walk(grammar, ids)
    assert walked.allowed.all() and walked.final[-1]
    run_sampling(spm_tok, grammar, n=300, seed=4)


# ------------------------------------------------------------------------ building


def test_saved_tokenizer_builds_the_same_grammar(gpt2_tok, tmp_path):
    loaded = AutoTokenizer.from_pretrained(str(save_tokenizer(gpt2_tok, tmp_path)))
    assert "<|im_start|>assistant" in loaded.apply_chat_template(
        [{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True)
    a = build_rubric_grammar(gpt2_tok, weights=SIGNED)
    b = build_rubric_grammar(loaded, weights=SIGNED)
    np.testing.assert_array_equal(a.table, b.table)
    np.testing.assert_array_equal(a.token_class, b.token_class)
    assert a.end_token_id == b.end_token_id == gpt2_tok.eos_token_id


def test_build_from_strings_and_errors():
    vocab = ["[", "]", " ", "\n", "1", "2", "a", " a", "<eos>"]
    grammar = build_rubric_grammar(vocab, weights=(1, 2), max_items=2, max_item_tokens=3, end_token_id=8)
    ids = [0, 4, 1, 7, 6, 3, 8]  # "[1] aa\n" + end
    parsed = parse(jnp.asarray(ids), grammar, pad_id=8)
    assert bool(parsed.complete) and parsed.weights.tolist() == [1, 0]
    assert parsed.items[0].tolist() == [7, 6, 8] and parsed.token_item.tolist() == [-1, -1, -1, 0, 0, -1, -1]
    with pytest.raises(ValueError, match="single tokens"):
        build_rubric_grammar(vocab[:3] + vocab[4:], weights=(1,), end_token_id=7)
    with pytest.raises(ValueError, match="single tokens"):
        build_rubric_grammar(vocab, weights=(-1, 1), end_token_id=8)
    with pytest.raises(ValueError, match="end_token_id"):
        build_rubric_grammar(vocab, weights=(1,))
    with pytest.raises(ValueError, match="distinct"):
        build_rubric_grammar(vocab, weights=(1, 1), end_token_id=8)
