"""The toy world's pieces: tokenizer, task, quality, checker, generated data."""

from __future__ import annotations

import random

import jax.numpy as jnp
import numpy as np
import pytest

import jaxrubric
from jaxrubric.rubric import grammar as grammar_lib
from jaxrubric.rubric import templates as tpl
from jaxrubric.rubric.verifier import verifier_readout
from jaxrubric.toy import digits_task as task
from jaxrubric.toy import world


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return jaxrubric.load_tokenizer(task.build_tokenizer(tmp_path_factory.mktemp("toy_tok")))


def test_tokenizer_spells_digits_one_token_each_and_has_yes_no(tokenizer):
    ids = tokenizer.encode("big 318729", add_special_tokens=False)
    assert tokenizer.decode(ids) == "big 318729"
    assert len(tokenizer.encode("31415", add_special_tokens=False)) == 5
    readout = verifier_readout(tokenizer, tpl.verifier_template(tokenizer, style="compact"))
    assert readout.yes_ids == tuple(tokenizer.encode("yes", add_special_tokens=False))
    assert readout.no_ids == tuple(tokenizer.encode("no", add_special_tokens=False))


def test_prompts_targets_and_warm_start_answers():
    rng = random.Random(0)
    for _ in range(200):
        prompt, target = task.make_prompt(rng)
        digits = task.digits_of(prompt)
        assert len(set(digits)) == len(digits) and target == task.target_of(prompt)
        assert 2 <= len(target) <= 5 and all(d > "4" for d in target)
        assert task.flawed_answer(prompt, rng, 0) == target
        assert task.quality(task.flawed_answer(prompt, rng, 1), target) < 1
    prompts = [task.make_prompt(rng)[0] for _ in range(2000)]
    correct = [task.policy_warm_start_answer(p, rng, 0.3) == task.target_of(p) for p in prompts]
    assert 0.25 < np.mean(correct) < 0.35  # the middling warm start: 30% right


def test_quality_partial_credit_and_jax_version_agree():
    assert task.quality("1134", "1134") == 1.0
    assert task.quality("1143", "1134") == 0.5
    assert task.quality("113", "1134") == 0.75
    assert task.quality("11345", "1134") == 0.8
    assert task.quality("", "1134") == 0.0
    rng = np.random.default_rng(0)
    responses = rng.integers(0, 4, (6, 3, 8))
    lengths = rng.integers(0, 9, (6, 3))
    targets = rng.integers(0, 4, (6, 5))
    target_len = rng.integers(1, 6, (6,))
    got = task.token_match_quality(jnp.asarray(responses), jnp.asarray(lengths),
                                   jnp.asarray(targets)[:, None], jnp.asarray(target_len)[:, None])
    want = [[task.quality(list(responses[b, k, :lengths[b, k]]), list(targets[b, :target_len[b]]))
             for k in range(3)] for b in range(6)]
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6)


@pytest.mark.parametrize("criterion, answer, met", [
    ("has 8", "879", True), ("has 3", "879", False), ("omits 3", "879", True),
    ("omits 9", "879", False), ("has 87", "879", False), ("has  8", "879", False),
    ("no 3", "879", False), ("omits 3", "", True), ("has x", "879", False),
])
def test_checker(criterion, answer, met):
    assert task.check(criterion, answer) is met


def test_anchor_lists_rank_the_correct_answer_first_by_strictly_falling_quality():
    for row in task.anchor_rows(50, seed=3, num_anchors=3):
        answers = [a["answer"] for a in row["answers"]]
        target = task.target_of(row["prompt"])
        assert answers[0] == target
        qualities = [task.quality(a, target) for a in answers]
        assert all(a > b for a, b in zip(qualities, qualities[1:]))
        assert [a["rank"] for a in row["answers"]] == [1, 2, 3]


def test_teacher_rubrics_follow_the_grammar(tokenizer):
    cfg = world.ToyWorldConfig()
    grammar = grammar_lib.build_rubric_grammar(tokenizer, weights=range(1, 6),
                                               max_items=cfg.max_items,
                                               max_item_tokens=cfg.max_item_tokens)
    prompts, targets = world.generator_examples(tokenizer, random.Random(0), 64, cfg)
    width = grammar.max_rubric_tokens
    tokens = np.full((len(targets), width), tokenizer.pad_token_id, np.int32)
    for i, t in enumerate(targets):
        assert len(t) <= width
        tokens[i, :len(t)] = t
    parsed = grammar_lib.parse_rubric_tokens(jnp.asarray(tokens), grammar, tokenizer.pad_token_id)
    assert np.asarray(parsed.complete).all()
    for i, t in enumerate(targets):
        lines = tokenizer.decode(t[:-1]).splitlines()
        assert int(np.asarray(parsed.valid[i]).sum()) == len(lines)
        for m, line in enumerate(lines):
            item = np.asarray(parsed.items[i, m, :int(parsed.item_lengths[i, m])])
            assert "[" + str(int(parsed.weights[i, m])) + "] " + tokenizer.decode(item) == line


def test_verifier_examples_are_balanced_and_labelled_by_the_checker(tokenizer):
    prompts, targets = world.verifier_examples(tokenizer, random.Random(0), 200)
    yes = tokenizer.encode("yes", add_special_tokens=False)
    assert sum(t == yes for t in targets) == 100
    template = tpl.verifier_template(tokenizer, style="compact")
    for ids, target in zip(prompts[:40], targets[:40]):
        text = tokenizer.decode(ids, skip_special_tokens=True)
        question, answer, criterion = (
            text.split("q: ")[1].split("\n")[0], text.split("a: ")[1].split("\n")[0],
            text.split("c:")[1].split("\n")[0])
        assert task.check(criterion, answer) == (target == yes)
        assert ids[:len(template.segments[0])] == list(template.segments[0])
        assert question.startswith(task.INSTRUCTION)
