"""`jaxrubric evaluate --method dynamic_rubric`: preference data read into candidate sets,
and a run on real Prometheus MT-Bench rows and on A/B rows with tiny random checkpoints, its
metrics recomputed with NumPy and SciPy from the written verdicts."""

import collections
import contextlib
import io
import json
from fractions import Fraction
from pathlib import Path

import datasets
import numpy as np
import pytest
import scipy.stats
from test_evaluate import _read, _run, checkpoints
from tokenizer_fixtures import byte_level_bpe

from jaxrubric.data import DataError, load_candidate_sets
from jaxrubric.data.preference import Candidate, CandidateSet
from jaxrubric.eval import preference as pref
from jaxrubric.rubric.grammar import POSITIVE_WEIGHTS
from jaxrubric.rubric.templates import dynamic_rubric_generator_template

PROMETHEUS = Path(__file__).parents[1] / "data" / "prometheus_mt_bench_eval_48rows.json"
SMALL = ["--max-items", "3", "--max-item-tokens", "8", "--max-prompt-tokens", "32",
         "--max-response-tokens", "24", "--batch-size", "2", "--temperature", "1.0",
         "--no-progress"]

datasets.disable_progress_bars()


pytestmark = pytest.mark.usefixtures("datasets_cache")


def _prometheus_rows():
    return json.loads(PROMETHEUS.read_text(encoding="utf-8"))


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _conversation(row):
    """The conversation section of a Prometheus row's grading prompt."""
    before, _, rest = row["instruction"].partition("###The instruction to evaluate:\n")
    assert before and rest
    return rest[:rest.index("\n\n###Response to evaluate:\n")]


# ------------------------------------------------------------------------------ data
def test_prometheus_rows_become_ranked_sets():
    rows = _prometheus_rows()
    loaded = load_candidate_sets(PROMETHEUS)
    assert loaded.format == "prometheus" and loaded.skipped == 0
    assert [s.id for s in loaded.records] == [str(i) for i in range(81, 93)]
    for s in loaded.records:
        assert len(s.candidates) == 4
        prompt = s.messages[0]["content"]
        assert prompt.endswith("\n\nAssistant:")
        for c in s.candidates:
            row = rows[c.row]
            assert str(row["idx"]) == s.id
            # The verifier sees each candidate after its own conversation, verbatim.
            assert prompt + c.context == _conversation(row)
            assert c.text in row["instruction"]
            assert c.reference_score == pytest.approx(np.mean(row["gpt4_score"]))
            better = sum(Fraction(sum(rows[o.row]["gpt4_score"]), len(rows[o.row]["gpt4_score"]))
                         > Fraction(sum(row["gpt4_score"]), len(row["gpt4_score"]))
                         for o in s.candidates)
            assert c.rank == 1 + better
    # idx 81: GPT-4 means 14/3, 5, 5, 4: two tied best.
    assert loaded.records[0].ranks == [3, 1, 1, 4]


def test_ab_and_ranked_rows(tmp_path):
    ab = load_candidate_sets(_write(tmp_path / "ab.jsonl", [
        {"prompt": "Say hi.", "response_a": "Hi!", "response_b": "Go away.", "label": "a"},
        {"prompt": "Say bye.", "response_a": "No.", "response_b": "Bye!", "label": "B", "id": 7}]))
    assert ab.format == "ab" and [s.id for s in ab.records] == ["0", "7"]
    assert [s.ranks for s in ab.records] == [[1, 2], [2, 1]]
    assert [c.text for c in ab.records[1].candidates] == ["No.", "Bye!"]
    ranked = load_candidate_sets(_write(tmp_path / "ranked.jsonl", [
        {"prompt": "Q", "answers": [{"answer": "x", "rank": 2}, {"answer": "y", "rank": 1},
                                    {"answer": "z", "rank": 2}]}]))
    assert ranked.format == "ranked"
    assert [(c.text, c.rank) for c in ranked.records[0].candidates] == [("y", 1), ("x", 2),
                                                                        ("z", 2)]


def test_bad_rows_are_named_or_skipped(tmp_path):
    path = _write(tmp_path / "ab.jsonl", [
        {"prompt": "Say hi.", "response_a": "Hi!", "response_b": "Go away.", "label": "a"},
        {"prompt": "Say bye.", "response_a": "No.", "response_b": "Bye!", "label": 1}])
    message = (f"{path} row 1: field 'label' must be 'a' or 'b' (the preferred response), "
               "got 1")
    with pytest.raises(DataError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        load_candidate_sets(path)
    loaded = load_candidate_sets(path, skip_bad_rows=True)
    assert len(loaded.records) == 1 and loaded.problems == [message]

    rows = _prometheus_rows()[:8]
    rows[5]["gpt4_score"] = [4, "x", 5]
    path = tmp_path / "prometheus.json"
    path.write_text(json.dumps(rows), encoding="utf-8")
    with pytest.raises(DataError, match=f"^{path} row 5: field 'gpt4_score\\[1\\]' must be an "
                                        "integer, got 'x'$"):
        load_candidate_sets(path)
    # Skipped, the row leaves its set with 3 candidates: a set of another size, skipped too.
    loaded = load_candidate_sets(path, skip_bad_rows=True)
    assert [s.id for s in loaded.records] == ["81"] and loaded.skipped == 2
    assert loaded.problems[1] == (f"{path} row 4: field 'idx' gives a set of 3 rows, but 1 of "
                                  "the 2 sets have 4 (the generator's template is built for one "
                                  "set size)")


def test_sets_of_another_size_and_unknown_formats(tmp_path):
    answers = [{"answer": t, "rank": r} for t, r in (("a", 1), ("b", 2), ("c", 3))]
    path = _write(tmp_path / "ranked.jsonl", [{"prompt": "P", "answers": answers}] * 2
                  + [{"prompt": "P", "answers": answers[:2]}])
    with pytest.raises(DataError, match=f"^{path} row 2: field 'answers' gives a set of 2 "
                                        "answers, but 2 of the 3 sets have 3"):
        load_candidate_sets(path)
    assert len(load_candidate_sets(path, skip_bad_rows=True).records) == 2
    path = _write(tmp_path / "other.jsonl", [{"question": "Q"}])
    with pytest.raises(DataError, match="cannot tell the format from the fields"):
        load_candidate_sets(path)
    with pytest.raises(DataError, match="row 0: field 'prompt' is missing or null"):
        load_candidate_sets(path, format="ab")


# ------------------------------------------------------------------------------ pieces
def test_generator_sees_the_set_and_the_verifier_each_candidate_in_its_conversation():
    tok = byte_level_bpe(use_regex=False)
    candidate_set = CandidateSet("s", [{"role": "user", "content": "Which fruit?"}], [
        Candidate(f"answer number {k}", k + 1, 0, context=f" [ctx {k}] ") for k in range(5)])
    order = pref.shown_order(0, 3, 5)
    assert sorted(order) == list(range(5)) and order != list(range(5))
    template = dynamic_rubric_generator_template(tok, 5, max_items=3)
    config = pref.PreferenceConfig(max_items=3)
    ids = pref._generator_prompt(tok, template, config, candidate_set, order,
                                 collections.Counter())
    assert tok.decode(ids, skip_special_tokens=False) == template.render(
        "Which fruit?", *(f" [ctx {k}] answer number {k}" for k in order))
    query = pref._query(tok, config, candidate_set, collections.Counter())
    assert [tok.decode(p) for p in query.prompts] == [f"Which fruit? [ctx {k}] "
                                                      for k in range(5)]
    assert [tok.decode(r) for r in query.responses] == [f"answer number {k}" for k in range(5)]


def test_ties_count_half_and_listwise_agrees_with_scipy():
    sets = [CandidateSet(str(i), [{"role": "user", "content": "q"}],
                         [Candidate("a", ra, 0), Candidate("b", rb, 0)])
            for i, (ra, rb) in enumerate([(1, 2), (1, 2), (2, 1), (1, 2)])]
    scores = [np.array([0.5, 0.5]), np.array([1.0, 0.2]), np.array([1.0, 0.2]), None]
    metrics = pref.preference_metrics(sets, scores, format="ab")
    assert metrics["pairwise"] == {"accuracy": pytest.approx(0.5), "pairs": 3, "ties": 1,
                                   "sets_without_pairs": 0}
    assert metrics["sets"] == {"total": 4, "scored": 3, "no_counting_rubric": 1}
    assert "listwise" not in metrics

    ranks = [[1, 2, 2, 4], [2, 1, 3, 3], [1, 1, 1, 1]]
    lists = [CandidateSet(str(i), [{"role": "user", "content": "q"}],
                          [Candidate(str(k), r, 0) for k, r in enumerate(rs)])
             for i, rs in enumerate(ranks)]
    scores = [np.array([0.9, 0.1, 0.4, 0.4]), np.array([0.5, 0.5, 0.0, 1.0]),
              np.array([0.1, 0.2, 0.3, 0.4])]
    metrics = pref.preference_metrics(lists, scores, format="ranked")
    ordered = list(zip(scores, ranks))[:2]  # set 2's reference is constant: no correlation
    rho = [scipy.stats.spearmanr(s, -np.array(r)).statistic for s, r in ordered]
    tau = [scipy.stats.kendalltau(s, -np.array(r)).statistic for s, r in ordered]
    assert metrics["listwise"]["spearman"] == {"mean": pytest.approx(np.mean(rho)), "n": 2,
                                               "skipped": 1}
    assert metrics["listwise"]["kendall_tau_b"]["mean"] == pytest.approx(np.mean(tau))
    # Top-1: set 0 right; set 1 ties 0.5s but 1.0 wins (rank 3): wrong; set 2: all tied, right.
    assert metrics["listwise"]["top1"] == {"mean": pytest.approx(2 / 3), "n": 3, "skipped": 0}
    # Pairs the ranks order: 5 in set 0 (3 right, 1 wrong, 0.4 vs 0.4 across ranks 2 and 4 a
    # tie), 5 in set 1 (2 right, 2 wrong, 1 tie), none in set 2.
    assert metrics["pairwise"] == {"accuracy": pytest.approx(0.6), "pairs": 10, "ties": 2,
                                   "sets_without_pairs": 1}


# ------------------------------------------------------------------------------ runs
def _recompute(run, raw_reference):
    """Candidate scores from verdicts.jsonl (sum(w v) / sum(w) per counting rubric, averaged
    over the set's counting rubrics), and the metrics against ``raw_reference``: set id ->
    reference scores per candidate (higher is better)."""
    complete = {(r["id"], r["rubric"]): r["complete"] for r in run["rubrics"]}
    num, den = collections.defaultdict(float), collections.defaultdict(float)
    for v in run["verdicts"]:
        key = (v["id"], v["rubric"], v["response"])
        num[key] += v["weight"] * v["verdict"]
        den[key] += v["weight"]
    per_set = collections.defaultdict(lambda: collections.defaultdict(list))
    for (set_id, rubric, k), total in den.items():
        if complete[(set_id, rubric)] and total > 0:
            per_set[set_id][k].append(num[(set_id, rubric, k)] / total)
    scores = {s: np.array([np.mean(by_k[k]) for k in range(len(raw_reference[s]))])
              for s, by_k in per_set.items()}
    chosen, rejected, rho, tau, top1 = [], [], [], [], []
    for set_id, s in scores.items():
        ref = np.asarray(raw_reference[set_id], np.float64)
        for i in range(len(ref)):
            for j in range(len(ref)):
                if ref[i] > ref[j]:
                    chosen.append(s[i])
                    rejected.append(s[j])
        if np.ptp(s) > 0 and np.ptp(ref) > 0:
            rho.append(scipy.stats.spearmanr(s, ref).statistic)
            tau.append(scipy.stats.kendalltau(s, ref).statistic)
        top1.append(float(np.all(ref[s >= s.max() - 1e-6] == ref.max())))
    diff = np.array(chosen) - np.array(rejected)
    accuracy = np.mean(np.where(np.abs(diff) <= 1e-6, 0.5, diff > 0))
    return scores, accuracy, len(chosen), rho, tau, top1


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """Tiny random checkpoints; this verifier seed's p_yes spreads around 0.5 (about 0.2-0.7)
    on these rows, so verdicts differ between candidates and the metrics have something to
    measure (with seed 2 nearly every verdict is yes)."""
    return checkpoints(tmp_path_factory.mktemp("preference"), verifier_seed=6)


@pytest.fixture(scope="module")
def prometheus_run(folders, tmp_path_factory):
    """Six MT-Bench questions (24 rows), G=2 rubrics per set, batches of 2 sets. The budget of
    24 rubric tokens stops some rubrics before they end: those do not count, and some sets have
    no counting rubric."""
    root = tmp_path_factory.mktemp("prometheus")
    rows = _prometheus_rows()[:24]
    data = root / "mt_bench.json"
    data.write_text(json.dumps(rows), encoding="utf-8")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        rc = _run(["--method", "dynamic_rubric", "--data", data, "--generator",
                   folders["generator"], "--verifier", folders["verifier"], "--out", root / "out",
                   "--num-rubrics", "2", "--max-new-tokens", "24", "--seed", "4", *SMALL])  # a seed whose sets cover both cases
    assert rc == 0
    return rows, {**_read(root / "out"), "printed": printed.getvalue()}


@pytest.mark.slow
def test_prometheus_metrics_are_recomputed_from_the_verdicts(prometheus_run):
    rows, run = prometheus_run
    by_set = collections.defaultdict(list)
    for row in rows:
        by_set[str(row["idx"])].append(float(np.mean(row["gpt4_score"])))
    scores, accuracy, pairs, rho, tau, top1 = _recompute(run, by_set)
    metrics = run["metrics"]
    assert metrics["format"] == "prometheus" and metrics["candidates_per_set"] == 4
    assert metrics["sets"] == {"total": 6, "scored": len(scores), "no_counting_rubric":
                               6 - len(scores)}
    assert 3 <= len(scores) < 6, "a few sets, not all, should have a counting rubric"
    assert len(rho) >= 2, "too few sets with distinct scores to test the correlations"
    assert metrics["pairwise"]["pairs"] == pairs > 0
    assert metrics["pairwise"]["accuracy"] == pytest.approx(accuracy, abs=1e-6)
    listwise = metrics["listwise"]
    assert listwise["spearman"]["mean"] == pytest.approx(np.mean(rho), abs=1e-6)
    assert listwise["spearman"]["n"] == len(rho)
    assert listwise["kendall_tau_b"]["mean"] == pytest.approx(np.mean(tau), abs=1e-6)
    assert listwise["top1"]["mean"] == pytest.approx(np.mean(top1), abs=1e-6)
    assert listwise["top1"]["n"] == len(scores)
    for s in run["scores"]:
        expected = scores.get(s["id"])
        assert s["score"] == (None if expected is None else pytest.approx(expected[s["response"]],
                                                                          abs=1e-6))
    assert "pairwise preference accuracy" in run["printed"]


def test_prometheus_run_writes_every_rubric_and_verdict(prometheus_run):
    rows, run = prometheus_run
    assert [(r["id"], r["rubric"]) for r in run["rubrics"]] == [
        (str(i), g) for i in range(81, 87) for g in range(2)]
    for r in run["rubrics"]:
        assert all(i["weight"] in POSITIVE_WEIGHTS for i in r["items"]) and len(r["items"]) <= 3
        assert r["counted"] == (r["complete"] and len(r["items"]) > 0)
    assert any(r["items"] and not r["counted"] for r in run["rubrics"])
    count = collections.Counter((v["id"], v["rubric"]) for v in run["verdicts"])
    assert count == {(r["id"], r["rubric"]): 4 * len(r["items"]) for r in run["rubrics"]
                     if r["items"]}
    assert all(v["verdict"] == (v["p_yes"] > 0.5) for v in run["verdicts"])
    per_set = collections.defaultdict(list)
    for s in run["scores"]:
        per_set[s["id"]].append(s)
        assert rows[s["row"]]["idx"] == int(s["id"])
    for candidates in per_set.values():
        assert sorted(c["position"] for c in candidates) == [1, 2, 3, 4]
    positions = [[c["position"] for c in cs] for cs in per_set.values()]
    assert any(p != [1, 2, 3, 4] for p in positions), "candidates are shown in a shuffled order"
    assert run["metrics"]["truncated"]["verifier_prompts"] == 24


@pytest.mark.slow
def test_ab_run_with_a_bad_row(folders, tmp_path, capsys):
    rows = _prometheus_rows()
    ab = [{"prompt": _conversation(rows[i]), "response_a": f"Sure. {i}", "response_b":
           f"No {i}.", "label": "ab"[i % 2]} for i in range(4)]
    data = _write(tmp_path / "ab.jsonl", ab[:2] + [{**ab[2], "response_b": ""}] + ab[3:])
    argv = ["--method", "dynamic_rubric", "--data", data, "--generator", folders["generator"],
            "--verifier", folders["verifier"], "--out", tmp_path / "out", "--num-rubrics", "3",
            *SMALL]
    assert _run(argv) == 2
    assert f"{data} row 2: field 'response_b' must not be empty" in capsys.readouterr().err
    assert _run([*argv, "--skip-bad-rows"]) == 0
    run = _read(tmp_path / "out")
    metrics = run["metrics"]
    assert metrics["format"] == "ab" and "listwise" not in metrics
    assert metrics["data"]["bad_rows_skipped"] == 1 and metrics["data"]["sets"] == 3
    reference = {str(i): [1, 0] if row["label"] == "a" else [0, 1]
                 for i, row in enumerate(ab) if i != 2}
    scores, accuracy, pairs, _, _, _ = _recompute(run, reference)
    assert pairs == len(scores) and metrics["pairwise"]["pairs"] == pairs
    assert metrics["pairwise"]["accuracy"] == pytest.approx(accuracy, abs=1e-6)
    assert [s["rank"] for s in run["scores"] if s["id"] == "1"] == [2, 1]


def test_arguments_are_checked(folders, tmp_path, capsys):
    base = ["--data", PROMETHEUS, "--verifier", folders["verifier"], "--out", tmp_path]
    assert _run(["--method", "dynamic_rubric", *base]) == 2
    assert "--method dynamic_rubric needs --generator" in capsys.readouterr().err
    assert _run(["--method", "dynamic_rubric", "--rubrics", "expert", *base]) == 2
    assert "--rubrics is not a --method dynamic_rubric flag" in capsys.readouterr().err
    assert _run(["--num-rubrics", "2", "--rubrics", "expert", *base]) == 2
    assert "--num-rubrics is not a --method genrubric flag" in capsys.readouterr().err
    assert _run(["--method", "dynamic_rubric", "--generator", folders["generator"],
                 "--format", "ab", *base]) == 2
    assert "row 0: field 'prompt' is missing or null" in capsys.readouterr().err
