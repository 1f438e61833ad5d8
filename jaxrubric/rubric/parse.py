"""Text parser for free-form rubric output.

Generators do not always follow the grammar (a model evaluated zero-shot, a rubric copied from
a dataset), so this parser accepts the formats such output comes in and never raises: whatever
it cannot use is skipped and explained in ``ParsedRubric.problems``, so a caller can reward,
log or reject a malformed rubric instead of crashing a training run.

Accepted formats, tried in this order (the first that yields a rubric wins):

1. JSON inside a fenced code block (```json ... ```, the fence opening a line);
2. the whole text as JSON;
3. the line format ``[w] criterion``, one item per line (used when it finds an item);
4. JSON embedded in prose, decoded from the first ``[{`` or ``{"`` and followed by anything.

A JSON item object names its text ``criterion`` (or ``description`` / ``text``) and its weight
``weight`` (or ``points``, HealthBench's field). The array may be wrapped in an object under
``rubric`` / ``rubrics`` / ``items`` / ``criteria`` (nested wrappers too, a few levels deep),
and a lone item object counts as a one-item rubric.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

# Weights end up in int32 arrays on the device; anything larger is a generation accident.
_MAX_ABS_WEIGHT = 2**31 - 1
# Wrapping objects deeper than this are not rubric output; bounding the walk keeps it cheap.
_MAX_WRAPPING = 4

_CRITERION_KEYS = ("criterion", "description", "text")
_WEIGHT_KEYS = ("weight", "points")
_WRAPPER_KEYS = frozenset({"rubric", "rubrics", "items", "criteria"})

# An optional bullet (-, *, •, +) or numbering (1.  1)  (1)) before the bracketed weight.
_BULLET = re.compile(r"(?:[-*•+]\s*|\(?[0-9]+[.)]\s*)?")
_WEIGHT_TOKEN = re.compile(r"([+-]?)([0-9]+)(?:\.([0-9]+))?")
# A fence opens at the start of a line, so text in the line format (every line opening with
# its weight) can never contain one and its round trip stays exact.
_FENCE = re.compile(r"^[ \t]*```[ \t]*[A-Za-z0-9_+-]*[ \t]*\n(.*?)```", re.S | re.M)
_EMBEDDED_JSON = re.compile(r"\[\s*\{|\{\s*\"")
_JSON_LIKE = re.compile(r"\s*(?:\{|\[\s*[{\]])")


@dataclass(frozen=True)
class RubricItem:
    """One criterion and its integer weight (negative weights penalise, as in GenRubric)."""

    criterion: str
    weight: int


@dataclass
class ParsedRubric:
    """Items that parsed, plus one human-readable line per thing that was skipped and why."""

    items: list[RubricItem] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def parse_rubric(
    text: str,
    *,
    weight_range: tuple[int, int] | None = None,
    allow_negative: bool = True,
) -> ParsedRubric:
    """Parse rubric text in any accepted format; never raises.

    ``weight_range`` is an inclusive ``(low, high)`` bound on weights. Weights must be
    integers (an integral float such as ``3.0`` counts as ``3``) and nonzero; negative weights
    are dropped when ``allow_negative`` is false. Problems name the 1-based line (line
    format) or the 0-based array index (JSON) of what was skipped.
    """
    if not isinstance(text, str):
        return ParsedRubric([], [f"expected a str, got {type(text).__name__}"])
    rules = (weight_range, allow_negative)
    notes: list[str] = []
    for block in _FENCE.findall(text):
        rubric = _try_json(block, True, rules, notes)
        if rubric is not None:
            return _finish(rubric)
    rubric = _try_json(text, True, rules, notes)
    if rubric is not None:
        return _finish(rubric)
    lines = _parse_lines(text, rules)
    if lines.items:
        return lines
    embedded = _EMBEDDED_JSON.search(text)
    if embedded is not None:
        rubric = _try_json(text[embedded.start() :], False, rules, notes)
        if rubric is not None:
            return _finish(rubric)
    lines.problems.extend(dict.fromkeys(notes))
    return _finish(lines)


def format_rubric(items: Iterable[RubricItem]) -> str:
    """Write items in the canonical line format, one ``[w] criterion`` per line.

    Raises ``ValueError`` for an item that would not parse back as itself (weight zero or not
    an int, criterion empty, padded with whitespace or spanning lines), so a round trip
    through ``parse_rubric`` is exact.
    """
    lines = []
    for item in items:
        weight, criterion = item.weight, item.criterion
        if isinstance(weight, bool) or not isinstance(weight, int) or weight == 0:
            raise ValueError(f"weight must be a nonzero int, got {weight!r}")
        if abs(weight) > _MAX_ABS_WEIGHT:
            raise ValueError(f"weight {weight} does not fit in int32")
        if not isinstance(criterion, str) or criterion.splitlines() != [criterion]:
            raise ValueError(f"criterion must be a single line of text, got {criterion!r}")
        if criterion != criterion.strip():
            raise ValueError(f"criterion has surrounding whitespace: {criterion!r}")
        lines.append(f"[{weight}] {criterion}")
    return "\n".join(lines)


def _finish(rubric: ParsedRubric) -> ParsedRubric:
    if not rubric.items:
        rubric.problems.append("no rubric items found")
    return rubric


def _try_json(
    candidate: str, whole: bool, rules: tuple, notes: list[str]
) -> ParsedRubric | None:
    """The rubric held by ``candidate`` as JSON, or None; on failure a note is added when the
    candidate looked like JSON, to explain an empty result. ``whole`` demands that the JSON
    fill the candidate; otherwise prose may follow it."""
    value, error = _decode_json(candidate, whole)
    entries = _item_list(value) if error is None else None
    if entries is not None:
        return _parse_json_entries(entries, rules)
    if _JSON_LIKE.match(candidate):
        notes.append(error or "JSON value holds no rubric item list")
    return None


def _decode_json(candidate: str, whole: bool) -> tuple[object, str | None]:
    """Decode ``candidate`` as JSON, returning ``(value, None)`` or ``(None, reason)``."""
    try:
        if whole:
            return json.loads(candidate), None
        return json.JSONDecoder().raw_decode(candidate)[0], None
    except RecursionError:
        return None, "invalid JSON: nested too deeply"
    except ValueError as err:  # JSONDecodeError, or an integer too long to convert
        return None, f"invalid JSON: {err}"


def _item_list(value: object) -> list | None:
    """The list of item entries inside a decoded JSON value, or None when there is none."""
    for _ in range(_MAX_WRAPPING):
        if isinstance(value, list):
            if not value or any(isinstance(entry, dict) for entry in value):
                return value
            return None
        if not isinstance(value, dict):
            return None
        if any(key in value for key in _CRITERION_KEYS):
            return [value]
        value = next(
            (inner for key, inner in value.items() if key.lower() in _WRAPPER_KEYS), None
        )
    return None


def _parse_json_entries(entries: list, rules: tuple) -> ParsedRubric:
    rubric = ParsedRubric()
    for index, entry in enumerate(entries):
        outcome = _json_item(entry, rules)
        if isinstance(outcome, RubricItem):
            rubric.items.append(outcome)
        else:
            rubric.problems.append(f"item[{index}]: {outcome}")
    return rubric


def _json_item(entry: object, rules: tuple) -> RubricItem | str:
    """A RubricItem, or the reason the entry was skipped."""
    if not isinstance(entry, dict):
        return f"not an object ({type(entry).__name__})"
    criterion_key = next((key for key in _CRITERION_KEYS if key in entry), None)
    if criterion_key is None:
        return "missing criterion"
    criterion = entry[criterion_key]
    if not isinstance(criterion, str):
        return f"criterion is a {type(criterion).__name__}, not a string"
    criterion = criterion.strip()
    if not criterion:
        return "empty criterion"
    weight_key = next((key for key in _WEIGHT_KEYS if key in entry), None)
    if weight_key is None:
        return "missing weight"
    weight = _json_weight(entry[weight_key])
    if isinstance(weight, str):
        return weight
    problem = _check_weight(weight, *rules)
    return problem if problem is not None else RubricItem(criterion, weight)


def _json_weight(value: object) -> int | str:
    """The weight as an int, or the reason it is not one (bools and strings are rejected)."""
    if isinstance(value, str):
        return f"weight {_show(value)} is a string, not a number"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"weight is a {type(value).__name__}, not a number"
    if isinstance(value, float):
        if not math.isfinite(value) or not value.is_integer():
            return f"weight {_show(value)} is not an integer"
        return int(value)
    return value


def _check_weight(
    weight: int, weight_range: tuple[int, int] | None, allow_negative: bool
) -> str | None:
    if weight == 0:
        return "weight 0 carries nothing"
    if abs(weight) > _MAX_ABS_WEIGHT:
        return f"weight {_show(weight)} does not fit in int32"
    if weight < 0 and not allow_negative:
        return f"negative weight {weight} not allowed"
    if weight_range is not None and not weight_range[0] <= weight <= weight_range[1]:
        return f"weight {weight} outside [{weight_range[0]}, {weight_range[1]}]"
    return None


def _parse_lines(text: str, rules: tuple) -> ParsedRubric:
    rubric = ParsedRubric()
    for number, line in enumerate(text.splitlines(), start=1):
        outcome = _line_item(line, rules)
        if isinstance(outcome, RubricItem):
            rubric.items.append(outcome)
        elif outcome is not None:
            rubric.problems.append(f"line {number}: {outcome}: {_show(line.strip())}")
    return rubric


def _line_item(line: str, rules: tuple) -> RubricItem | str | None:
    """A RubricItem, the reason a would-be item was skipped, or None for a non-item line."""
    stripped = line.strip()
    body = stripped[_BULLET.match(stripped).end() :]
    if not body.startswith("["):
        return None
    close = body.find("]")
    if close < 0:
        return "unclosed '[' around the weight"
    weight = _token_weight(body[1:close].strip())
    if isinstance(weight, str):
        return weight
    criterion = body[close + 1 :].strip()
    if not criterion:
        return "empty criterion"
    problem = _check_weight(weight, *rules)
    return problem if problem is not None else RubricItem(criterion, weight)


def _token_weight(token: str) -> int | str:
    """The weight written between the brackets as an int, or the reason it is not one."""
    match = _WEIGHT_TOKEN.fullmatch(token)
    if match is None:
        return f"weight {_show(token)} is not a number"
    sign, whole, fraction = match.groups()
    if fraction is not None and fraction.strip("0"):
        return f"weight {_show(token)} is not an integer"
    if len(whole.lstrip("0")) > 10:
        return f"weight {_show(token)} does not fit in int32"
    return int(sign + (whole.lstrip("0") or "0"))


def _show(value: str | int | float) -> str:
    """A short repr for problem messages, so a huge input cannot bloat them."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
