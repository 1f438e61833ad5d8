"""`jaxrubric rubrics`: the rubrics a run wrote, read from its rubric cards (``cards.jsonl``,
`jaxrubric.methods.cards`), exported as rows other tools read.

- ``healthbench``: one row per (card, rubric) in HealthBench's ``oss_eval`` schema
  (`jaxrubric.data.schemas.parse_healthbench_row`), so that ``jaxrubric evaluate --data FILE
  --rubrics FILE`` judges the card's answers under the rubric again (with another verifier,
  dtype or template). The row's prompt is the card's, its criteria the rubric's items, its
  completions the card's answers in order: the first fills the ``ideal_completion`` slot,
  which here says nothing about quality (evaluate's ideal / reference split and Δgap mean
  nothing on these rows). Points are the item weights unchanged: DynamicRubric's 1..5,
  GenRubric's signed -5..-1, 1..5. HealthBench's score, met points over positive points, is
  then DynamicRubric's ``sum(w v) / sum(w)`` and GenRubric's own. HealthBench needs a
  positive-points criterion and non-blank completions, so an invalid rubric, or one without a
  positive item, is left out, and a blank answer is left out of the completions; both are
  counted. ``card_answers`` (a field HealthBench readers ignore) lists which of the card's
  answers the completions are. ``prompt_id`` is ``<run>/round<n>/row<b>/rubric<g>``; the
  example tags and every criterion's tags are ``run:<run>``, ``round:<n>``, ``prompt:<b>``
  and ``rubric:<g>``, the run being the workdir's name.
- ``jsonl``: every rubric, valid or not, as a plain row: run, round, row, rubric index,
  method, prompt, answers, whether it is valid, its items (criterion, weight, verdicts) and
  its scores per answer.

Every round's cards are exported unless one is named: the rows tell rounds apart, so one
file shows how the run's rubrics changed through training.

Judged again by the run's verifier with its template style (``evaluate --template-style``),
an answer scores as its card says (``scores``, or ``soft_scores`` where the run's verdicts
were soft) wherever evaluate reads the texts as the tokens the run judged: it tokenizes text,
and a sampled token sequence need not be its text's own tokenization (nor keep a criterion's
whitespace, which evaluate normalises).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from jaxrubric.methods.cards import read_cards
from jaxrubric.train_loop import CARDS as CARDS_FILE

FORMATS = ("healthbench", "jsonl")
_LEFT_OUT = ("invalid", "no positive item")


@dataclasses.dataclass(frozen=True)
class Exported:
    """What an export wrote: the file, its rows, the rounds read, the rubrics left out by
    reason (``_LEFT_OUT``) and the blank answers left out of the completions (once per row
    they are left out of)."""

    path: Path
    rows: int
    rounds: list[int]
    left_out: Counter
    blank_answers: int


def export_rubrics(workdir: str | Path, out: str | Path | None = None, *,
                   format: str = "healthbench", round_: int | None = None) -> Exported:
    """Writes the rubrics of ``workdir``'s cards (of ``round_`` only, when given) to ``out``
    (default: `default_out`) in ``format`` (see the module docstring)."""
    if format not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {format!r}")
    workdir = Path(workdir)
    cards = _cards(workdir, round_)
    run = workdir.resolve().name
    path = Path(out) if out is not None else default_out(workdir, format, round_)
    rows, left_out, blank = [], Counter(), 0
    for card in cards:
        for g, rubric in enumerate(card["rubrics"]):
            if format == "jsonl":
                rows.append(_plain_row(run, card, g, rubric))
                continue
            reason = _left_out(rubric)
            if reason is not None:
                left_out[reason] += 1
                continue
            row, blank_here = _healthbench_row(run, card, g, rubric)
            rows.append(row)
            blank += blank_here
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        f.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    return Exported(path, len(rows), sorted({c["round"] for c in cards}), left_out, blank)


def default_out(workdir: str | Path, format: str, round_: int | None = None) -> Path:
    """``WORKDIR/rubrics_<format>.jsonl``, or ``..._round<n>.jsonl`` for one round."""
    suffix = "" if round_ is None else f"_round{round_}"
    return Path(workdir) / f"rubrics_{format}{suffix}.jsonl"


def _cards(workdir: Path, round_: int | None) -> list[dict[str, Any]]:
    """The cards to export; no cards (of that round) is an error naming what there is."""
    path = workdir / CARDS_FILE
    if not path.is_file():
        raise ValueError(f"{workdir} has no {CARDS_FILE}: a run writes rubric cards every "
                         "logging.card_every rounds (> 0)")
    cards = read_cards(str(path))
    if not cards:
        raise ValueError(f"{path} holds no cards")
    rounds = sorted({c["round"] for c in cards})
    if round_ is not None and round_ not in rounds:
        raise ValueError(f"{path} has no cards of round {round_}; rounds with cards: "
                         + ", ".join(map(str, rounds)))
    return cards if round_ is None else [c for c in cards if c["round"] == round_]


def _left_out(rubric: dict[str, Any]) -> str | None:
    """Why a rubric cannot be a HealthBench row, or None."""
    if not rubric["valid"]:
        return "invalid"
    if not any(item["weight"] > 0 for item in rubric["items"]):
        return "no positive item"
    return None


def _names(run: str, card: dict[str, Any], g: int) -> tuple[str, list[str]]:
    """The row's ``prompt_id`` and its tags."""
    prompt_id = f"{run}/round{card['round']}/row{card['row']}/rubric{g}"
    return prompt_id, [f"run:{run}", f"round:{card['round']}", f"prompt:{card['row']}",
                       f"rubric:{g}"]


def _healthbench_row(run: str, card: dict[str, Any], g: int,
                     rubric: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """The HealthBench row of rubric ``g`` of ``card`` and how many blank answers it leaves
    out of the completions."""
    prompt_id, tags = _names(run, card, g)
    kept = [a for a, answer in enumerate(card["answers"]) if answer["text"].strip()]
    texts = [card["answers"][a]["text"] for a in kept]
    completions = ({"ideal_completion": texts[0], "ideal_completions_ref_completions": texts[1:]}
                   if texts else None)
    row = {"prompt_id": prompt_id,
           "prompt": [{"role": "user", "content": card["prompt"]}],
           "rubrics": [{"criterion": item["criterion"].strip(), "points": item["weight"],
                        "tags": tags} for item in rubric["items"]],
           "ideal_completions_data": completions,
           "example_tags": tags,
           "card_answers": kept}
    return row, len(card["answers"]) - len(kept)


def _plain_row(run: str, card: dict[str, Any], g: int, rubric: dict[str, Any]) -> dict[str, Any]:
    return {"run": run, "round": card["round"], "row": card["row"], "rubric": g,
            "method": card["method"], "prompt": card["prompt"],
            "answers": [a["text"] for a in card["answers"]], "valid": rubric["valid"],
            "items": [{"criterion": item["criterion"].strip(), "weight": item["weight"],
                       "verdicts": item["verdicts"]} for item in rubric["items"]],
            "scores": rubric["scores"]}


def summary(exported: Exported, format: str) -> str:
    """What an export wrote and what it left out, for the terminal."""
    rounds = ", ".join(map(str, exported.rounds))
    lines = [f"wrote {exported.rows} rubric rows of round(s) {rounds} to {exported.path}"]
    if format == "healthbench":
        reasons = ", ".join(f"{exported.left_out[r]} {r}" for r in _LEFT_OUT)
        lines.append(f"left out {sum(exported.left_out.values())} rubrics: {reasons}")
        lines.append(f"left out {exported.blank_answers} blank answers from the rows' "
                     "completions")
    return "\n".join(lines)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Registers the ``rubrics`` subcommand on an ``add_subparsers()`` object."""
    p = subparsers.add_parser(
        "rubrics", help="export the rubrics of a run's rubric cards (cards.jsonl) as "
                        "HealthBench rows or plain JSON lines",
        description=__doc__.split("\n\n")[0],
        epilog="healthbench rows: one per valid rubric with a positive item (the others are "
               "left out and counted); points = the item weights unchanged (DynamicRubric "
               "1..5, GenRubric signed -5..-1, 1..5), so HealthBench's score, met points over "
               "positive points, is the run's rubric score; completions = the card's answers "
               "(the first in the ideal slot, blank ones left out and counted; card_answers "
               "says which); prompt_id <run>/round<n>/row<b>/rubric<g>; tags run:, round:, "
               "prompt:, rubric:. Judge them again with: jaxrubric evaluate --data FILE "
               "--rubrics FILE --verifier V --template-style <the run's "
               "rubric.template_style>.")
    p.add_argument("workdir", help="the run's workdir (holding cards.jsonl)")
    p.add_argument("--format", choices=FORMATS, default="healthbench",
                   help="healthbench: HealthBench oss_eval rows that jaxrubric evaluate --rubrics "
                        "reads; jsonl: every rubric (invalid ones too) with its items, verdicts "
                        "and scores (default healthbench)")
    p.add_argument("--round", type=int, default=None, dest="round_", metavar="N",
                   help="export this round's cards only (default: every round's, told apart by "
                        "prompt_id and tags, so a rubric's history through training is kept)")
    p.add_argument("--out", default=None,
                   help="output file (default WORKDIR/rubrics_<format>.jsonl, "
                        "WORKDIR/rubrics_<format>_round<n>.jsonl with --round)")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """The ``rubrics`` command."""
    try:
        exported = export_rubrics(args.workdir, args.out, format=args.format, round_=args.round_)
    except (ValueError, OSError) as e:
        print(f"jaxrubric rubrics: error: {e}", file=sys.stderr)
        return 2
    print(summary(exported, args.format))
    return 0
