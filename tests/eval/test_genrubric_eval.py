"""GenRubric's held-out evaluation in the training loop (`jaxrubric.eval.expert_agreement`):
rubrics written for held-out HealthBench rows every `eval_every` rounds, agreement with the
expert rubric logged, and every logged number recomputed here with scipy from the score
matrices the evaluation wrote (`eval_scores.jsonl`)."""

from __future__ import annotations

import json
import math
from collections import defaultdict

import numpy as np
import pytest
from scipy import stats
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from helpers import ROOT
from jaxrubric import train as train_module
from jaxrubric.cli import main
from jaxrubric.config import load_config
from jaxrubric.data import DataError
from jaxrubric.eval.expert_agreement import agreement_scalars
from jaxrubric.eval.metrics import AGREEMENT_METRICS
from jaxrubric.train import EVAL_SCORES, CoevolveTask
from jaxrubric.train_loop import read_eval_history

pytestmark = pytest.mark.usefixtures("datasets_cache")

CONFIG = ROOT / "configs" / "tiny_genrubric.py"
ROWS = ROOT / "tests" / "data" / "healthbench_oss_eval_30examples.jsonl"
RUNS = 3
QUERIES = 4
# 4 held-out queries on a mesh that splits the batch 4 ways; short rubrics and answers; a
# generator learning rate at which two rounds change what it writes.
OVERRIDES = [f"data.eval={ROWS}", f"data.eval_batch_size={QUERIES}",
             f"data.eval_rubric_runs={RUNS}", "eval_every=1", "mesh.fsdp=4", "mesh.tensor=2",
             "round.response_tokens=8", "rubric.max_items=2", "optim.generator_lr=0.01"]
TOL = 1e-6


# ------------------------------------------------------------------ the reference (scipy)
def _sign(x: float) -> int:
    return 0 if abs(x) <= TOL else (1 if x > 0 else -1)


def _reference(generated: np.ndarray, expert: np.ndarray) -> dict[str, float]:
    """One (query, run): scipy's Spearman and Kendall tau-b (NaN for a constant vector), Top-1
    and 3-way pairwise accuracy written out from their definitions."""
    n = len(expert)
    top_g = generated >= generated.max() - TOL
    top_e = expert >= expert.max() - TOL
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    constant = np.ptp(generated) == 0 or np.ptp(expert) == 0
    return {
        "spearman": math.nan if constant else stats.spearmanr(generated, expert).statistic,
        "kendall_tau_b": math.nan if constant else stats.kendalltau(
            generated, expert, variant="b").statistic,
        "top1_consistency": float(np.all(top_e[top_g])),
        "pairwise_accuracy": float(np.mean([
            _sign(generated[i] - generated[j]) == _sign(expert[i] - expert[j])
            for i, j in pairs]))}


def _reference_table(queries: list[tuple[list[np.ndarray | None], np.ndarray]],
                     failures: bool) -> dict[str, float]:
    """Per query and run, averaged over the query's runs, then over queries; an invalid run
    (None) is left out, or scores 0 with `failures`; undefined values are left out."""
    out = {}
    for name in AGREEMENT_METRICS:
        per_query, left_out = [], 0
        for runs, expert in queries:
            values = [0.0 if v is None else _reference(v, expert)[name]
                      for v in runs if v is not None or failures]
            values = [v for v in values if not math.isnan(v)]
            left_out += len(runs) - len(values)
            if values:
                per_query.append(np.mean(values))
        if per_query:
            out[name] = float(np.mean(per_query))
        out[f"{name}_skipped"] = float(len(queries) - len(per_query))
        out[f"{name}_left_out"] = float(left_out)
    return out


def _reference_scalars(rows: list[dict], runs: int) -> dict[str, float]:
    """Every agreement scalar of one evaluation, recomputed from its `eval_scores.jsonl` rows."""
    sampled, greedy = [], []
    for row in rows:
        scores, valid = np.asarray(row["scores"], np.float64), row["valid"]
        assert len(valid) == runs + 2 and valid[-1], "the expert rubric is the last, valid group"
        expert = scores[:, -1]
        sampled.append(([scores[:, g] if valid[g] else None for g in range(runs)], expert))
        greedy.append(([scores[:, runs] if valid[runs] else None], expert))
    out = {}
    for table, queries, failures in (("agreement", sampled, False),
                                     ("agreement_with_failures", sampled, True),
                                     ("agreement_greedy", greedy, False)):
        out |= {f"{table}/{k}": v for k, v in _reference_table(queries, failures).items()}
    invalid = sum(not row["valid"][g] for row in rows for g in range(runs))
    out |= {"queries": float(len(rows)), "responses": float(sum(len(r["scores"]) for r in rows)),
            "rubrics/sampled": float(runs * len(rows)), "rubrics/invalid": float(invalid),
            "rubrics/greedy_invalid": float(sum(not row["valid"][runs] for row in rows))}
    return out


def _assert_matches(logged: dict[str, float], reference: dict[str, float], prefix: str = ""):
    for key, want in reference.items():
        assert prefix + key in logged, f"{prefix + key} missing (reference {want})"
        np.testing.assert_allclose(logged[prefix + key], want, rtol=1e-9, atol=1e-12,
                                   err_msg=prefix + key)
    means = {k for k in logged if k.startswith(prefix + "agreement")
             and not k.endswith(("_se", "_skipped", "_left_out"))}
    assert means == {prefix + k for k in reference if k.startswith("agreement")
                     and not k.endswith(("_skipped", "_left_out"))}, "a mean the reference lacks"


# ------------------------------------------------------------------ the host metrics alone
def test_agreement_scalars_equal_scipy_with_invalid_constant_and_short_queries():
    """A hand-made evaluation: 3 queries with 2 runs, ties, an invalid rubric, a constant
    score vector (Spearman and tau undefined), a query with 3 of the 4 completion slots."""
    runs = 2
    scores = np.array([
        [[0.5, 0.2, 0.5, 1.0], [0.1, 0.2, 0.1, 0.5], [0.3, 0.2, 0.9, -0.2], [0.0, 0.0, 0.0, 0.7]],
        [[1.0, 0.0, 1.0, 0.4], [0.0, 0.0, 0.5, 0.4], [0.5, 0.0, 0.0, 0.9], [0.2, 0.0, 0.2, 0.1]],
        [[0.7, 0.3, 0.3, 0.2], [0.1, 0.3, 0.6, 0.6], [0.4, 0.3, 0.2, 0.1], [9.0, 9.0, 9.0, 9.0]],
    ])
    valid = np.array([[True, True, True, True], [True, False, True, True],
                      [False, True, False, True]])
    num_responses = [4, 4, 3]
    logged = agreement_scalars(scores, valid, num_responses, runs)
    rows = [{"valid": valid[b].tolist(), "scores": scores[b, :n].tolist()}
            for b, n in enumerate(num_responses)]
    reference = _reference_scalars(rows, runs)
    _assert_matches(logged, reference)
    # Query 1's invalid run, query 2's invalid and constant ones (query 2 is skipped).
    assert logged["agreement/spearman_left_out"] == 3
    assert logged["agreement/spearman_skipped"] == 1
    assert logged["agreement_with_failures/spearman_left_out"] == 1  # the constant one only
    assert logged["rubrics/valid_rate"] == pytest.approx(4 / 6)
    assert {"agreement/spearman_se", "agreement_greedy/top1_consistency_se"} <= set(logged)


# ------------------------------------------------------------------ in the training loop
@pytest.mark.slow
def test_training_logs_the_held_out_agreement_that_the_score_matrices_give(tmp_path, capsys):
    workdir = tmp_path / "run"
    assert main(["train", "--config", str(CONFIG), "--workdir", str(workdir), "--config.rounds=2",
                 *(f"--config.{o}" for o in OVERRIDES)]) == 0
    out = capsys.readouterr().out
    assert f"held-out GenRubric evaluation on {QUERIES} queries" in out
    assert "left out rows [0, 2]" in out  # rows 0 and 2 have no completions

    history = {entry["round"]: entry for entry in read_eval_history(workdir)}
    assert sorted(history) == [0, 1, 2]
    by_round = defaultdict(list)
    for line in (workdir / EVAL_SCORES).read_text().splitlines():
        row = json.loads(line)
        by_round[row["round"]].append(row)
    assert sorted(by_round) == [0, 1, 2]
    experts, written = [], []
    for round_, rows in sorted(by_round.items()):
        assert [r["row"] for r in rows] == [1, 3, 4, 5]  # the first 4 rows with 2+ completions
        assert [len(r["scores"]) for r in rows] == [5, 5, 5, 5]
        logged = history[round_]
        for name in AGREEMENT_METRICS:  # the four metrics, and their counts
            assert {f"eval/agreement/{name}", f"eval/agreement/{name}_skipped",
                    f"eval/agreement/{name}_left_out"} <= set(logged), (round_, name)
        _assert_matches(logged, _reference_scalars(rows, RUNS), prefix="eval/")
        for r in rows:  # the written rubrics, as text: a malformed group has no positive item
            assert len(r["rubrics"]) == RUNS + 1
            for group, valid in zip(r["rubrics"], r["valid"]):
                assert all(isinstance(w, int) and w != 0 and c for w, c in group)
                assert valid == any(w > 0 for w, _ in group), (group, valid)
        experts.append([[s[-1] for s in r["scores"]] for r in rows])
        written.append([[s[:-1] for s in r["scores"]] + [r["valid"]] for r in rows])
    # The expert rubric, the completions and the verifier are fixed: its column never moves;
    # the rubrics are written by the generator of that round.
    assert experts[0] == experts[1] == experts[2]
    assert written[0] != written[2]

    events = EventAccumulator(str(workdir / "tensorboard"))
    events.Reload()
    for name in AGREEMENT_METRICS:
        for tag in (f"eval/agreement/{name}", f"eval/agreement/{name}_skipped",
                    f"eval/agreement_with_failures/{name}",
                    f"eval/agreement_greedy/{name}_skipped"):
            logged = events.Scalars(tag)
            assert [e.step for e in logged] == [0, 1, 2], tag
            np.testing.assert_allclose([e.value for e in logged],
                                       [history[r][tag] for r in (0, 1, 2)], rtol=1e-6)
    assert [e.step for e in events.Scalars("eval/rubrics/invalid")] == [0, 1, 2]


# ------------------------------------------------------------------ bad rows, before models
def _no_models(monkeypatch):
    def role_model(*args, **kwargs):
        raise AssertionError("a model was loaded before the held-out rows were checked")

    monkeypatch.setattr(train_module, "role_model", role_model)


def test_a_bad_held_out_row_names_file_row_and_field_before_any_model_loads(
        tmp_path, monkeypatch):
    rows = [json.loads(line) for line in ROWS.read_text().splitlines()[:4]]
    rows[2]["rubrics"][1]["points"] = "ten"
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(json.dumps(r) + "\n" for r in rows))
    _no_models(monkeypatch)
    config = load_config(CONFIG, [*OVERRIDES, f"data.eval={bad}"])
    with pytest.raises(DataError, match=rf"{bad} row 2: field 'rubrics\[1\]\.points' must be "
                                        "an integer, got 'ten'"):
        CoevolveTask(config)


def test_too_few_rankable_held_out_rows_is_an_error_before_any_model_loads(
        tmp_path, monkeypatch):
    short = tmp_path / "short.jsonl"
    short.write_text("".join(line + "\n" for line in ROWS.read_text().splitlines()[:4]))
    _no_models(monkeypatch)
    config = load_config(CONFIG, [*OVERRIDES, f"data.eval={short}"])
    with pytest.raises(ValueError, match=r"2 rows have >= 2 completions .* needs 4 "
                                         r"\(config.data.eval_batch_size\)\. Rows without: "
                                         r"\[0, 2\]"):
        CoevolveTask(config)


def test_the_number_of_runs_is_checked_with_the_config():
    from jaxrubric.config import ConfigFileError

    with pytest.raises(ConfigFileError, match="config.data.eval_rubric_runs must be >= 1"):
        load_config(CONFIG, [*OVERRIDES, "data.eval_rubric_runs=0"])
    assert load_config(ROOT / "configs" / "tiny_dynamic_rubric.py").data.eval_rubric_runs == 4
