"""`jaxrubric evaluate` end to end: tiny random checkpoints built on the spot, real HealthBench
rows, outputs checked against an independent NumPy / scipy recomputation from the written
verdicts; the metrics' building blocks (top-k, tags, bootstrap, clipping, runs) against hand
computations."""

import argparse
import collections
import contextlib
import io
import json
import warnings

import datasets
import numpy as np
import pytest
from scipy import stats
from tokenizer_fixtures import byte_level_bpe, healthbench_rows

import jaxrubric
from jaxrubric.eval import evaluate as ev
from jaxrubric.eval import metrics as mt
from jaxrubric.rubric.grammar import SIGNED_WEIGHTS

# Row 2 has no completions; rows 8, 12, 4 and 14 have the ideal and 4 references, row 18 the
# ideal only. Their rubrics have 6, 9, 13, 13 and 3 criteria.
ROWS = (2, 8, 12, 18, 4, 14)
RUNS, TOP_K, SEED = 4, 3, 17
SMALL = ["--max-items", "3", "--max-item-tokens", "8", "--max-new-tokens", "24",
         "--max-prompt-tokens", "32", "--max-response-tokens", "24", "--batch-size", "2",
         "--no-progress"]


@pytest.fixture(scope="module", autouse=True)
def _datasets_cache(tmp_path_factory):
    """Keeps the Arrow caches `datasets` writes for these temporary files out of ~/.cache."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path_factory.mktemp("hf_cache"))
        yield


def checkpoints(root, verifier_seed=2):
    """Generator and verifier folders under ``root`` (different tokenizers).

    The verifier's weights are scaled up: at init scale the answer position barely sees the
    context, every p_yes sits near n_yes / (n_yes + n_no) and every verdict is the same.
    """
    folders = {}
    for name, tok, seed, scale in (("generator", byte_level_bpe(use_regex=False), 1, (1, 1)),
                                   ("verifier", byte_level_bpe(), verifier_seed, (10, 5))):
        cfg = jaxrubric.tiny_config("qwen3", vocab_size=len(tok),
                                    eos_token_ids=(tok.eos_token_id,))
        model = jaxrubric.init_model(cfg, seed=seed)
        for param, value in model.layers.items():
            if "norm" not in param:
                value[...] = value[...] * scale[0]
        model.lm_head[...] = model.lm_head[...] * scale[1]
        folders[name] = root / name
        jaxrubric.save_pretrained(model, folders[name])
        tok.save_pretrained(str(folders[name]))
    return folders


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """The checkpoints and the data files."""
    root = tmp_path_factory.mktemp("evaluate")
    folders = checkpoints(root, verifier_seed=3)  # verdicts that vary with the response
    rows = [healthbench_rows()[i] for i in ROWS]
    data = root / "healthbench.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    bad = json.loads(json.dumps(rows[1]))
    bad["prompt_id"] = "bad"
    bad["rubrics"][0]["points"] = "ten"
    with_bad = root / "with_bad_row.jsonl"
    with_bad.write_text("".join(json.dumps(r) + "\n" for r in rows[:2] + [bad] + rows[2:]),
                        encoding="utf-8")
    return folders, data, with_bad, rows


def _run(argv):
    parser = argparse.ArgumentParser(prog="jaxrubric")
    ev.add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["evaluate", *map(str, argv)])
    return args.func(args)


def _read(folder):
    out = {name: [json.loads(line) for line in (folder / f"{name}.jsonl").open()]
           for name in ("rubrics", "verdicts", "scores")}
    out["metrics"] = json.loads((folder / "metrics.json").read_text())
    return out


def _group(row):
    """The rubric a rubrics.jsonl or verdicts.jsonl row belongs to."""
    return row["rubric"], row.get("run")


def _recomputed_scores(verdicts):
    """HealthBench's formula from the written verdicts, per (id, rubric, run) and response:
    met points over positive points; a rubric without positive points scores nothing."""
    met = collections.defaultdict(lambda: collections.defaultdict(float))
    positive = collections.defaultdict(lambda: collections.defaultdict(float))
    for v in verdicts:
        key = (v["id"], *_group(v))
        met[key][v["response"]] += v["weight"] * v["verdict"]
        positive[key][v["response"]] += max(v["weight"], 0)
    return {key: {k: met[key][k] / p for k, p in positive[key].items()}
            for key in met if all(p > 0 for p in positive[key].values())}


@pytest.fixture(scope="module")
def generated_run(setup, tmp_path_factory):
    folders, data, _, _ = setup
    out = tmp_path_factory.mktemp("generated")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        rc = _run(["--data", data, "--generator", folders["generator"], "--verifier",
                   folders["verifier"], "--out", out, "--temperature", "1.0", "--seed", SEED,
                   "--runs", RUNS, "--top-k", TOP_K, *SMALL])
    assert rc == 0
    return {**_read(out), "printed": printed.getvalue()}


def test_generated_run_writes_consistent_outputs(setup, generated_run):
    _, _, _, rows = setup
    run = generated_run
    scored = [r for r in rows if r["ideal_completions_data"]]
    expected = {(r["prompt_id"], k) for r in scored
                for k in range(1 + len(r["ideal_completions_data"]
                                       ["ideal_completions_ref_completions"]))}
    assert [(s["id"], s["response"]) for s in run["scores"]] == sorted(
        expected, key=lambda x: ([r["prompt_id"] for r in scored].index(x[0]), x[1]))
    assert all(s["completion"] == ("ideal" if s["response"] == 0 else "reference")
               for s in run["scores"])

    p_yes = np.array([v["p_yes"] for v in run["verdicts"]])
    assert ((p_yes >= 0) & (p_yes <= 1)).all()
    assert all(v["verdict"] == (v["p_yes"] > 0.5) for v in run["verdicts"])
    recomputed = _recomputed_scores(run["verdicts"])
    for s in run["scores"]:
        assert len(s["scores"]["generated"]) == RUNS
        for group, written in [(("expert", None), s["scores"]["expert"]),
                               *((("generated", r), x)
                                 for r, x in enumerate(s["scores"]["generated"]))]:
            key = (s["id"], *group)
            if key in recomputed:
                assert written == pytest.approx(recomputed[key][s["response"]], abs=1e-6)
            else:
                assert written is None  # no positive item: an invalid rubric
    assert all(s["scores"]["expert"] is not None for s in run["scores"])

    by_kind = collections.defaultdict(list)
    for row in run["rubrics"]:
        by_kind[row["rubric"]].append(row)
    assert [r["id"] for r in by_kind["expert"]] == [r["prompt_id"] for r in scored]
    for row, source in zip(by_kind["expert"], scored):
        assert [(i["criterion"], i["weight"]) for i in row["items"]] == [
            (" ".join(c["criterion"].split()), c["points"]) for c in source["rubrics"]]
        assert all(i["tokens"] == 8 for i in row["items"] if i["truncated"])
    assert [(r["id"], r["run"]) for r in by_kind["generated"]] == [
        (r["prompt_id"], k) for r in scored for k in range(RUNS)]
    for row in by_kind["generated"]:
        assert {"text", "complete", "finished", "num_tokens", "valid"} <= row.keys()
        assert row["valid"] == ((row["id"], "generated", row["run"]) in recomputed)
        assert len(row["items"]) <= 3
        for item in row["items"]:
            assert item["weight"] in SIGNED_WEIGHTS and item["criterion"]
        lines = [line.split(" ", 1) for line in row["text"].split("\n")[:len(row["items"])]]
        assert [(i["weight"], i["criterion"]) for i in row["items"]] == [
            (int(w.strip("[]")), " ".join(c.split())) for w, c in lines]
    # The sampled runs differ, and some rubric is invalid, so both ways of counting matter.
    assert len({r["text"] for r in by_kind["generated"]}) > len(scored)
    assert 0 < sum(not r["valid"] for r in by_kind["generated"]) < len(by_kind["generated"])

    metrics = run["metrics"]
    assert metrics["runs"] == RUNS
    assert metrics["queries"] == {"total": 6, "scored": 5, "without_responses": 1}
    assert metrics["responses"] == len(run["scores"]) == 21
    assert metrics["data"]["bad_rows_skipped"] == 0
    assert metrics["truncated"]["responses"] > 0 and metrics["truncated"]["expert_items"] > 0
    assert metrics["generated_rubrics"]["total"] == 5 * RUNS
    assert metrics["agreement"]["queries"] == {"compared": 4, "single_response": 1}
    assert metrics["agreement_top_k"]["k"] == TOP_K
    for table in (metrics["agreement"], metrics["agreement_top_k"]):
        for mode in ("valid_only", "invalid_as_failure"):
            assert set(table[mode]) == set(mt.AGREEMENT_METRICS)
    assert set(metrics["scores"]) == set(metrics["reference_delta_gap"]) == {"generated", "expert"}
    assert "agreement, generated vs expert" in run["printed"]
    assert "axis:completeness" in run["printed"] and "top 3 responses" in run["printed"]


# ----------------------------------------------------------------- independent recomputation
def _top1(g, e, tol=1e-6):
    return float(set(np.flatnonzero(g >= g.max() - tol)) <= set(np.flatnonzero(e >= e.max() - tol)))


def _pairwise(g, e, tol=1e-6):
    i, j = np.triu_indices(len(g), 1)
    sign = lambda d: np.where(np.abs(d) <= tol, 0, np.sign(d))  # noqa: E731
    return float(np.mean(sign(g[i] - g[j]) == sign(e[i] - e[j])))


def _scipy_metrics(g, e):
    """The four metrics of one query and run; NaN (scipy's undefined) becomes None."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scipy warns on constant input
        rho = stats.spearmanr(g, e).statistic
        tau = stats.kendalltau(g, e, variant="b").statistic
    return {"spearman": None if np.isnan(rho) else float(rho),
            "kendall_tau_b": None if np.isnan(tau) else float(tau),
            "top1_consistency": _top1(g, e), "pairwise_accuracy": _pairwise(g, e)}


def _bootstrap(values, weights=None, clip=False):
    """The documented protocol: queries resampled with default_rng(seed), 1000 draws."""
    values = np.asarray(values, float)
    weights = np.ones_like(values) if weights is None else np.asarray(weights, float)
    if len(values) < 2:
        return None
    draws = np.random.default_rng(SEED).integers(0, len(values), (1000, len(values)))
    means = (weights[draws] * values[draws]).sum(1) / weights[draws].sum(1)
    return float(np.std(np.clip(means, 0, 1) if clip else means))


def _expected_agreement(generated, expert, failure):
    """Per query and run (scipy), averaged over runs, then over queries."""
    table = {}
    for name in mt.AGREEMENT_METRICS:
        per_query, counted = [], 0
        for runs, e in zip(generated, expert):
            values = [0.0 if g is None else _scipy_metrics(g, e)[name] for g in runs
                      if g is not None or failure]
            values = [v for v in values if v is not None]
            counted += len(values)
            if values:
                per_query.append(np.mean(values))
        table[name] = {"mean": float(np.mean(per_query)) if per_query else None,
                       "bootstrap_se": _bootstrap(per_query), "n": len(per_query),
                       "skipped": len(expert) - len(per_query), "runs": counted,
                       "runs_left_out": len(expert) * RUNS - counted}
    return table


def _assert_close(actual, expected):
    assert actual.keys() == expected.keys()
    for key, value in expected.items():
        if isinstance(value, dict):
            _assert_close(actual[key], value)
        elif value is None or isinstance(value, int):
            assert actual[key] == value, key
        else:
            assert actual[key] == pytest.approx(value, abs=1e-6), key


def _pooled(per_query):
    """HealthBench's aggregate: the mean over responses, clipped, and its bootstrap."""
    per_query = [np.asarray(v, float) for v in per_query if len(v)]
    mean = float(np.mean(np.concatenate(per_query)))
    return {"mean": mean, "clipped_mean": min(max(mean, 0.0), 1.0),
            "bootstrap_se": _bootstrap([v.mean() for v in per_query],
                                       [len(v) for v in per_query], clip=True),
            "responses": sum(map(len, per_query)), "queries": len(per_query)}


def test_every_metric_is_recomputed_from_the_written_verdicts(setup, generated_run):
    _, _, _, rows = setup
    run = generated_run
    source = {r["prompt_id"]: r for r in rows if r["ideal_completions_data"]}
    counts = collections.Counter(s["id"] for s in run["scores"])
    scores = _recomputed_scores(run["verdicts"])
    met = collections.defaultdict(dict)  # expert verdicts: id -> (response, item) -> met
    for v in run["verdicts"]:
        if v["rubric"] == "expert":
            met[v["id"]][v["response"], v["item"]] = v["verdict"]

    def vector(qid, *group):
        key = (qid, *group)
        return None if key not in scores else np.array([scores[key][k] for k in range(counts[qid])])

    expert = {q: vector(q, "expert", None) for q in source}
    generated = {q: [vector(q, "generated", r) for r in range(RUNS)] for q in source}
    metrics = run["metrics"]

    compared = [q for q in source if counts[q] >= 2]
    for failure, mode in ((False, "valid_only"), (True, "invalid_as_failure")):
        _assert_close(metrics["agreement"][mode], _expected_agreement(
            [generated[q] for q in compared], [expert[q] for q in compared], failure))
        top = {q: np.sort(np.argsort(-expert[q], kind="stable")[:TOP_K]) for q in compared}
        _assert_close(metrics["agreement_top_k"][mode], _expected_agreement(
            [[None if g is None else g[top[q]] for g in generated[q]] for q in compared],
            [expert[q][top[q]] for q in compared], failure))

    valid_runs = {q: [g for g in generated[q] if g is not None] for q in source}
    for kind, per_query in (("expert", {q: [expert[q]] for q in source}),
                            ("generated", valid_runs)):
        _assert_close(metrics["scores"][kind], {
            **_pooled([np.concatenate(v) for v in per_query.values() if v]),
            "ideal": float(np.mean([x[0] for v in per_query.values() for x in v])),
            "reference": float(np.mean([r for v in per_query.values() for x in v for r in x[1:]]))})
        gaps = [np.mean([x[0] - x[1:].mean() for x in v]) for q, v in per_query.items()
                if v and counts[q] > 1]
        _assert_close(metrics["reference_delta_gap"][kind],
                      {"mean": float(np.mean(gaps)), "n": len(gaps),
                       "skipped": len(source) - len(gaps)})

    # Per tag: example tags score every response; a rubric tag scores the criteria it marks.
    tags = {"expert": collections.defaultdict(list), "generated": collections.defaultdict(list)}
    for q, row in source.items():
        for tag in row["example_tags"]:
            tags["expert"][tag].append(expert[q])
            if valid_runs[q]:
                tags["generated"][tag].append(np.concatenate(valid_runs[q]))
        for tag in {t for item in row["rubrics"] for t in item["tags"]}:
            items = [m for m, item in enumerate(row["rubrics"]) if tag in item["tags"]]
            points = np.array([row["rubrics"][m]["points"] for m in items], float)
            if points.clip(min=0).sum() > 0:
                hits = np.array([[met[q][k, m] for m in items] for k in range(counts[q])])
                tags["expert"][tag].append(hits @ points / points.clip(min=0).sum())
    for kind in ("expert", "generated"):
        _assert_close(metrics["tags"][kind], {t: _pooled(v) for t, v in tags[kind].items()})
    assert {"theme:hedging", "axis:accuracy", "level:example"} <= set(metrics["tags"]["expert"])

    # The correlations are defined on some runs, on all responses and on the top k alike (so
    # both paths are checked above). The tiny generator's rubrics are short (1.45 items), so on
    # the top 3 most tie: SEED is one whose draw leaves a defined top-k run (with the
    # inverse-CDF sampler, seeds 3 to 16 failed the earlier check of two runs in both tables).
    assert metrics["agreement"]["valid_only"]["spearman"]["runs"] >= 2
    assert metrics["agreement_top_k"]["valid_only"]["spearman"]["runs"] >= 1
    rubric_rows = [r for r in run["rubrics"] if r["rubric"] == "generated"]
    invalid = sum(g is None for v in generated.values() for g in v)
    assert metrics["generated_rubrics"]["invalid"] == invalid == sum(
        not r["valid"] for r in rubric_rows)
    # Failures can only lower a mean of metrics whose failure value is their worst (accuracies).
    for name in ("top1_consistency", "pairwise_accuracy"):
        a = metrics["agreement"]
        assert a["invalid_as_failure"][name]["mean"] <= a["valid_only"][name]["mean"] + 1e-9


# ----------------------------------------------------------------- hand computations
def test_top_k_keeps_the_best_expert_scored_responses_in_order():
    np.testing.assert_array_equal(mt.top_k_responses([0.2, 0.9, 0.5, 0.9, 0.1], 3), [1, 2, 3])
    np.testing.assert_array_equal(mt.top_k_responses([0.5, 0.1, 0.5, 0.5], 2), [0, 2])  # ties
    np.testing.assert_array_equal(mt.top_k_responses([0.3, 0.1], 3), [0, 1])


def test_agreement_over_runs_by_hand():
    expert = [np.array([0.0, 0.5, 1.0]), np.array([1.0, 0.0, 0.5])]
    runs = [[np.array([0.1, 0.2, 0.3]), np.array([0.3, 0.2, 0.1]), None],  # rho 1, -1, invalid
            [None, np.array([0.4, 0.4, 0.4])]]  # invalid; constant: rho undefined
    valid = mt.agreement_over_runs(runs, expert, invalid_as_failure=False)
    assert valid["spearman"] == {"mean": 0.0, "n": 1, "skipped": 1, "runs": 2,
                                 "runs_left_out": 3, "bootstrap_se": None}
    failed = mt.agreement_over_runs(runs, expert, invalid_as_failure=True)
    # Query 0: (1 - 1 + 0) / 3; query 1: the failure alone (the constant run is undefined).
    assert failed["spearman"]["mean"] == pytest.approx(0.0)
    assert failed["spearman"]["n"] == 2 and failed["spearman"]["runs_left_out"] == 1
    # Pairwise, query 0: 1 and 0 and (failure) 0 -> 1/3; query 1: 0 and the constant run,
    # which ties every pair the expert orders -> 0; mean 1/6.
    assert failed["pairwise_accuracy"]["mean"] == pytest.approx(1 / 6)
    assert valid["pairwise_accuracy"]["mean"] == pytest.approx((0.5 + 0.0) / 2)
    # Top-1: query 0's runs pick responses 2 (right) and 0 (wrong); query 1's constant run
    # ties all three, which include non-top expert responses.
    assert valid["top1_consistency"]["mean"] == pytest.approx((0.5 + 0.0) / 2)


def test_healthbench_tag_scores_by_hand():
    met = np.array([[1, 0, 1], [0, 1, 1]], bool)
    points = [4, 2, -2]
    item_tags = [["axis:accuracy", "level:example"], ["axis:completeness"], ["axis:accuracy"]]
    overall = mt.healthbench_score(met, points)
    np.testing.assert_allclose(overall, [(4 - 2) / 6, (2 - 2) / 6])
    tags = mt.healthbench_tag_scores(overall, met, points, item_tags, ["theme:hedging"])
    np.testing.assert_allclose(tags["theme:hedging"], overall)
    np.testing.assert_allclose(tags["axis:accuracy"], [(4 - 2) / 4, -2 / 4])
    np.testing.assert_allclose(tags["axis:completeness"], [0.0, 1.0])
    np.testing.assert_allclose(tags["level:example"], [1.0, 0.0])
    # A tag on penalties only has no positive points: HealthBench leaves it out.
    assert "axis:safety" not in mt.healthbench_tag_scores(
        overall, met, points, [["a"], ["b"], ["axis:safety"]], [])


def test_bootstrap_and_clipping_by_hand():
    # Two queries with scores 0 and 1: resampled means are 0, 1/2, 1/2, 1 equally often, so
    # the standard error is sqrt(1/8).
    assert mt.bootstrap_se([0.0, 1.0]) == pytest.approx(np.sqrt(1 / 8), abs=0.02)
    assert mt.bootstrap_se([0.3]) is None
    draws = np.random.default_rng(5).integers(0, 3, (1000, 3))
    values = np.array([0.2, 0.4, 0.9])
    assert mt.bootstrap_se(values, seed=5) == pytest.approx(np.std(values[draws].mean(1)))
    # Penalties push the mean below 0; HealthBench reports it clipped to 0. Query 0 has two
    # responses (-1, -0.5), query 1 one (0.25): mean -5/12. A resample clips to 0.25 only
    # when it draws query 1 twice (probability 1/4), else to 0: se 0.25 * sqrt(3) / 4.
    agg = mt.healthbench_aggregate([[-1.0, -0.5], [0.25]])
    assert agg["mean"] == pytest.approx(-5 / 12) and agg["clipped_mean"] == 0.0
    assert agg["bootstrap_se"] == pytest.approx(0.25 * np.sqrt(3) / 4, abs=0.02)
    assert (agg["responses"], agg["queries"]) == (3, 2)
    assert mt.healthbench_aggregate([[1.5, 0.9]])["clipped_mean"] == 1.0


# ----------------------------------------------------------------- errors and expert rubrics
def test_bad_row_is_named_and_can_be_skipped(setup, generated_run, tmp_path, capsys):
    folders, _, with_bad, _ = setup
    argv = ["--data", with_bad, "--verifier", folders["verifier"], "--out", tmp_path,
            "--rubrics", "expert", *SMALL]
    assert _run(argv) == 2
    err = capsys.readouterr().err
    assert f"{with_bad} row 2: field 'rubrics[0].points' must be an integer, got 'ten'" in err
    assert not (tmp_path / "metrics.json").exists()

    assert _run([*argv, "--skip-bad-rows"]) == 0
    assert "skipped:" in capsys.readouterr().err
    run = _read(tmp_path)
    assert run["metrics"]["data"]["bad_rows_skipped"] == 1
    assert "agreement" not in run["metrics"] and {r["rubric"] for r in run["rubrics"]} == {"expert"}
    assert set(run["metrics"]["scores"]) == {"expert"}
    # Expert branches judge the same whether or not generated branches share the forward.
    both = {(v["id"], v["response"], v["item"]): v["p_yes"] for v in generated_run["verdicts"]
            if v["rubric"] == "expert"}
    alone = {(v["id"], v["response"], v["item"]): v["p_yes"] for v in run["verdicts"]}
    assert alone.keys() == both.keys()
    np.testing.assert_allclose([alone[k] for k in both], list(both.values()), atol=1e-5)


def test_arguments_are_checked(setup, tmp_path, capsys):
    folders, data, _, _ = setup
    base = ["--data", data, "--verifier", folders["verifier"], "--out", tmp_path]
    assert _run(base) == 2
    assert "--rubrics generated needs --generator" in capsys.readouterr().err
    assert _run(["--data", tmp_path / "missing.jsonl", "--verifier", folders["verifier"],
                 "--out", tmp_path, "--rubrics", "expert"]) == 2
    assert "missing.jsonl: no such file" in capsys.readouterr().err
    with_generator = [*base, "--generator", folders["generator"]]
    assert _run([*with_generator, "--runs", "4"]) == 2
    assert "sample them (temperature > 0)" in capsys.readouterr().err
    assert _run([*base, "--rubrics", "expert", "--top-k", "3"]) == 2
    assert "need rubrics='generated'" in capsys.readouterr().err
    assert _run([*with_generator, "--top-k", "1"]) == 2
    assert "top_k must be >= 2" in capsys.readouterr().err
    assert _run([*with_generator, "--method", "dynamic_rubric", "--runs", "2"]) == 2
    assert "--runs is not a --method dynamic_rubric flag" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        _run([*base, "--batch-size", "0"])
