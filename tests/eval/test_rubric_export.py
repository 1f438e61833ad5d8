"""`jaxrubric rubrics` (rubric cards exported as HealthBench rows or plain rows) and `jaxrubric
evaluate --rubrics FILE`; the round trip: a run's card scores judged again from the export by
the run's verifier, on the toy world's character-level tokenizer."""

import argparse
import json
from pathlib import Path

import numpy as np
import pytest

import jaxrubric
from jaxrubric import rubric_export as rx
from jaxrubric.cli import main
from jaxrubric.data import load_healthbench
from jaxrubric.eval import common
from jaxrubric.eval import evaluate as ev
from jaxrubric.methods.cards import read_cards
from jaxrubric.toy import digits_task

CONFIGS = Path(__file__).parents[2] / "configs"


def _answer(text):
    return {"text": text, "length": len(text), "reward": 0.5, "rewarded": True,
            "advantage": 0.0, "group": None, "oracle": None, "rubric_reward": None}


def _rubric(items, valid=True, num_answers=3):
    """A card rubric of ``(criterion, weight)`` items (verdicts and scores made up)."""
    return {"text": "".join(f"[{w}] {c}\n" for c, w in items), "length": 9, "valid": valid,
            "complete": valid, "explorer": False, "reward": 0.0, "advantage": 0.0,
            "scores": [0.25] * num_answers,
            "items": [{"slot": m, "criterion": " " + c, "token_ids": [], "weight": w,
                       "verdicts": [1.0, 0.0, 1.0][:num_answers], "reward": None}
                      for m, (c, w) in enumerate(items)]}


def _card(round_, row, prompt, answers, rubrics, method="genrubric"):
    return {"round": round_, "method": method, "row": row, "prompt": prompt,
            "soft_verdicts": False, "answers": [_answer(a) for a in answers], "rubrics": rubrics}


def _write_cards(workdir, cards):
    workdir.mkdir(parents=True, exist_ok=True)
    with (workdir / "cards.jsonl").open("w", encoding="utf-8") as f:
        f.writelines(json.dumps(c) + "\n" for c in cards)
    return workdir


@pytest.fixture
def workdir(tmp_path):
    """A GenRubric run's cards of rounds 1 and 3: signed rubrics, an invalid one, one without a
    positive item and a blank answer."""
    return _write_cards(tmp_path / "run7", [
        _card(1, 0, "big 381729", ["879", "87", "3"], [
            _rubric([("has 9", 3), ("has 3", -2)]), _rubric([("has", 1)], valid=False)]),
        _card(1, 1, "big 5610", ["56", " ", "5"], [_rubric([("omits 5", -1)])]),
        _card(3, 0, "big 9012", ["9", "90", "09"], [_rubric([("has 9", 5), ("omits 0", 2)])]),
    ])


def _rubrics_cli(*argv):
    parser = argparse.ArgumentParser(prog="jaxrubric")
    rx.add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["rubrics", *map(str, argv)])
    return args.func(args)


def test_healthbench_export_reads_back_as_the_cards_wrote_it(workdir, capsys):
    assert _rubrics_cli(workdir) == 0
    printed = capsys.readouterr().out
    out = workdir / "rubrics_healthbench.jsonl"
    assert f"wrote 2 rubric rows of round(s) 1, 3 to {out}" in printed
    assert "left out 2 rubrics: 1 invalid, 1 no positive item" in printed
    assert "left out 0 blank answers from the rows' completions" in printed

    records = load_healthbench(out).records
    assert [r.id for r in records] == ["run7/round1/row0/rubric0", "run7/round3/row0/rubric0"]
    first = records[0]
    tags = ["run:run7", "round:1", "prompt:0", "rubric:0"]
    assert first.messages == [{"role": "user", "content": "big 381729"}]
    assert [(i.criterion, i.weight, i.tags) for i in first.rubric] == [
        ("has 9", 3, tags), ("has 3", -2, tags)]  # GenRubric's signs kept as points
    assert (first.ideal_completion, first.reference_completions) == ("879", ["87", "3"])
    assert first.tags == tags
    assert [i.weight for i in records[1].rubric] == [5, 2]
    assert [json.loads(line)["card_answers"] for line in out.open()] == [[0, 1, 2]] * 2


def test_blank_answers_are_left_out_and_counted(tmp_path):
    workdir = _write_cards(tmp_path / "w", [
        _card(2, 4, "big 5610", ["56", " ", "5"], [_rubric([("has 5", 2)])], "dynamic_rubric")])
    exported = rx.export_rubrics(workdir, tmp_path / "hb.jsonl")
    assert (exported.rows, exported.blank_answers) == (1, 1)
    record, = load_healthbench(exported.path).records
    assert record.responses == ["56", "5"]
    assert json.loads(exported.path.read_text())["card_answers"] == [0, 2]


def test_round_selection_plain_rows_and_errors(workdir, tmp_path, capsys):
    exported = rx.export_rubrics(workdir, format="jsonl", round_=1)
    assert exported.path == workdir / "rubrics_jsonl_round1.jsonl" == rx.default_out(
        workdir, "jsonl", 1)
    rows = [json.loads(line) for line in exported.path.open()]
    assert [(r["round"], r["row"], r["rubric"], r["valid"]) for r in rows] == [
        (1, 0, 0, True), (1, 0, 1, False), (1, 1, 0, True)]  # every rubric, invalid ones too
    assert rows[0] == {
        "run": "run7", "round": 1, "row": 0, "rubric": 0, "method": "genrubric",
        "prompt": "big 381729", "answers": ["879", "87", "3"], "valid": True,
        "items": [{"criterion": "has 9", "weight": 3, "verdicts": [1.0, 0.0, 1.0]},
                  {"criterion": "has 3", "weight": -2, "verdicts": [1.0, 0.0, 1.0]}],
        "scores": [0.25] * 3}

    assert _rubrics_cli(workdir, "--round", "2") == 2
    assert (f"{workdir / 'cards.jsonl'} has no cards of round 2; rounds with cards: 1, 3"
            in capsys.readouterr().err)
    assert _rubrics_cli(tmp_path / "empty") == 2
    assert f"{tmp_path / 'empty'} has no cards.jsonl" in capsys.readouterr().err


# ---------------------------------------------------------------- evaluate --rubrics FILE
@pytest.fixture(scope="module")
def verifier(tmp_path_factory):
    """A tiny random verifier over the toy world's character-level tokenizer, saved with it.
    Its weights are scaled up: at init scale every p_yes sits near the same value and every
    verdict is alike."""
    root = tmp_path_factory.mktemp("verifier")
    tokenizer = jaxrubric.load_tokenizer(digits_task.build_tokenizer(root / "tokenizer"))
    config = jaxrubric.tiny_config("qwen3", vocab_size=len(tokenizer),
                                   eos_token_ids=(tokenizer.eos_token_id,),
                                   pad_token_id=tokenizer.pad_token_id)
    model = jaxrubric.init_model(config, seed=2)
    for name, value in model.layers.items():
        if "norm" not in name:
            value[...] = value[...] * 10
    model.lm_head[...] = model.lm_head[...] * 20
    jaxrubric.save_pretrained(model, root / "verifier")
    tokenizer.save_pretrained(str(root / "verifier"))
    return root / "verifier", tokenizer


def _evaluate(*argv):
    parser = argparse.ArgumentParser(prog="jaxrubric")
    ev.add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["evaluate", *map(str, argv), "--no-progress"])
    return args.func(args)


def _outputs(folder):
    return {name: [json.loads(line) for line in (folder / f"{name}.jsonl").open()]
            for name in ("verdicts", "scores")}


def test_evaluate_takes_each_rows_rubric_from_the_file(workdir, verifier, tmp_path, capsys):
    """`--rubrics FILE` judges each `--data` row under FILE's rubric of its prompt_id exactly as
    `--rubrics expert` judges FILE itself, scored as HealthBench scores; an id FILE lacks is an
    error naming both files."""
    exported = rx.export_rubrics(workdir).path
    rows = [json.loads(line) for line in exported.open()]
    other = tmp_path / "other.jsonl"  # the same rows under another rubric
    other.write_text("".join(json.dumps({**r, "rubrics": [{"criterion": "has 1", "points": 1}]})
                             + "\n" for r in rows))
    base = ["--verifier", verifier[0], "--template-style", "compact"]
    assert _evaluate("--data", exported, "--rubrics", "expert", "--out", tmp_path / "a",
                     *base) == 0
    assert _evaluate("--data", other, "--rubrics", exported, "--out", tmp_path / "b", *base) == 0
    expert, from_file = _outputs(tmp_path / "a"), _outputs(tmp_path / "b")
    assert from_file == expert
    assert len(expert["verdicts"]) == 2 * 3 * 2  # rows x completions x items
    assert 0 < sum(v["verdict"] for v in expert["verdicts"]) < len(expert["verdicts"])
    metrics = json.loads((tmp_path / "b" / "metrics.json").read_text())
    assert metrics["rubrics"] == str(exported)
    # HealthBench's score from the verdicts: met points over positive points, unclipped.
    for score in expert["scores"]:
        items = [v for v in expert["verdicts"]
                 if (v["id"], v["response"]) == (score["id"], score["response"])]
        points = np.array([v["weight"] for v in items], float)
        met = np.array([v["verdict"] for v in items], float)
        assert score["scores"]["expert"] == pytest.approx(
            met @ points / points.clip(min=0).sum(), abs=1e-6)

    short = tmp_path / "short.jsonl"
    short.write_text(exported.read_text().splitlines()[0] + "\n")
    capsys.readouterr()
    assert _evaluate("--data", exported, "--rubrics", short, "--out", tmp_path / "c",
                     *base) == 2
    assert (f"{exported}: row 'run7/round3/row0/rubric0' has no rubric: no row of {short} has "
            "that prompt_id") in capsys.readouterr().err
    assert _evaluate("--data", exported, "--rubrics", exported, "--out", tmp_path / "c",
                     "--runs", "2", *base) == 2
    assert "need rubrics='generated'" in capsys.readouterr().err


# ------------------------------------------------------------------------------ round trip
def _retokenized(tokenizer, rubric, answer):
    """Whether evaluate reads the answer and the rubric's items as the tokens the run judged.
    It re-tokenizes their text, and a sampled token sequence need not be the text's own
    tokenization: here only the merges spelling yes and no can differ (a sampled ``n``, ``o``
    becomes ``no``), which shortens the text, so the length tells; a criterion's whitespace
    evaluate normalises (a trailing space), which its token ids tell."""
    items = all(common.item(tokenizer, i["criterion"].strip(), i["weight"], 64).ids
                == i["token_ids"] for i in rubric["items"])
    return items and len(common.encode(tokenizer, answer["text"])) == answer["length"]


@pytest.mark.slow
@pytest.mark.parametrize("method", ["dynamic_rubric", "genrubric"])
def test_a_runs_card_scores_come_back_from_its_export(method, verifier, tmp_path):
    """One round of the tiny config on the toy tokenizer with the saved verifier writes cards
    of every prompt; exported and judged again by `evaluate` with that verifier and template
    style, every (rubric, answer) read as the run read it scores as its card says, item by item
    (0/1 verdicts for DynamicRubric, p_yes for GenRubric's soft verdicts)."""
    folder, tokenizer = verifier
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in digits_task.anchor_rows(8, 0, 3)))
    workdir = tmp_path / "run"
    assert main(["train", "--config", str(CONFIGS / f"tiny_{method}.py"), "--config.rounds=1",
                 "--workdir", str(workdir), f"--config.tokenizer={folder}",
                 f"--config.data.train={data}", f"--config.verifier.path={folder}",
                 "--config.rubric.template_style=compact", "--config.logging.card_every=1",
                 "--config.logging.card_prompts=8"]) == 0
    assert _rubrics_cli(workdir) == 0
    path = rx.default_out(workdir, "healthbench")
    exported = {r["prompt_id"]: r for r in map(json.loads, path.open())}
    assert _evaluate("--data", path, "--rubrics", path, "--verifier", folder,
                     "--template-style", "compact", "--out", tmp_path / "eval") == 0
    out = _outputs(tmp_path / "eval")
    scores = {(s["id"], s["response"]): s for s in out["scores"]}
    verdicts = {(v["id"], v["response"], v["item"]): v for v in out["verdicts"]}

    cards = read_cards(str(workdir / "cards.jsonl"))
    assert len(cards) == 8
    judged, compared, seen, signs = 0, 0, set(), set()
    for card in cards:
        soft = card["soft_verdicts"]
        assert soft == (method == "genrubric")
        for g, rubric in enumerate(card["rubrics"]):
            prompt_id = f"run/round1/row{card['row']}/rubric{g}"
            positive = any(i["weight"] > 0 for i in rubric["items"])
            assert (prompt_id in exported) == (rubric["valid"] and positive)
            for k, a in enumerate(exported.get(prompt_id, {}).get("card_answers", [])):
                judged += 1
                if not _retokenized(tokenizer, rubric, card["answers"][a]):
                    continue
                compared += 1
                signs.update(int(np.sign(i["weight"])) for i in rubric["items"])
                score = scores[(prompt_id, k)]["soft_scores" if soft else "scores"]["expert"]
                assert score == pytest.approx(rubric["scores"][a], abs=1e-5)
                for m, item in enumerate(rubric["items"]):
                    v = verdicts[(prompt_id, k, m)]
                    assert (v["p_yes"] if soft else float(v["verdict"])) == pytest.approx(
                        item["verdicts"][a], abs=1e-5)
                    seen.add(v["verdict"])
    assert compared >= judged * 2 // 3 and compared > 20
    assert seen == {False, True}
    assert signs == ({-1, 1} if method == "genrubric" else {1})
