"""The typed contents of an inspected folder: what `read` builds and `html` renders.

Training cards and `jaxrubric evaluate` outputs become the same `Rubric` / `Item` shapes, so
one verdict grid draws both.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

Kind = Literal["training", "world", "evaluate"]


@dataclasses.dataclass(frozen=True)
class Item:
    """A rubric item and its verdict on every answer: `p[a]` is p_yes (soft verdicts) or 0/1,
    `passed[a]` the verdict it counts as."""

    criterion: str
    weight: int
    p: tuple[float, ...]
    passed: tuple[bool, ...]
    slot: int | None = None
    reward: float | None = None  # GenRubric's item reward


@dataclasses.dataclass(frozen=True)
class Rubric:
    """A written (or expert) rubric: its label, items, one score per answer (None where it does
    not score) and whatever else its source records (`facts`, shown as written)."""

    label: str
    items: tuple[Item, ...]
    scores: tuple[float | None, ...]
    text: str | None = None
    valid: bool | None = None
    facts: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Answer:
    """A policy answer of a card."""

    text: str
    length: int
    reward: float
    rewarded: bool
    advantage: float
    group: int | None = None
    oracle: float | None = None
    rubric_reward: float | None = None


@dataclasses.dataclass(frozen=True)
class Card:
    """A rubric card (`jaxrubric.methods.cards`): a prompt, its answers, its rubrics."""

    round: int
    method: str
    row: int
    prompt: str
    soft_verdicts: bool
    answers: tuple[Answer, ...]
    rubrics: tuple[Rubric, ...]


@dataclasses.dataclass(frozen=True)
class WatchWarning:
    """A line of `watch.jsonl`: something a run's watch flagged at a round."""

    round: int
    kind: str
    message: str


@dataclasses.dataclass(frozen=True)
class Run:
    """One training workdir: its scalars by name as (round, value) in round order (logged
    metrics and evaluations, the later line of a round winning), warnings, cards and config."""

    name: str
    path: Path
    scalars: Mapping[str, tuple[tuple[int, float], ...]]
    warnings: tuple[WatchWarning, ...]
    cards: tuple[Card, ...]
    config: Mapping[str, Any] | None

    @property
    def method(self) -> str | None:
        if self.cards:
            return self.cards[0].method
        return None if self.config is None else self.config.get("method")


@dataclasses.dataclass(frozen=True)
class Query:
    """One query of an evaluate output: its responses' rows of `scores.jsonl` and its rubrics
    judged on them."""

    id: str
    responses: tuple[Mapping[str, Any], ...]
    rubrics: tuple[Rubric, ...]


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """A `jaxrubric evaluate` output folder: `metrics.json` and its queries in file order."""

    metrics: Mapping[str, Any]
    queries: tuple[Query, ...]


@dataclasses.dataclass(frozen=True)
class Inspected:
    """What a folder holds: one training run, a toy world's runs, or an evaluate output."""

    folder: Path
    kind: Kind
    runs: tuple[Run, ...] = ()
    evaluation: Evaluation | None = None
