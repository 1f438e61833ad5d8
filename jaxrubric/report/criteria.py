"""Which criteria the generator writes most, card round by card round, and what entered or left
that top list between consecutive card rounds: a generator that collapses onto a few items,
or drifts to new ones, shows here."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence

from jaxrubric.report.data import Card


@dataclasses.dataclass(frozen=True)
class TopCriteria:
    """A card round's most written criteria with their counts (most first), and against the
    previous card round's list the criteria that entered and left it."""

    round: int
    top: tuple[tuple[str, int], ...]
    entered: tuple[str, ...]
    left: tuple[str, ...]


def normalized(criterion: str) -> str:
    """A criterion compared by its words: spacing does not make another item."""
    return " ".join(criterion.split())


def top_criteria(cards: Sequence[Card], k: int = 10) -> list[TopCriteria]:
    """Per card round (in order), the `k` criteria written most over all its cards' rubrics
    (ties broken alphabetically), and the change from the previous card round."""
    counts: dict[int, Counter[str]] = {}
    for card in cards:
        counter = counts.setdefault(card.round, Counter())
        counter.update(normalized(item.criterion) for r in card.rubrics for item in r.items)
    out, previous = [], None
    for round_ in sorted(counts):
        top = tuple(sorted(counts[round_].items(), key=lambda kv: (-kv[1], kv[0]))[:k])
        names = [name for name, _ in top]
        before = [] if previous is None else [name for name, _ in previous]
        out.append(TopCriteria(
            round=round_, top=top,
            entered=tuple(n for n in names if n not in before) if previous is not None else (),
            left=tuple(n for n in before if n not in names)))
        previous = top
    return out
