"""Prompt templates: pre-tokenised segments assemble, inside jit, into the rendered text."""

import copy

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tokenizers import pre_tokenizers
from tokenizer_fixtures import byte_level_bpe, healthbench_criteria, healthbench_rows, metaspace_bpe

from jaxrubric.rubric import templates as T

TOKENIZERS = {
    "byte-level": lambda: byte_level_bpe(),
    "byte-level-no-regex": lambda: byte_level_bpe(use_regex=False),
    "metaspace": lambda: metaspace_bpe(),
}


def _texts(n, seed=0):
    """Real prompt-like texts with newlines, punctuation and non-ASCII characters."""
    rows = healthbench_rows()
    rng = np.random.RandomState(seed)
    picks = rng.choice(len(rows), n, replace=False)
    return [rows[i]["prompt"][-1]["content"][:300] + " — ok?" for i in picks]


def _pad(token_lists, width, pad_id):
    out = np.full((len(token_lists), width), pad_id, np.int32)
    for i, ids in enumerate(token_lists):
        out[i, :len(ids)] = ids
    return out, np.array([len(ids) for ids in token_lists], np.int32)


def _encode(tok, texts):
    return [tok.encode(t, add_special_tokens=False) for t in texts]


def _check_rows(tok, packed, expected, align):
    tokens, lengths, mask = (np.asarray(x) for x in packed)
    width = tokens.shape[-1]
    for row, n, m, text in zip(tokens.reshape(-1, width), lengths.reshape(-1),
                               mask.reshape(-1, width), expected):
        real = row[:n] if align == "left" else row[width - n:]
        np.testing.assert_array_equal(m, np.isin(np.arange(width), np.arange(n) if align == "left"
                                                 else np.arange(width - n, width)))
        assert np.all(row[~m] == tok.pad_token_id)
        assert tok.decode(real.tolist(), skip_special_tokens=False) == text


@pytest.mark.parametrize("name", sorted(TOKENIZERS))
def test_dynamic_rubric_prompt_decodes_to_the_rendered_text(name):
    tok = TOKENIZERS[name]()
    batch, k = 2, 3
    template = T.dynamic_rubric_generator_template(tok, k, max_items=8)
    assert template.slots == ("prompt", "response_1", "response_2", "response_3")
    prompts = _texts(batch)
    responses = [_texts(k, seed=1 + b) for b in range(batch)]
    p_ids, p_len = _pad(_encode(tok, prompts), 200, tok.pad_token_id)
    r_lists = [_encode(tok, rs) for rs in responses]
    r_ids = np.stack([_pad(rl, 160, tok.pad_token_id)[0] for rl in r_lists])
    r_len = np.array([[len(x) for x in rl] for rl in r_lists])
    expected = [T.render_chat(tok, T.dynamic_rubric_generator_messages(p, rs, max_items=8))
                for p, rs in zip(prompts, responses)]
    assert expected == [template.render(p, *rs) for p, rs in zip(prompts, responses)]

    @jax.jit
    def build(p_ids, p_len, r_ids, r_len):
        slots = [p_ids] + [r_ids[:, j] for j in range(k)]
        lengths = [p_len] + [r_len[:, j] for j in range(k)]
        return (T.assemble(template, slots, lengths, pad_id=tok.pad_token_id, align="left"),
                T.assemble(template, slots, lengths, pad_id=tok.pad_token_id, align="right"))

    left, right = build(p_ids, p_len, r_ids, r_len)
    assert left.tokens.shape == (batch, template.constant_length + 200 + k * 160)
    _check_rows(tok, left, expected, "left")
    _check_rows(tok, right, expected, "right")


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(TOKENIZERS))
def test_other_templates_decode_to_the_rendered_text(name):
    tok = TOKENIZERS[name]()
    prompt, response = _texts(2, seed=3)
    criterion = " " + healthbench_criteria()[0]
    rubric = "[5] " + healthbench_criteria()[1] + "\n[-2] " + healthbench_criteria()[2]
    cases = [
        (T.genrubric_generator_template(tok, max_items=6), [prompt],
         T.genrubric_generator_messages(prompt, max_items=6)),
        (T.verifier_template(tok), [prompt, response, criterion],
         T.verifier_messages(prompt, response, criterion)),
        (T.induced_response_template(tok), [rubric, prompt],
         T.induced_response_messages(prompt, rubric)),
    ]
    for template, texts, messages in cases:
        expected = T.render_chat(tok, messages)
        assert template.render(*texts) == expected
        ids = _encode(tok, texts)
        packed = T.assemble(template, [np.array(x) for x in ids], [len(x) for x in ids],
                            pad_id=tok.pad_token_id)
        _check_rows(tok, jax.tree.map(lambda a: a[None], packed), [expected], "left")


def test_verifier_template_shares_everything_before_the_criterion():
    tok = byte_level_bpe()
    template = T.verifier_template(tok)
    assert template.slots[-1] == "criterion"
    suffix = tok.decode(list(template.segments[-1]), skip_special_tokens=False)
    assert suffix.endswith("<|im_end|>\n<|im_start|>assistant\n")
    assert "yes or no" in suffix
    head = template.head(2)
    assert head.slots == ("prompt", "response") and head.segments == template.segments[:3]


def test_generator_prompts_ask_for_the_line_format():
    dyn = T.dynamic_rubric_generator_messages("Q?", ["a", "b"], max_items=7)[0]["content"]
    gen = T.genrubric_generator_messages("Q?", max_items=7)[0]["content"]
    for text in (dyn, gen):
        assert "at most 7 criteria" in text and "[w] criterion" in text
    assert "<response 1>\na\n</response 1>" in dyn and "<response 2>\nb\n</response 2>" in dyn
    assert "Response 2" in dyn  # named only to forbid it
    assert "-5" in gen and "-5" not in dyn


def test_plain_format_without_a_chat_template():
    tok = copy.deepcopy(byte_level_bpe())
    tok.chat_template = None
    template = T.verifier_template(tok)
    text = template.render("P", "R", " C")
    assert text.startswith("User: You are grading") and text.endswith("yes or no.\n\nAssistant:")


def test_refuses_a_tokenizer_that_prepends_a_space_to_every_piece():
    tok = copy.deepcopy(metaspace_bpe())
    tok.backend_tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="always")
    with pytest.raises(ValueError, match="do not decode"):
        T.verifier_template(tok)


def test_slot_order_is_checked():
    tok = byte_level_bpe()
    messages = T.verifier_messages(*map(T.slot_marker, ("prompt", "response", "criterion")))
    with pytest.raises(ValueError, match="expected"):
        T.token_template(tok, messages, ("response", "prompt", "criterion"))


@pytest.mark.parametrize("align", ["left", "right"])
def test_compact_keeps_order_and_pads(align):
    rng = np.random.RandomState(0)
    tokens = rng.randint(1, 100, (3, 4, 9))
    valid = rng.rand(3, 4, 9) < 0.5
    out = jax.jit(lambda t, v: T.compact(t, v, pad_id=-1, align=align))(tokens, valid)
    rows = zip(tokens.reshape(-1, 9), valid.reshape(-1, 9), np.asarray(out.tokens).reshape(-1, 9),
               np.asarray(out.lengths).ravel(), np.asarray(out.mask).reshape(-1, 9))
    for t, v, row, n, m in rows:
        kept = t[v]
        assert n == len(kept)
        expect = np.full(9, -1)
        if align == "left":
            expect[:n] = kept
        else:
            expect[9 - n:] = kept
        np.testing.assert_array_equal(row, expect)
        np.testing.assert_array_equal(m, expect != -1)


def test_assemble_broadcasts_leading_dims():
    template = T.TokenTemplate(("a", "b"), ((7,), (8, 8), ()), ("x", "yy", ""))
    a = jnp.array([[[1, 2, 0]], [[3, 0, 0]]])  # [2, 1, 3]
    b = jnp.array([[[4, 0], [5, 6]], [[0, 0], [9, 0]]])  # [2, 2, 2]
    out = T.assemble(template, [a, b], [jnp.array([[2], [1]]), jnp.array([[1, 2], [0, 1]])])
    assert out.tokens.shape == (2, 2, 1 + 3 + 2 + 2)
    np.testing.assert_array_equal(np.asarray(out.lengths), [[6, 7], [4, 5]])
    np.testing.assert_array_equal(np.asarray(out.tokens)[0, 1], [7, 1, 2, 8, 8, 5, 6, 0])
    np.testing.assert_array_equal(np.asarray(out.tokens)[1, 0], [7, 3, 8, 8, 0, 0, 0, 0])
