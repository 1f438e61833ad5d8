"""Reading a folder `jaxrubric inspect` is pointed at: a training workdir, a toy world's workdir
(training workdirs in subfolders, found recursively) or a `jaxrubric evaluate` output folder.

Every file is optional except that the folder must be one of the three kinds; a line that is
not JSON is an error naming its file and line. After a resume a round may be logged twice:
its later line wins, as `read_cards` and `train_loop.read_eval_history` have it.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from jaxrubric.methods.cards import read_cards
from jaxrubric.report.data import (Answer, Card, Inspected, Item, Rubric, Run,
                                   WatchWarning)
from jaxrubric.jsonl import json_file, json_lines
from jaxrubric.report.read_evaluate import EVALUATE_FILES, read_evaluation
from jaxrubric.rewards.telemetry import PASS
from jaxrubric.train import CONFIG_FILE
from jaxrubric.train_loop import CARDS, EVAL_HISTORY, METRICS_HISTORY, WATCH_LOG

TRAINING_FILES = (METRICS_HISTORY, CARDS, EVAL_HISTORY)
# Folders of a training workdir that hold no run of their own, left unsearched (large).
NOT_RUNS = frozenset({"checkpoints", "tensorboard", "jax_cache"})


class NotInspectableError(ValueError):
    """The folder is none of the kinds `inspect` reads (the message names it and says why)."""


def read_folder(folder: str | os.PathLike) -> Inspected:
    """The folder's contents; raises `NotInspectableError` when it is none of the three kinds."""
    folder = Path(folder)
    if not folder.is_dir():
        raise NotInspectableError(f"{folder} is not a folder")
    if is_training_workdir(folder):
        return Inspected(folder, "training", runs=(read_run(folder, folder.name),))
    present = [name for name in EVALUATE_FILES if (folder / name).is_file()]
    if present:
        missing = [name for name in EVALUATE_FILES if name not in present]
        if missing:
            raise NotInspectableError(
                f"{folder} looks like a `jaxrubric evaluate` output (it holds "
                f"{', '.join(present)}) but lacks {', '.join(missing)}")
        return Inspected(folder, "evaluate", evaluation=read_evaluation(folder))
    found = find_runs(folder)
    if not found:
        raise NotInspectableError(
            f"{folder} is not a training workdir, a toy world's workdir or a `jaxrubric "
            f"evaluate` output: neither it nor a subfolder holds {', '.join(TRAINING_FILES)}, "
            f"and it does not hold {', '.join(EVALUATE_FILES)}")
    return Inspected(folder, "world",
                     runs=tuple(read_run(path, path.relative_to(folder).as_posix())
                                for path in found))


def is_training_workdir(folder: Path) -> bool:
    return any((folder / name).is_file() for name in TRAINING_FILES)


def find_runs(folder: Path) -> list[Path]:
    """The training workdirs under `folder`, sorted by path (a toy world keeps its runs in
    `runs/<name>`); a training workdir's own subfolders are not searched."""
    found = []
    for root, dirs, _ in os.walk(folder):
        path = Path(root)
        if path != folder and is_training_workdir(path):
            found.append(path)
            dirs.clear()
        else:
            dirs[:] = [d for d in dirs if d not in NOT_RUNS and not d.startswith(".")]
    return sorted(found)


def read_run(path: Path, name: str) -> Run:
    """A training workdir's metrics, evaluations, warnings, cards and config (a round's
    scalars, and a round's warning of a kind, from its later line)."""
    scalars: dict[str, dict[int, float]] = {}
    for file in (METRICS_HISTORY, EVAL_HISTORY):  # an evaluation's value wins over a logged one
        for round_, row in sorted(latest_by_round(path / file).items()):
            for key, value in row.items():
                if key != "round" and _is_number(value) and math.isfinite(value):
                    scalars.setdefault(key, {})[round_] = float(value)
    warnings = {(int(w["round"]), str(w.get("kind", ""))): str(w.get("message", ""))
                for w in json_lines(path / WATCH_LOG)}
    config = path / CONFIG_FILE
    return Run(
        name=name, path=path,
        scalars={k: tuple(sorted(v.items())) for k, v in sorted(scalars.items())},
        warnings=tuple(WatchWarning(r, kind, message)
                       for (r, kind), message in sorted(warnings.items())),
        cards=_cards(path / CARDS),
        config=json_file(config) if config.is_file() else None)


def latest_by_round(path: Path) -> dict[int, dict[str, Any]]:
    """A JSONL file's objects by their `round`, the later line of a round winning."""
    return {int(row["round"]): row for row in json_lines(path) if "round" in row}


def card(d: Mapping[str, Any]) -> Card:
    """A `cards.jsonl` object (its schema: `jaxrubric.methods.cards`) as a `Card`."""
    soft = bool(d.get("soft_verdicts", False))
    answers = tuple(Answer(
        text=a["text"], length=int(a["length"]), reward=float(a["reward"]),
        rewarded=bool(a.get("rewarded", True)), advantage=float(a["advantage"]),
        group=a.get("group"), oracle=a.get("oracle"), rubric_reward=a.get("rubric_reward"))
        for a in d["answers"])
    rubrics = []
    for g, r in enumerate(d["rubrics"]):
        items = tuple(Item(
            criterion=i["criterion"], weight=int(i["weight"]),
            p=tuple(float(v) for v in i["verdicts"]),
            passed=tuple(float(v) > PASS for v in i["verdicts"]),
            slot=i.get("slot"), reward=i.get("reward")) for i in r["items"])
        facts = {"reward": r.get("reward"), "advantage": r.get("advantage"),
                 "tokens": r.get("length"), "complete": r.get("complete"),
                 "explorer": r.get("explorer")}
        rubrics.append(Rubric(label=f"rubric {g}", items=items,
                              scores=tuple(float(s) for s in r["scores"]), text=r.get("text"),
                              valid=r.get("valid"),
                              facts={k: v for k, v in facts.items() if v is not None}))
    return Card(round=int(d["round"]), method=str(d.get("method", "")), row=int(d["row"]),
                prompt=d["prompt"], soft_verdicts=soft, answers=answers, rubrics=tuple(rubrics))


def _cards(path: Path) -> tuple[Card, ...]:
    if not path.is_file():
        return ()
    cards = []
    for d in read_cards(str(path)):
        try:
            cards.append(card(d))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{path}: the card of round {d.get('round')} row {d.get('row')} "
                             f"does not follow the card schema ({type(e).__name__}: {e})") from e
    return tuple(cards)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
