"""Preference data: candidate sets with a reference order, to evaluate a rubric generator on.

Three formats, each read into `CandidateSet`s (a prompt and its candidates, each with a
reference rank: 1 = best, equal ranks tie):

- ``ab``: one pair per row, ``{prompt, response_a, response_b, label: "a" | "b", id?}``;
- ``ranked``: Nectar-like ``{prompt, answers: [{answer, rank}], id?}`` (as `load_anchors`);
- ``prometheus``: Prometheus-eval's MT-Bench rows, one per (question, response):
  ``{idx, instruction, gpt4_score: [int, ...], ...}``. The rows of one ``idx`` form a set,
  ranked by their mean GPT-4 score. ``instruction`` is Prometheus's grading prompt; the
  conversation and the response are read from its ``###The instruction to evaluate:`` and
  ``###Response to evaluate:`` sections. MT-Bench's second turns follow each model's own first
  answer, so the conversations of a set differ: the set's prompt is their shared beginning up
  to the last assistant turn they share, and each candidate keeps the rest as its ``context``.

The generator's template is built for one set size, so every set of a data set must have the
size most of its sets have; a set of another size is a bad row.
"""

from __future__ import annotations

import collections
import dataclasses
import os
from collections.abc import Callable, Iterable, Mapping
from fractions import Fraction
from typing import Any, TypeVar

from jaxrubric.data.loaders import Loaded, read_rows
from jaxrubric.data.schemas import DataError, Messages, RowChecker, parse_anchor_row

FORMATS = ("ab", "ranked", "prometheus")
T = TypeVar("T")

_CONVERSATION = "###The instruction to evaluate:\n"
_RESPONSE = "\n\n###Response to evaluate:\n"
_REFERENCE = "\n\n###Reference Answer (Score 5):"
_TURN = "\n\nAssistant:"  # how Prometheus's MT-Bench conversations start an assistant turn


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One candidate response.

    ``context`` is this candidate's own part of the conversation between the set's prompt and
    ``text`` (empty unless the conversations of the set differ); ``row`` the source row it was
    read from; ``reference_score`` the score its rank comes from, where the data has one.
    """

    text: str
    rank: int
    row: int
    context: str = ""
    reference_score: float | None = None


@dataclasses.dataclass(frozen=True)
class CandidateSet:
    """A prompt and its candidates, in the order the source lists them."""

    id: str
    messages: Messages
    candidates: list[Candidate]

    @property
    def ranks(self) -> list[int]:
        return [c.rank for c in self.candidates]


@dataclasses.dataclass(frozen=True)
class LoadedSets(Loaded[CandidateSet]):
    """`Loaded` candidate sets, with the format they were read as."""

    format: str = "ranked"


def detect_format(source: str, row: Mapping[str, Any]) -> str:
    """The format a row's fields say (see the module docstring)."""
    if "response_a" in row or "response_b" in row:
        return "ab"
    if "answers" in row:
        return "ranked"
    if "instruction" in row and "gpt4_score" in row:
        return "prometheus"
    raise DataError(f"{source} row 0: cannot tell the format from the fields {sorted(row)}: "
                    "expected response_a/response_b/label (ab), answers (ranked) or "
                    "instruction/gpt4_score (prometheus)")


def parse_ab_row(check: RowChecker, row: Mapping[str, Any]) -> CandidateSet:
    """``{prompt, response_a, response_b, label, id?}``; ``label`` names the preferred one."""
    record_id = check.row_id(row, ("id", "prompt_id"))
    messages = check.messages(check.get(row, "prompt", "prompt"), "prompt")
    a = check.string(check.get(row, "response_a", "response_a"), "response_a")
    b = check.string(check.get(row, "response_b", "response_b"), "response_b")
    label = row.get("label")
    if not isinstance(label, str) or label.lower() not in ("a", "b"):
        check.fail("label", f"must be 'a' or 'b' (the preferred response), got {label!r}")
    first = 1 if label.lower() == "a" else 2
    return CandidateSet(record_id, messages, [Candidate(a, first, check.index),
                                              Candidate(b, 3 - first, check.index)])


def parse_ranked_row(check: RowChecker, row: Mapping[str, Any]) -> CandidateSet:
    """Nectar-like ``{prompt, answers: [{answer, rank}], id?}`` (ties allowed)."""
    anchor = parse_anchor_row(check, row)
    return CandidateSet(anchor.id, anchor.messages,
                        [Candidate(a.text, a.rank, check.index) for a in anchor.answers])


@dataclasses.dataclass(frozen=True)
class _PrometheusRow:
    """One validated Prometheus row, before the rows of its ``idx`` are made a set."""

    set_id: str
    conversation: str
    response: str
    score: Fraction
    row: int


def _section(check: RowChecker, text: str, start: str, end: str) -> str:
    for marker in (start, end):
        if text.count(marker) != 1:
            check.fail("instruction", f"must hold the section marker {marker.strip()!r} once, "
                                      f"found it {text.count(marker)} times")
    begin, stop = text.index(start) + len(start), text.index(end)
    if stop < begin:
        check.fail("instruction", f"has {end.strip()!r} before {start.strip()!r}")
    return text[begin:stop]


def _parse_prometheus_row(check: RowChecker, row: Mapping[str, Any]) -> _PrometheusRow:
    check.get(row, "idx", "idx")
    set_id = check.row_id(row, ("idx",))
    text = check.string(check.get(row, "instruction", "instruction"), "instruction")
    conversation = _section(check, text, _CONVERSATION, _RESPONSE)
    response = _section(check, text, _RESPONSE, _REFERENCE)
    if not response.strip():
        check.fail("instruction", "has an empty '###Response to evaluate:' section")
    scores = check.sequence(check.get(row, "gpt4_score", "gpt4_score"), "gpt4_score",
                            allow_empty=False)
    values = [check.integer(s, f"gpt4_score[{i}]") for i, s in enumerate(scores)]
    return _PrometheusRow(set_id, conversation, response, Fraction(sum(values), len(values)),
                          check.index)


def _prometheus_set(source: str, rows: list[_PrometheusRow]) -> CandidateSet:
    """The rows of one ``idx``: the shared prompt, each candidate's context and rank."""
    conversations = [r.conversation for r in rows]
    shared = os.path.commonprefix(conversations)
    if len(set(conversations)) > 1:
        cut = shared.rfind(_TURN)
        if cut < 0:
            RowChecker(source, rows[0].row).fail(
                "instruction", f"starts a conversation that the other rows of idx "
                               f"{rows[0].set_id} do not share up to an assistant turn")
        shared = shared[:cut + len(_TURN)]
    candidates = [Candidate(r.response, 1 + sum(o.score > r.score for o in rows), r.row,
                            r.conversation[len(shared):], float(r.score)) for r in rows]
    return CandidateSet(rows[0].set_id, [{"role": "user", "content": shared}], candidates)


def load_candidate_sets(source: str | os.PathLike, *, format: str = "auto",
                        skip_bad_rows: bool = False, split: str = "train") -> LoadedSets:
    """Candidate sets in ``format`` (``"auto"``: told by the first row's fields).

    Raises `DataError` naming the file, row and field of the first bad row, or, with
    ``skip_bad_rows``, leaves each bad row (or set) out and keeps its message in ``problems``.
    Set ids must be unique (Prometheus: the rows of one ``idx`` are one set).
    """
    name = str(source)
    rows = read_rows(source, split=split)
    if len(rows) == 0:
        raise DataError(f"{name}: has no rows")
    if format == "auto":
        format = detect_format(name, rows[0])
    elif format not in FORMATS:
        raise ValueError(f"format must be 'auto' or one of {FORMATS}, got {format!r}")
    problems: list[str] = []

    def kept(parse: Callable[..., T], calls: Iterable[tuple[Any, ...]]) -> list[T]:
        """``parse(*args)`` of every call that raises no `DataError` (or the first error)."""
        out = []
        for args in calls:
            try:
                out.append(parse(*args))
            except DataError as e:
                if not skip_bad_rows:
                    raise
                problems.append(str(e))
        return out

    parse = {"ab": parse_ab_row, "ranked": parse_ranked_row,
             "prometheus": _parse_prometheus_row}[format]
    parsed = kept(_parse_object, ((parse, RowChecker(name, i), row) for i, row in enumerate(rows)))
    if format == "prometheus":
        groups: dict[str, list[_PrometheusRow]] = collections.defaultdict(list)
        for row in parsed:
            groups[row.set_id].append(row)
        sets = kept(_prometheus_set, ((name, g) for g in groups.values()))
    else:
        seen: dict[str, int] = {}
        sets = kept(_unique, ((name, s, seen) for s in parsed))
    sizes = collections.Counter(len(s.candidates) for s in sets)
    if sizes:
        size, count = sizes.most_common(1)[0]
        if size < 2:
            raise DataError(f"{name}: most sets have {size} candidate; ranking needs 2 or more")
        sets = kept(_check_size, ((name, s, format, size, count, len(sets)) for s in sets))
    return LoadedSets(name, sets, problems, format)


def _parse_object(parse: Callable[[RowChecker, Mapping[str, Any]], T], check: RowChecker,
                  row: Any) -> T:
    if not isinstance(row, Mapping):
        raise DataError(f"{check.source} row {check.index}: must be an object, got "
                        f"{type(row).__name__}")
    return parse(check, row)


def _unique(source: str, candidate_set: CandidateSet, seen: dict[str, int]) -> CandidateSet:
    """``candidate_set`` unless an earlier set (``seen``: id -> row) has its id."""
    row = candidate_set.candidates[0].row
    if candidate_set.id in seen:
        RowChecker(source, row).fail(
            "id", f"repeats the id {candidate_set.id!r} of row {seen[candidate_set.id]}")
    seen[candidate_set.id] = row
    return candidate_set


def _check_size(source: str, candidate_set: CandidateSet, format: str, size: int, count: int,
                total: int) -> CandidateSet:
    n = len(candidate_set.candidates)
    if n != size:
        field, what = ("idx", "rows") if format == "prometheus" else ("answers", "answers")
        RowChecker(source, candidate_set.candidates[0].row).fail(
            field, f"gives a set of {n} {what}, but {count} of the {total} sets have {size} "
                   "(the generator's template is built for one set size)")
    return candidate_set
