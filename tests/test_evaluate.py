"""`jaxrubric evaluate` end to end: tiny random checkpoints built on the spot, real HealthBench
rows, outputs checked against a NumPy recomputation from the written verdicts."""

import argparse
import collections
import contextlib
import io
import json

import datasets
import numpy as np
import pytest
from tokenizer_fixtures import byte_level_bpe, healthbench_rows

import jaxrubric
from jaxrubric.eval import evaluate as ev
from jaxrubric.rubric.grammar import SIGNED_WEIGHTS

# Row 2 has no completions; rows 8 and 12 have the ideal and 4 references, row 18 the ideal
# only. Their rubrics have 6, 9 and 3 criteria.
ROWS = (2, 8, 12, 18)
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
    folders = checkpoints(root)
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


def _recomputed_scores(verdicts, rubric):
    """HealthBench's formula from the written verdicts: met points over positive points."""
    met, positive = collections.defaultdict(float), collections.defaultdict(float)
    for v in verdicts:
        if v["rubric"] == rubric:
            key = (v["id"], v["response"])
            met[key] += v["weight"] * v["verdict"]
            positive[key] += max(v["weight"], 0)
    return {key: met[key] / positive[key] for key in met if positive[key] > 0}


@pytest.fixture(scope="module")
def generated_run(setup, tmp_path_factory):
    folders, data, _, _ = setup
    out = tmp_path_factory.mktemp("generated")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        rc = _run(["--data", data, "--generator", folders["generator"], "--verifier",
                   folders["verifier"], "--out", out, "--temperature", "1.0", "--seed", "3",
                   *SMALL])
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
    for rubric in ("generated", "expert"):
        recomputed = _recomputed_scores(run["verdicts"], rubric)
        for s in run["scores"]:
            key = (s["id"], s["response"])
            if key in recomputed:
                assert s["scores"][rubric] == pytest.approx(recomputed[key], abs=1e-6)
            else:
                assert s["scores"][rubric] is None  # no positive item: an invalid rubric
    assert all(s["scores"]["expert"] is not None for s in run["scores"])

    by_kind = collections.defaultdict(list)
    for row in run["rubrics"]:
        by_kind[row["rubric"]].append(row)
    assert [r["id"] for r in by_kind["expert"]] == [r["prompt_id"] for r in scored]
    for row, source in zip(by_kind["expert"], scored):
        assert [(i["criterion"], i["weight"]) for i in row["items"]] == [
            (" ".join(c["criterion"].split()), c["points"]) for c in source["rubrics"]]
        assert all(i["tokens"] == 8 for i in row["items"] if i["truncated"])
    for row in by_kind["generated"]:
        assert {"text", "complete", "finished", "num_tokens"} <= row.keys()
        assert len(row["items"]) <= 3
        for item in row["items"]:
            assert item["weight"] in SIGNED_WEIGHTS and item["criterion"]
        lines = [line.split(" ", 1) for line in row["text"].split("\n")[:len(row["items"])]]
        assert [(i["weight"], i["criterion"]) for i in row["items"]] == [
            (int(w.strip("[]")), " ".join(c.split())) for w, c in lines]

    metrics = run["metrics"]
    assert metrics["queries"] == {"total": 4, "scored": 3, "without_responses": 1}
    assert metrics["responses"] == len(run["scores"]) == 11
    assert metrics["data"]["bad_rows_skipped"] == 0
    assert metrics["truncated"]["responses"] > 0 and metrics["truncated"]["expert_items"] > 0
    assert set(metrics["agreement"]) == {"spearman", "kendall_tau_b", "top1_consistency",
                                         "pairwise_accuracy"}
    assert metrics["agreement_queries"]["single_response"] == 1
    assert set(metrics["scores"]) == set(metrics["reference_delta_gap"]) == {"generated", "expert"}
    # Δgap: the ideal completion against each reference, averaged per query, then over queries.
    expert = collections.defaultdict(dict)
    for s in run["scores"]:
        expert[s["id"]][s["response"]] = s["scores"]["expert"]
    gaps = [np.mean([v[0] - v[k] for k in range(1, len(v))]) for v in expert.values() if len(v) > 1]
    assert metrics["reference_delta_gap"]["expert"]["mean"] == pytest.approx(np.mean(gaps), abs=1e-6)
    assert metrics["reference_delta_gap"]["expert"]["n"] == 2
    assert "agreement, generated vs expert" in run["printed"]


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
    # Expert branches judge the same whether or not generated branches share the forward.
    both = {(v["id"], v["response"], v["item"]): v["p_yes"] for v in generated_run["verdicts"]
            if v["rubric"] == "expert"}
    alone = {(v["id"], v["response"], v["item"]): v["p_yes"] for v in run["verdicts"]}
    assert alone.keys() == both.keys()
    np.testing.assert_allclose([alone[k] for k in both], list(both.values()), atol=1e-5)


def test_arguments_are_checked(setup, tmp_path, capsys):
    folders, data, _, _ = setup
    assert _run(["--data", data, "--verifier", folders["verifier"], "--out", tmp_path]) == 2
    assert "--rubrics generated needs --generator" in capsys.readouterr().err
    assert _run(["--data", tmp_path / "missing.jsonl", "--verifier", folders["verifier"],
                 "--out", tmp_path, "--rubrics", "expert"]) == 2
    assert "missing.jsonl: no such file" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        _run(["--data", data, "--verifier", folders["verifier"], "--out", tmp_path,
              "--batch-size", "0"])
