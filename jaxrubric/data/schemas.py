"""Record types of the data sets jaxrubric reads, and the row validation that builds them.

Rows arrive as Python objects (decoded by `datasets`); every field is checked here, so that a
bad row stops a run with a message naming the source, the 0-based row and the field path
(``data.jsonl row 7: field 'answers[2].rank' must be an integer, got 'x'``) instead of
surfacing later as a shape error or a silently wrong score.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, NoReturn

Messages = list[dict[str, str]]

ROLES = ("system", "developer", "user", "assistant")


class DataError(ValueError):
    """A data set (or one of its rows) does not have the schema a loader expects."""


@dataclasses.dataclass(frozen=True)
class PromptRecord:
    """A prompt as a chat: ``messages`` is a list of ``{"role", "content"}``."""

    id: str
    messages: Messages


@dataclasses.dataclass(frozen=True)
class Answer:
    """One reference answer and its rank (1 = best; equal ranks tie)."""

    text: str
    rank: int


@dataclasses.dataclass(frozen=True)
class AnchorRecord:
    """A prompt with reference answers sorted best-first (the anchor list of DynamicRubric)."""

    id: str
    messages: Messages
    answers: list[Answer]


@dataclasses.dataclass(frozen=True)
class ExpertItem:
    """One expert rubric criterion; ``weight`` is its points (negative: an error to avoid)."""

    criterion: str
    weight: int
    tags: list[str]


@dataclasses.dataclass(frozen=True)
class HealthBenchRecord:
    """A HealthBench row: the conversation, the physicians' rubric and the completions.

    ``ideal_completion`` is None where the row has no ``ideal_completions_data``;
    ``reference_completions`` are the other completions shown with it (possibly none).
    """

    id: str
    messages: Messages
    rubric: list[ExpertItem]
    ideal_completion: str | None
    reference_completions: list[str]
    tags: list[str]

    @property
    def responses(self) -> list[str]:
        """The completions to score: the ideal one first, then the references."""
        ideal = [] if self.ideal_completion is None else [self.ideal_completion]
        return ideal + self.reference_completions

    @property
    def reference_ranks(self) -> list[int]:
        """Ranks of `responses` (1 = best): the ideal completion above the tied references."""
        return [1] + [2] * len(self.reference_completions) if self.ideal_completion else []


def prompt_text(messages: Messages) -> str:
    """A chat as the text of a template's prompt slot.

    A single user turn is its content; a longer conversation is ``role: content`` turns
    separated by blank lines (as HealthBench's own grader shows it), so a rubric writer or
    verifier sees who said what.
    """
    if len(messages) == 1 and messages[0]["role"] == "user":
        return messages[0]["content"]
    return "\n\n".join(f"{m['role']}: {m['content']}" for m in messages)


class RowChecker:
    """Reads fields of one row, raising `DataError` that names the source, row and field."""

    def __init__(self, source: str, index: int):
        self.source = source
        self.index = index
        self.id_field = "id"  # where `row_id` found the id, for errors about it

    def fail(self, path: str, problem: str) -> NoReturn:
        raise DataError(f"{self.source} row {self.index}: field '{path}' {problem}")

    def get(self, obj: Mapping[str, Any], key: str, path: str) -> Any:
        """``obj[key]``; a missing or null value is an error."""
        value = obj.get(key)
        if value is None:
            self.fail(path, "is missing or null")
        return value

    def mapping(self, value: Any, path: str) -> Mapping[str, Any]:
        if not isinstance(value, Mapping):
            self.fail(path, f"must be an object, got {_show(value)}")
        return value

    def sequence(self, value: Any, path: str, *, allow_empty: bool = True) -> list[Any]:
        if not isinstance(value, (list, tuple)):
            self.fail(path, f"must be a list, got {_show(value)}")
        if not value and not allow_empty:
            self.fail(path, "must not be empty")
        return list(value)

    def string(self, value: Any, path: str, *, allow_blank: bool = False) -> str:
        if not isinstance(value, str):
            self.fail(path, f"must be a string, got {_show(value)}")
        if not allow_blank and not value.strip():
            self.fail(path, "must not be empty")
        return value

    def integer(self, value: Any, path: str, *, minimum: int | None = None,
                nonzero: bool = False) -> int:
        """An int; an integral float passes too (Arrow widens int columns mixed with floats)."""
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(path, f"must be an integer, got {_show(value)}")
        if minimum is not None and value < minimum:
            self.fail(path, f"must be >= {minimum}, got {value}")
        if nonzero and value == 0:
            self.fail(path, "must not be 0")
        return value

    def row_id(self, row: Mapping[str, Any], keys: tuple[str, ...]) -> str:
        """The first of ``keys`` present (a string or an integer), else the row index."""
        for key in keys:
            value = row.get(key)
            if value is not None:
                if isinstance(value, bool) or not isinstance(value, (str, int)) or value == "":
                    self.fail(key, f"must be a non-empty string or an integer, got {_show(value)}")
                self.id_field = key
                return str(value)
        return str(self.index)

    def messages(self, value: Any, path: str) -> Messages:
        """A prompt: a non-empty string (one user turn) or a non-empty list of turns."""
        if isinstance(value, str):
            return [{"role": "user", "content": self.string(value, path)}]
        turns = self.sequence(value, path, allow_empty=False)
        out = []
        for i, turn in enumerate(turns):
            turn = self.mapping(turn, f"{path}[{i}]")
            role = self.string(self.get(turn, "role", f"{path}[{i}].role"), f"{path}[{i}].role")
            if role not in ROLES:
                self.fail(f"{path}[{i}].role", f"must be one of {list(ROLES)}, got {role!r}")
            content = self.string(self.get(turn, "content", f"{path}[{i}].content"),
                                  f"{path}[{i}].content", allow_blank=True)
            out.append({"role": role, "content": content})
        return out


def _show(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def parse_prompt_row(check: RowChecker, row: Mapping[str, Any]) -> PromptRecord:
    """``{prompt: str | [{role, content}], id?}`` (``prompt_id`` is accepted for ``id``)."""
    return PromptRecord(check.row_id(row, ("id", "prompt_id")),
                        check.messages(check.get(row, "prompt", "prompt"), "prompt"))


def parse_anchor_row(check: RowChecker, row: Mapping[str, Any]) -> AnchorRecord:
    """``{prompt, answers: [{answer, rank}], id?}``; answers come back sorted best-first."""
    record_id = check.row_id(row, ("id", "prompt_id"))
    messages = check.messages(check.get(row, "prompt", "prompt"), "prompt")
    answers = []
    for i, item in enumerate(check.sequence(check.get(row, "answers", "answers"), "answers",
                                            allow_empty=False)):
        path = f"answers[{i}]"
        item = check.mapping(item, path)
        text = check.string(check.get(item, "answer", f"{path}.answer"), f"{path}.answer")
        rank = check.integer(check.get(item, "rank", f"{path}.rank"), f"{path}.rank", minimum=1)
        answers.append(Answer(text, rank))
    answers.sort(key=lambda a: a.rank)  # stable: tied answers keep their order
    return AnchorRecord(record_id, messages, answers)


def parse_healthbench_row(check: RowChecker, row: Mapping[str, Any]) -> HealthBenchRecord:
    """A row of HealthBench's ``oss_eval`` schema.

    ``{prompt_id?, prompt: [{role, content}], rubrics: [{criterion, points, tags?}],
    ideal_completions_data: null | {ideal_completion, ideal_completions_ref_completions?},
    example_tags?}``. The rubric needs a positive-points criterion (the score divides by the
    positive points).
    """
    record_id = check.row_id(row, ("prompt_id", "id"))
    messages = check.messages(check.get(row, "prompt", "prompt"), "prompt")
    rubric = []
    for i, item in enumerate(check.sequence(check.get(row, "rubrics", "rubrics"), "rubrics",
                                            allow_empty=False)):
        path = f"rubrics[{i}]"
        item = check.mapping(item, path)
        criterion = check.string(check.get(item, "criterion", f"{path}.criterion"),
                                 f"{path}.criterion")
        points = check.integer(check.get(item, "points", f"{path}.points"), f"{path}.points",
                               nonzero=True)
        tags = [check.string(t, f"{path}.tags[{j}]")
                for j, t in enumerate(check.sequence(item.get("tags") or [], f"{path}.tags"))]
        rubric.append(ExpertItem(criterion, points, tags))
    if not any(item.weight > 0 for item in rubric):
        check.fail("rubrics", "needs at least one criterion with positive points")
    ideal, references = None, []
    data = row.get("ideal_completions_data")
    if data is not None:
        data = check.mapping(data, "ideal_completions_data")
        path = "ideal_completions_data.ideal_completion"
        ideal = check.string(check.get(data, "ideal_completion", path), path)
        path = "ideal_completions_data.ideal_completions_ref_completions"
        references = [check.string(r, f"{path}[{j}]") for j, r in
                      enumerate(check.sequence(data.get("ideal_completions_ref_completions") or [],
                                               path))]
    tags = [check.string(t, f"example_tags[{j}]")
            for j, t in enumerate(check.sequence(row.get("example_tags") or [], "example_tags"))]
    return HealthBenchRecord(record_id, messages, rubric, ideal, references, tags)
