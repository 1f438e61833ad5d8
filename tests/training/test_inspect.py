"""`jaxrubric inspect`: small workdirs written in their files' schemas (a DynamicRubric run
with two card rounds, a GenRubric run, a toy world of runs, an evaluate output of each
method), the page parsed back with `html.parser` to check what lands in which cell, the
errors a folder of no known kind gives, and the page as headless Chromium renders it."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from jaxrubric.report import command
from jaxrubric.report.criteria import top_criteria
from jaxrubric.report.read import read_folder

# Text that must arrive escaped: markup, quotes, a rubric's own brackets.
TRICKY = 'Says <b>"fever"</b> & names the [3] ] dose'
PLAIN = "Gives the answer in digits"


# ---------------------------------------------------------------------------- a parsed page
class Node:
    """An element of the parsed page: its tag, attributes, children and text."""

    def __init__(self, tag: str, attrs: dict[str, str | None], parent: Node | None):
        self.tag, self.attrs, self.parent = tag, attrs, parent
        self.children: list[Node | str] = []

    def text(self) -> str:
        return "".join(c if isinstance(c, str) else c.text() for c in self.children)

    def classes(self) -> list[str]:
        return (self.attrs.get("class") or "").split()

    def find_all(self, tag: str | None = None, cls: str | None = None, **attrs: str
                 ) -> list[Node]:
        """Descendants with the tag, class and attributes (`data_x` names `data-x`)."""
        found = []
        for c in self.children:
            if isinstance(c, Node):
                if ((tag is None or c.tag == tag) and (cls is None or cls in c.classes())
                        and all(c.attrs.get(k.replace("_", "-")) == v
                                for k, v in attrs.items())):
                    found.append(c)
                found += c.find_all(tag, cls, **attrs)
        return found

    def one(self, tag: str | None = None, cls: str | None = None, **attrs: str) -> Node:
        found = self.find_all(tag, cls, **attrs)
        assert len(found) == 1, (tag, cls, attrs, len(found))
        return found[0]


class _Builder(HTMLParser):
    VOID = frozenset({"meta", "br", "hr", "img", "input", "link"})

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.root = self.at = Node("#root", {}, None)

    def handle_starttag(self, tag, attrs):
        node = Node(tag, dict(attrs), self.at)
        self.at.children.append(node)
        if tag not in self.VOID:
            self.at = node

    def handle_startendtag(self, tag, attrs):
        self.at.children.append(Node(tag, dict(attrs), self.at))

    def handle_endtag(self, tag):
        node = self.at
        while node is not None and node.tag != tag:
            node = node.parent
        if node is not None and node.parent is not None:
            self.at = node.parent

    def handle_data(self, data):
        self.at.children.append(data)


def parse(page: str) -> Node:
    builder = _Builder()
    builder.feed(page)
    return builder.root


def verdict_cells(row: Node) -> list[tuple[str, str]]:
    """An item row's verdicts as (pass|fail, data-p), in answer order."""
    return [("pass" if "pass" in c.classes() else "fail", c.attrs["data-p"])
            for c in row.find_all("td", "verdict")]


# ------------------------------------------------------------------------- writing a workdir
def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def rubric(items: list[tuple[str, int, list[float], float | None]], scores: list[float], *,
           valid: bool = True, explorer: bool = False) -> dict:
    """A card's rubric of (criterion, weight, verdicts per answer, item reward) items."""
    return {"text": "".join(f"[{w}] {c}\n" for c, w, _, _ in items), "length": 9 * len(items),
            "valid": valid, "complete": True, "explorer": explorer, "reward": 0.5,
            "advantage": -0.25, "scores": scores,
            "items": [{"slot": m, "criterion": c, "token_ids": [5, 6], "weight": w,
                       "verdicts": v, "reward": r} for m, (c, w, v, r) in enumerate(items)]}


def card(round_: int, row: int, rubrics: list[dict], *, method: str = "dynamic_rubric",
         soft: bool = False, prompt: str = "What is 3 + 4?") -> dict:
    answers = [{"text": text, "length": len(text), "reward": reward, "rewarded": True,
                "advantage": reward - 0.5, "group": a // 2 if method == "genrubric" else None,
                "oracle": 1.0 if a == 0 else 0.0, "rubric_reward": reward}
               for a, (text, reward) in enumerate([("7", 1.0), ("<i>eight</i>", 0.0),
                                                   ("seven", 0.5), ("6", 0.0)])]
    return {"round": round_, "method": method, "row": row, "prompt": prompt,
            "soft_verdicts": soft, "answers": answers, "rubrics": rubrics}


def dynamic_rubric_workdir(folder: Path, quality: float = 0.4) -> Path:
    """Rounds 0-6 logged, evaluations at 0, 3 and 6, a warning at round 5 and cards at rounds
    0 and 5; round 3's scalars and evaluation, round 5's warning and card of row 0 twice, as
    after a resume."""
    metrics = [{"round": r, "policy/reward": 0.1 * r, "generator/reward": 0.2,
                "rubric/valid_rate": 0.9,
                "telemetry/generator/saturated_items": 0.1 * r,
                "telemetry/generator/saturated_weight": 0.05 * r,
                "telemetry/generator/item_discriminability": 0.25 - 0.02 * r,
                "telemetry/policy/tied_prompts": 0.1,
                "telemetry/generator/invalid_rubrics": 0.1,
                "telemetry/generator/truncated_rubrics": 0.0,
                "telemetry/policy/score_length_corr": 0.05 * r,
                "telemetry/generator/oracle_agreement": 0.6} for r in range(7)]
    metrics.insert(3, {"round": 3, "policy/reward": 99.0})  # the pass before a resume
    write_jsonl(folder / "metrics.jsonl", metrics)
    write_jsonl(folder / "eval_history.jsonl", [
        {"round": 0, "eval/quality": quality, "eval/delta_gap": 0.1, "eval/anchor_delta_gap": 0.2},
        {"round": 3, "eval/quality": 0.0, "eval/delta_gap": 0.0},
        {"round": 3, "eval/quality": quality + 0.1, "eval/delta_gap": 0.15},
        {"round": 6, "eval/quality": quality + 0.2, "eval/delta_gap": 0.3}])
    write_jsonl(folder / "watch.jsonl", [
        {"round": 5, "kind": "length", "message": "raised before the resume"},
        {"round": 5, "kind": "length", "message": "answers grew <2x> while quality fell"}])
    first = [rubric([(PLAIN, 3, [1.0, 0.0, 1.0, 0.0], None),
                     ("Is short", 1, [1.0, 1.0, 1.0, 1.0], None)], [1.0, 0.0, 1.0, 0.0])]
    later = [rubric([(TRICKY, 4, [1.0, 0.0, 0.0, 1.0], None),
                     ("  Is   short ", 1, [1.0, 1.0, 0.0, 1.0], None)], [1.0, 0.2, 0.0, 1.0]),
             rubric([], [0.0] * 4, valid=False, explorer=True)]
    write_jsonl(folder / "cards.jsonl", [
        card(0, 0, first), card(0, 1, first),
        card(5, 0, first, prompt="replaced after the resume"), card(5, 1, later),
        card(5, 0, later, prompt="What is 2 + 5?")])
    (folder / "config.json").write_text(json.dumps({"method": "dynamic_rubric", "rounds": 6}))
    return folder


def genrubric_workdir(folder: Path) -> Path:
    soft = [rubric([("Mentions the carry", -2, [0.9, 0.2, 0.55, 0.4], 0.75),
                    (PLAIN, 5, [0.1, 0.8, 0.3, 0.6], -0.5)], [0.3, 0.7, 0.4, 0.5]),
            rubric([(PLAIN, 2, [0.6, 0.6, 0.6, 0.6], 0.0)], [1.0, 1.0, 1.0, 1.0])]
    write_jsonl(folder / "cards.jsonl", [card(2, 0, soft, method="genrubric", soft=True)])
    write_jsonl(folder / "metrics.jsonl", [
        {"round": r, "telemetry/generator/redundant_items": 0.2} for r in range(3)])
    write_jsonl(folder / "eval_history.jsonl", [
        {"round": 2, "eval/agreement/spearman": 0.3, "eval/agreement/spearman_se": 0.1,
         "eval/agreement/pairwise_accuracy": 0.6, "eval/rubrics/valid_rate": 0.8}])
    (folder / "config.json").write_text(json.dumps(
        {"method": "genrubric", "watch": {"gold": "agreement/spearman"}}))
    return folder


def evaluate_folder(folder: Path, method: str) -> Path:
    """An evaluate output in `jaxrubric.eval`'s row schemas: GenRubric's (a generated run and
    the expert rubric) or DynamicRubric's (two rubrics of a candidate set)."""
    if method == "genrubric":
        labels = [{"rubric": "generated", "run": 0}, {"rubric": "expert"}]
        extra = [{"text": f"[2] {TRICKY}\n", "complete": True, "finished": True,
                  "num_tokens": 12, "valid": True}, {}]
        items = [[(TRICKY, 2)], [(PLAIN, 5), ("Is rude", -3)]]
        scores = [{"id": "q<1>", "response": k, "completion": "ideal" if k == 0 else "reference",
                   "scores": {"generated": [s], "expert": e},
                   "soft_scores": {"generated": [s], "expert": e}}
                  for k, (s, e) in enumerate([(1.0, 0.25), (0.0, 0.75)])]
        metrics = {"data": {"source": "hb.jsonl", "rows": 1, "bad_rows": []}, "responses": 2,
                   "scores": {"expert": {"mean": 0.5}}}
    else:
        labels = [{"rubric": 0}, {"rubric": 1}]
        extra = [{"counted": True, "text": f"[2] {TRICKY}\n", "complete": True,
                  "finished": True, "num_tokens": 12}] * 2
        items = [[(TRICKY, 2)], [(PLAIN, 5), ("Is rude", 1)]]
        scores = [{"id": "q<1>", "response": k, "position": 2 - k, "row": 0, "rank": k + 1,
                   "reference_score": None, "score": s, "soft_score": s,
                   "rubric_scores": [s, 1.0 - s]} for k, s in enumerate([1.0, 0.0])]
        metrics = {"method": "dynamic_rubric", "format": "pairwise",
                   "pairwise": {"accuracy": 1.0, "pairs": 1}}
    p_yes = {(0, 0): [0.9, 0.2], (1, 0): [0.7, 0.45], (1, 1): [0.1, 0.6]}  # (group, item)
    write_jsonl(folder / "rubrics.jsonl", [
        {"id": "q<1>", **label, **e, "items": [{"criterion": c, "weight": w, "tokens": 4,
                                                 "truncated": False} for c, w in group]}
        for label, e, group in zip(labels, extra, items)])
    write_jsonl(folder / "verdicts.jsonl", [
        {"id": "q<1>", "response": k, **label, "item": m, "weight": w,
         "p_yes": p_yes[g, m][k], "verdict": p_yes[g, m][k] > 0.5}
        for g, (label, group) in enumerate(zip(labels, items)) for k in range(2)
        for m, (_, w) in enumerate(group)])
    write_jsonl(folder / "scores.jsonl", scores)
    (folder / "metrics.json").write_text(json.dumps(metrics))
    return folder


def inspect(folder: Path, *flags: str) -> tuple[int, str, str]:
    """Runs `inspect` as the CLI would; returns its code, stdout and stderr."""
    parser = argparse.ArgumentParser(prog="jaxrubric")
    command.add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["inspect", str(folder), *flags])
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = args.func(args)
    return rc, out.getvalue(), err.getvalue()


def page_of(folder: Path, tmp_path: Path) -> tuple[str, Node]:
    out = tmp_path / "report.html"
    rc, printed, err = inspect(folder, "--out", str(out))
    assert rc == 0, err
    assert str(out) in printed
    page = out.read_text(encoding="utf-8")
    return page, parse(page)


# -------------------------------------------------------------------------------- the tests
def test_training_run_cards_grid_and_escaping(tmp_path):
    page, doc = page_of(dynamic_rubric_workdir(tmp_path / "run"), tmp_path)
    round5 = doc.one("section", "round", data_round="5")
    row = round5.one("article", "card", data_row="0").one(
        "tr", "item", data_criterion=TRICKY)  # the parser unescapes: the exact text
    assert row.attrs["data-weight"] == "4"
    assert row.one("td", "weight").text() == "+4"
    assert row.one("td", "criterion").text() == TRICKY
    assert verdict_cells(row) == [("pass", "1"), ("fail", "0"), ("fail", "0"), ("pass", "1")]
    # The item's rubric scores the answers; the answers' texts, rewards and advantages.
    grid = row.parent
    assert [c.text() for c in grid.one("tr", "scores").find_all("td", "score")] == [
        "1", "0.2", "0", "1"]
    card = round5.one("article", "card", data_row="1")
    answers = card.find_all("tr", "answer")
    assert answers[1].one("pre").text() == "<i>eight</i>"
    assert [c.text() for c in answers[1].find_all("td")[1:3]] == ["0", "-0.500"]
    assert card.one("section", "rubric", data_rubric="rubric 1").one(
        "span", "badge").text() == "invalid"
    # Escaped everywhere: no criterion or answer markup reaches the page as markup.
    assert TRICKY not in page and "<b>" not in page and "<i>eight" not in page
    assert "Says &lt;b&gt;&quot;fever&quot;&lt;/b&gt; &amp; names the [3] ] dose" in page
    # Round 0 shows the first rubric's items; hard verdicts carry no shade.
    plain = doc.one("section", "round", data_round="0").find_all(
        "tr", "item", data_criterion=PLAIN)
    assert [verdict_cells(r) for r in plain] == [
        [("pass", "1"), ("fail", "0"), ("pass", "1"), ("fail", "0")]] * 2
    assert "style" not in plain[0].find_all("td", "verdict")[0].attrs


def test_resume_lines_the_later_wins(tmp_path):
    run, = read_folder(dynamic_rubric_workdir(tmp_path)).runs
    assert dict(run.scalars["policy/reward"])[3] == pytest.approx(0.3)  # not the 99 first pass
    assert run.scalars["eval/quality"] == ((0, 0.4), (3, 0.5), (6, pytest.approx(0.6)))
    cards = {(c.round, c.row): c for c in run.cards}
    assert sorted(cards) == [(0, 0), (0, 1), (5, 0), (5, 1)]
    assert cards[5, 0].prompt == "What is 2 + 5?"
    assert [w.message for w in run.warnings] == ["answers grew <2x> while quality fell"]
    assert run.method == "dynamic_rubric" and run.config == {"method": "dynamic_rubric",
                                                             "rounds": 6}


def test_curves_and_warnings(tmp_path):
    page, doc = page_of(dynamic_rubric_workdir(tmp_path / "run"), tmp_path)
    titles = [f.attrs["data-title"] for f in doc.find_all("figure", "chart")]
    for title in ("Held-out quality", "Δgap", "Agreement with the ground truth", "Saturation",
                  "Spread", "Rubric validity", "Score-length correlation", "Rewards"):
        assert title in titles
    assert "Answer length" not in titles  # nothing logged for it
    quality = doc.one("figure", "chart", data_title="Held-out quality")
    assert len(quality.find_all("circle")) == 3  # one point per evaluated round
    gap = doc.one("figure", "chart", data_title="Δgap")
    assert [g.attrs["data-series"] for g in gap.find_all("g", "series")] == [
        "eval/delta_gap", "eval/anchor_delta_gap"]
    # The warning: listed, and marked (with its message) on every chart.
    warning = doc.one("tr", "warning")
    assert warning.attrs["data-round"] == "5" and warning.attrs["data-kind"] == "length"
    assert "answers grew <2x> while quality fell" in warning.text()
    markers = [m for f in doc.find_all("figure", "chart") for m in f.find_all("line", "marker")]
    assert len(markers) == len(titles)
    assert markers[0].text() == "length at round 5: answers grew <2x> while quality fell"
    # Self-contained: nothing is fetched.
    for needle in ("src=", "<link", "@import", "url(", "http://", "https://"):
        assert needle not in page


def test_criteria_written_most_round_to_round(tmp_path):
    run, = read_folder(dynamic_rubric_workdir(tmp_path)).runs
    first, later = top_criteria(run.cards, k=2)
    assert first.round == 0 and first.top == ((PLAIN, 2), ("Is short", 2))
    assert first.entered == () and first.left == ()
    # Round 5: two cards with the tricky item; "Is short" respaced is the same item.
    assert later.top == (("Is short", 2), (TRICKY, 2))
    assert later.entered == (TRICKY,) and later.left == (PLAIN,)
    _, doc = page_of(tmp_path, tmp_path)
    row = doc.one("table", "criteria-diff").one("tr", data_round="5")
    assert [li.text() for li in row.find_all("li", "entered")] == [TRICKY]
    assert [li.attrs["data-criterion"] for li in row.one("ol").find_all("li")][:2] == [
        "Is short", TRICKY]


def test_genrubric_run_soft_verdicts_and_item_rewards(tmp_path):
    _, doc = page_of(genrubric_workdir(tmp_path / "run"), tmp_path)
    row = doc.one("tr", "item", data_criterion="Mentions the carry")
    assert row.one("td", "weight").text() == "-2"
    assert verdict_cells(row) == [("pass", "0.9"), ("fail", "0.2"), ("pass", "0.55"),
                                  ("fail", "0.4")]
    cells = row.find_all("td", "verdict")
    assert cells[0].attrs["style"] != cells[1].attrs["style"]  # shaded by p_yes
    assert row.find_all("td")[-1].text() == "+0.750"  # the item's reward
    heads = [th.text() for th in doc.find_all("table", "answers")[0].find_all("th")]
    assert "group" in heads and "oracle" in heads
    # The watch's gold metric (the config's) first, then the other evaluation scalars by
    # family, their standard errors left out.
    titles = [f.attrs["data-title"] for f in doc.find_all("figure", "chart")]
    assert titles == ["Gold metric eval/agreement/spearman", "Rubric validity",
                      "eval/agreement", "eval/rubrics"]
    family = doc.one("figure", "chart", data_title="eval/agreement")
    assert [g.attrs["data-series"] for g in family.find_all("g", "series")] == [
        "eval/agreement/pairwise_accuracy"]


def test_toy_world_runs_overlaid(tmp_path):
    world = tmp_path / "world"
    dynamic_rubric_workdir(world / "runs" / "coevolve", quality=0.5)
    dynamic_rubric_workdir(world / "runs" / "frozen", quality=0.2)
    genrubric_workdir(world / "runs" / "sweep" / "lr1")  # deeper
    write_jsonl(world / "runs" / "frozen" / "checkpoints" / "metrics.jsonl", [{"round": 0}])
    (world / "toy_config.json").write_text("{}")
    inspected = read_folder(world)
    assert inspected.kind == "world"
    assert [r.name for r in inspected.runs] == ["runs/coevolve", "runs/frozen",
                                                "runs/sweep/lr1"]
    _, doc = page_of(world, tmp_path)
    assert [s.attrs["data-run"] for s in doc.find_all("section", "run")] == [
        "runs/coevolve", "runs/frozen", "runs/sweep/lr1"]
    quality = doc.one("figure", "chart", data_title="Held-out quality")
    assert [g.attrs["data-series"] for g in quality.find_all("g", "series")] == [
        "runs/coevolve: eval/quality", "runs/frozen: eval/quality"]
    assert len(doc.find_all("tr", "warning")) == 2
    # Each run's cards in its own section, rounds anchored by run.
    frozen = doc.one("section", "run", data_run="runs/frozen")
    assert len(frozen.one("section", "round", data_round="5").find_all(
        "tr", "item", data_criterion=TRICKY)) == 2


@pytest.mark.parametrize("method", ["genrubric", "dynamic_rubric"])
def test_evaluate_output(tmp_path, method):
    page, doc = page_of(evaluate_folder(tmp_path / "out", method), tmp_path)
    query = doc.one("article", "query", data_query="q<1>")
    first = query.find_all("section", "rubric")[0]
    row = first.one("tr", "item", data_criterion=TRICKY)
    assert row.one("td", "weight").text() == "+2"
    assert verdict_cells(row) == [("pass", "0.9"), ("fail", "0.2")]
    second = query.find_all("section", "rubric")[1]
    assert verdict_cells(second.one("tr", "item", data_criterion="Is rude")) == [
        ("fail", "0.1"), ("pass", "0.6")]
    scores = [c.text() for c in first.one("tr", "scores").find_all("td", "score")]
    assert scores == ["1", "0"]
    labels = [s.attrs["data-rubric"] for s in query.find_all("section", "rubric")]
    if method == "genrubric":
        assert labels == ["generated run 0", "expert"]
        assert [c.text() for c in second.one("tr", "scores").find_all("td", "score")] == [
            "0.25", "0.75"]
        assert doc.one("tr", data_metric="scores/expert/mean").find_all("td")[1].text() == "0.5"
    else:
        assert labels == ["rubric 0", "rubric 1"]
        assert doc.one("tr", data_metric="pairwise/accuracy").find_all("td")[1].text() == "1"
    assert TRICKY not in page


def test_a_real_evaluate_output(tmp_path):
    """`jaxrubric evaluate` run on tiny random checkpoints (a generated rubric per run and the
    expert's, one HealthBench row): every written verdict is in its cell of the page."""
    from tokenizer_fixtures import byte_level_bpe, healthbench_rows

    import jaxrubric
    from jaxrubric.eval import evaluate

    for name, tok, seed in (("generator", byte_level_bpe(use_regex=False), 1),
                            ("verifier", byte_level_bpe(), 3)):
        cfg = jaxrubric.tiny_config("qwen3", vocab_size=len(tok),
                                    eos_token_ids=(tok.eos_token_id,))
        jaxrubric.save_pretrained(jaxrubric.init_model(cfg, seed=seed), tmp_path / name)
        tok.save_pretrained(str(tmp_path / name))
    data, out = tmp_path / "healthbench.jsonl", tmp_path / "out"
    data.write_text(json.dumps(healthbench_rows()[8]) + "\n", encoding="utf-8")
    parser = argparse.ArgumentParser(prog="jaxrubric")
    evaluate.add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args([
        "evaluate", "--data", str(data), "--generator", str(tmp_path / "generator"),
        "--verifier", str(tmp_path / "verifier"), "--out", str(out), "--runs", "2",
        "--temperature", "1.0", "--max-items", "3", "--max-item-tokens", "8",
        "--max-new-tokens", "24", "--max-prompt-tokens", "32", "--max-response-tokens", "24",
        "--no-progress"])
    with contextlib.redirect_stdout(io.StringIO()):
        assert args.func(args) == 0
    _, doc = page_of(out, tmp_path)
    rubrics = {(r["id"], r["rubric"], r.get("run")): r for r in
               map(json.loads, (out / "rubrics.jsonl").read_text().splitlines())}
    verdicts = list(map(json.loads, (out / "verdicts.jsonl").read_text().splitlines()))
    assert verdicts
    for v in verdicts:
        label = "expert" if v["rubric"] == "expert" else f"generated run {v['run']}"
        section = doc.one("article", "query", data_query=v["id"]).one(
            "section", "rubric", data_rubric=label)
        row = section.one("tr", "item", data_slot=str(v["item"]))
        assert row.attrs["data-criterion"] == rubrics[v["id"], v["rubric"], v.get("run")][
            "items"][v["item"]]["criterion"]
        assert verdict_cells(row)[v["response"]] == ("pass" if v["verdict"] else "fail",
                                                     f"{v['p_yes']:.4g}")


@pytest.mark.parametrize("case", ["empty", "missing", "file", "partial_evaluate", "bad_line"])
def test_a_folder_of_no_known_kind_is_a_clear_error(tmp_path, case):
    folder = tmp_path / "folder"
    folder.mkdir()
    expected = str(folder)
    if case == "empty":
        (folder / "notes.txt").write_text("hello")
        expected += " is not a training workdir, a toy world's workdir or a `jaxrubric evaluate`"
    elif case == "missing":
        folder = tmp_path / "nowhere"
        expected = f"{folder} is not a folder"
    elif case == "file":
        folder = tmp_path / "report.txt"
        folder.write_text("x")
        expected = f"{folder} is not a folder"
    elif case == "partial_evaluate":
        evaluate_folder(folder, "genrubric")
        (folder / "verdicts.jsonl").unlink()
        expected += " looks like a `jaxrubric evaluate` output"
    else:
        dynamic_rubric_workdir(folder)
        with (folder / "metrics.jsonl").open("a") as f:
            f.write('{"round": 7, "policy/rew\n')
        expected = f"{folder / 'metrics.jsonl'} line 9: not JSON"
    rc, printed, err = inspect(folder, "--out", str(tmp_path / "r.html"))
    assert rc == 2 and printed == ""
    assert err.startswith("jaxrubric inspect: error: ") and str(expected) in err
    assert not (tmp_path / "r.html").exists()


def test_default_output_is_in_the_folder(tmp_path):
    run = dynamic_rubric_workdir(tmp_path / "run")
    rc, printed, _ = inspect(run)
    assert rc == 0 and (run / "report.html").is_file() and "training" in printed


def chromium() -> str:
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("chromium is not installed: apt-get install chromium")


def test_the_page_in_a_real_browser(tmp_path):
    """Headless Chromium runs the page's script, renders a screenshot, and its DOM holds the
    grid as written: the select shows the latest round, the others hidden."""
    binary = chromium()
    run = dynamic_rubric_workdir(tmp_path / "run")
    page_of(run, tmp_path)
    url = (tmp_path / "report.html").as_uri()
    flags = [binary, "--headless", "--disable-gpu", "--no-sandbox", "--hide-scrollbars",
             f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1280,2000"]
    shot = tmp_path / "page.png"
    subprocess.run([*flags, f"--screenshot={shot}", url], check=True, timeout=90,
                   capture_output=True)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
    dom = subprocess.run([*flags, "--dump-dom", url], check=True, timeout=90,
                         capture_output=True, text=True).stdout
    doc = parse(dom)
    assert "js" in doc.one("body").classes()  # the script ran
    shown = [s for s in doc.find_all("section", "round") if "hidden" not in s.attrs]
    assert [s.attrs["data-round"] for s in shown] == ["5"]
    row = shown[0].one("article", "card", data_row="0").one("tr", "item", data_criterion=TRICKY)
    assert verdict_cells(row) == [("pass", "1"), ("fail", "0"), ("fail", "0"), ("pass", "1")]
    assert row.one("td", "criterion").text() == TRICKY
