"""The toy worlds' final evaluation: paired leads against scipy's paired t test, and common
random numbers (one key: the same draws for every checkpoint)."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from scipy import stats

import jaxrubric
from jaxrubric import sharding as shd
from jaxrubric.toy import digits_task as task
from jaxrubric.toy import final_eval, world


def test_a_paired_lead_is_scipys_paired_t_statistic():
    rng = np.random.default_rng(0)
    shared = rng.uniform(0, 1, 200)  # each question's difficulty, common to both runs
    a, b = shared + rng.normal(0.02, 0.05, 200), shared + rng.normal(0, 0.05, 200)
    lead = final_eval.paired_lead(a, b)
    t = stats.ttest_rel(a, b).statistic
    assert lead.mean == pytest.approx(np.mean(a - b), abs=1e-12)
    assert lead.in_ses == pytest.approx(t, rel=1e-9)
    # Pairing removes the questions' common spread: the unpaired error is far larger here.
    unpaired = math.hypot(*(final_eval.mean_and_se(x)[1] for x in (a, b)))
    assert lead.se < unpaired / 3


def test_a_paired_lead_needs_two_equal_lists_of_questions():
    with pytest.raises(ValueError, match="equal-length"):
        final_eval.paired_lead([0.5, 0.6, 0.7], [0.5, 0.6])
    with pytest.raises(ValueError, match=">= 2 questions"):
        final_eval.paired_lead([0.5], [0.4])
    assert final_eval.Lead(0.01, 0.0).in_ses == math.inf


def test_summarize_keeps_each_runs_quality_and_the_asked_leads():
    per_question = {"coevolve": [1.0, 0.5, 0.75], "frozen": [0.5, 0.5, 0.5],
                    "oracle": [1.0, 1.0, 0.5]}
    out = final_eval.summarize(per_question, world.LEADS, samples=16)
    assert out["samples"] == 16 and out["questions"] == 3
    assert out["quality"] == {"coevolve": 0.75, "frozen": 0.5, "oracle": pytest.approx(5 / 6)}
    assert out["quality_se"]["frozen"] == 0.0
    # Pairs with a run the summary lacks (static) are left out.
    assert set(out["leads"]) == {"coevolve-frozen", "oracle-frozen"}
    assert out["leads"]["coevolve-frozen"] == {
        "mean": 0.25, "se": pytest.approx(np.std([0.5, 0.0, 0.25], ddof=1) / math.sqrt(3))}


@pytest.fixture(scope="module")
def tiny_policies(tmp_path_factory):
    """The toy tokenizer and two tiny random policies saved as HF checkpoints (a and its copy
    under another name, and b with other weights)."""
    root = tmp_path_factory.mktemp("final_eval")
    tokenizer = jaxrubric.load_tokenizer(task.build_tokenizer(root / "tokenizer"))
    mesh = shd.make_mesh({"fsdp": -1})
    paths = {}
    for name, seed in (("a", 0), ("a_copy", 0), ("b", 1)):
        model = world.new_model(tokenizer, mesh, seed, hidden=16, layers=1)
        paths[name] = jaxrubric.save_pretrained(model, root / name)
    return tokenizer, paths


def test_one_key_gives_every_checkpoint_the_same_draws(tiny_policies):
    tokenizer, paths = tiny_policies
    questions = [task.make_prompt(random.Random(i))[0] for i in range(6)]
    prompts = [world.policy_prompt(tokenizer, q) for q in questions]

    def quality(name: str, seed: int) -> list[float]:
        return final_eval.per_question_quality(
            paths[name], tokenizer, questions, prompts, task.quality, samples=4, seed=seed,
            max_new_tokens=world.POLICY_TOKENS)

    def answers(name: str, seed: int) -> list[list[str]]:
        return final_eval.sample_answers(paths[name], tokenizer, prompts, 4, seed,
                                         world.POLICY_TOKENS)

    # The same weights under the same key: the same answers, so a lead of exactly 0 with no
    # noise; another key draws other answers.
    assert answers("a", 3) == answers("a_copy", 3)
    assert final_eval.paired_lead(quality("a", 3), quality("a_copy", 3)) == final_eval.Lead(0, 0)
    assert answers("a", 3) != answers("a", 4)
    assert len(answers("b", 3)) == 6 and all(len(row) == 4 for row in answers("b", 3))
