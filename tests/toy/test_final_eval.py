"""The toy worlds' final evaluation: paired leads against scipy's paired t test, common random
numbers (one key: the same draws for every checkpoint), and the world's stage around them."""

from __future__ import annotations

import json
import math
import random

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from scipy import stats

import jaxrubric
from jaxrubric import sharding as shd
from jaxrubric.toy import digits_task as task
from jaxrubric.toy import final_eval, world_report, world_runs
from jaxrubric.toy.supervised import new_model
from jaxrubric.toy.tokens import policy_prompt
from jaxrubric.toy.workdir import prepare_workdir
from jaxrubric.toy.world_config import LEADS, POLICY_TOKENS, RUNS, ToyWorldConfig


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
    # Two runs that agree everywhere lead by nothing, not by infinitely many errors.
    assert final_eval.paired_lead([0.5, 0.7], [0.5, 0.7]).in_ses == 0.0
    assert final_eval.Lead(0.01, 0.0).in_ses == math.inf


def test_final_summary_keeps_each_runs_quality_and_the_asked_leads():
    per_question = {"coevolve": [1.0, 0.5, 0.75], "frozen": [0.5, 0.5, 0.5],
                    "oracle": [1.0, 1.0, 0.5]}
    out = final_eval.final_summary(per_question, LEADS, samples=16)
    assert out["samples"] == 16 and out["questions"] == 3
    assert out["quality"] == {"coevolve": 0.75, "frozen": 0.5, "oracle": pytest.approx(5 / 6)}
    assert out["quality_se"]["frozen"] == 0.0
    # Pairs with a run the summary lacks (static) are left out.
    assert set(out["leads"]) == {"coevolve-frozen", "oracle-frozen"}
    assert out["leads"]["coevolve-frozen"] == {
        "mean": 0.25, "se": pytest.approx(np.std([0.5, 0.0, 0.25], ddof=1) / math.sqrt(3))}


@pytest.fixture(scope="module")
def tiny_policies(tmp_path_factory):
    """The toy tokenizer and two tiny random policies saved as HF checkpoints: "a", and "near"
    (a's weights nudged by noise of 2% of their spread)."""
    root = tmp_path_factory.mktemp("final_eval")
    tokenizer = jaxrubric.load_tokenizer(task.build_tokenizer(root / "tokenizer"))
    model = new_model(tokenizer, shd.make_mesh({"fsdp": -1}), 0, hidden=16, layers=1)
    paths = {"a": jaxrubric.save_pretrained(model, root / "a")}
    graph, params, rest = nnx.split(model, nnx.Param, ...)
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(1), len(leaves))
    nudged = [x + 0.02 * jnp.std(x) * jax.random.normal(k, x.shape, x.dtype)
              for x, k in zip(leaves, keys)]
    near = nnx.merge(graph, jax.tree.unflatten(tree, nudged), rest)
    paths["near"] = jaxrubric.save_pretrained(near, root / "near")
    return tokenizer, paths


def test_one_key_gives_every_checkpoint_the_same_draws(tiny_policies):
    tokenizer, paths = tiny_policies
    questions = [task.make_prompt(random.Random(i))[0] for i in range(16)]
    prompts = [policy_prompt(tokenizer, q) for q in questions]

    def answers(name: str, seed: int) -> list[str]:
        rows = final_eval.sample_answers(paths[name], tokenizer, prompts, samples=4, seed=seed,
                                         max_new_tokens=POLICY_TOKENS)
        assert len(rows) == 16 and all(len(row) == 4 for row in rows)
        return [a for row in rows for a in row]

    def same(x: list[str], y: list[str]) -> float:
        return float(np.mean([a == b for a, b in zip(x, y)]))

    # Two nearby policies under one key write the same answer wherever their distributions
    # barely differ (common random numbers); under two keys, almost never (random strings of
    # up to 16 characters).
    assert same(answers("a", 3), answers("a", 3)) == 1.0
    shared, apart = same(answers("a", 3), answers("near", 3)), same(answers("a", 3),
                                                                    answers("near", 4))
    assert shared >= 0.5 and apart <= 0.1, (shared, apart)
    quality = {name: final_eval.per_question_quality(
        paths[name], tokenizer, questions, prompts, task.quality, samples=4, seed=3,
        max_new_tokens=POLICY_TOKENS) for name in ("a", "near")}
    lead = final_eval.paired_lead(quality["a"], quality["near"])
    unpaired = math.hypot(*(final_eval.mean_and_se(q)[1] for q in quality.values()))
    assert lead.se < unpaired, (lead, unpaired)


def test_the_worlds_final_stage_samples_every_run_with_one_key(tmp_path, monkeypatch):
    """`world_report.final_evaluation` exports each run's policy and evaluates it with the same key
    (the world's seed + FINAL_KEY_OFFSET), writes the per-question qualities, and the summary
    reads them; a rerun evaluates the current checkpoints again."""
    cfg = ToyWorldConfig(eval_batch_size=4, final_samples=3, seed=5)
    workdir, _ = prepare_workdir(tmp_path, cfg)
    world_runs.write_data(workdir, cfg)
    calls = []

    def export(run_dir, role, out, oracle):
        assert role == "policy" and oracle is task.oracle_reward
        return out

    def per_question_quality(model_dir, tokenizer, questions, prompts, quality, *, samples,
                             seed, max_new_tokens):
        calls.append((model_dir.name, samples, seed, max_new_tokens, len(questions)))
        score = {"coevolve": 0.9, "frozen": 0.8, "static": 0.6, "oracle": 0.95}
        return [score[model_dir.name] + 0.01 * i for i in range(len(questions))]

    monkeypatch.setattr("jaxrubric.train.export", export)
    monkeypatch.setattr(final_eval, "per_question_quality", per_question_quality)
    world_report.final_evaluation(workdir, cfg)
    key = 5 + world_report.FINAL_KEY_OFFSET
    assert calls == [(run, 3, key, POLICY_TOKENS, 4) for run in RUNS]
    saved = json.loads((workdir / world_report.FINAL_FILE).read_text())
    assert saved["samples"] == 3 and saved["seed"] == key
    assert saved["per_question"]["frozen"] == pytest.approx([0.8, 0.81, 0.82, 0.83])
    world_report.final_evaluation(workdir, cfg)
    assert len(calls) == 2 * len(RUNS)
    # The summary's leads come from the file: a constant per-question difference of 0.1.
    monkeypatch.setattr(world_report, "quality_curves", lambda w, runs: {
        r: [{"round": 0, **dict.fromkeys(world_report.CURVES, 0.5)}] for r in runs})
    monkeypatch.setattr(world_report, "plot", lambda *args: None)
    final = world_report.summarize(workdir, cfg)["final"]
    assert final["leads"]["coevolve-frozen"]["mean"] == pytest.approx(0.1)
    assert final["leads"]["coevolve-frozen"]["se"] == pytest.approx(0.0, abs=1e-12)
    assert final["quality"]["oracle"] == pytest.approx(0.965)
