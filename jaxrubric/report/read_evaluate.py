"""Reading a `jaxrubric evaluate` output folder (`jaxrubric.eval.common.write_outputs`) into
per-query rubrics with their verdict grids.

Both methods' rows are read: a rubric is named by its row's ``rubric`` (``"generated"`` with a
``run``, ``"expert"``, or DynamicRubric's index) and a response by its ``response`` index;
`verdicts.jsonl` holds one row per (response, item) of a rubric. A rubric's score of a
response is in that response's `scores.jsonl` row: GenRubric's ``scores[kind]`` (a list over
runs for generated rubrics), DynamicRubric's ``rubric_scores[g]``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from jaxrubric.report.data import Evaluation, Item, Query, Rubric
from jaxrubric.jsonl import json_file, json_lines

EVALUATE_FILES = ("rubrics.jsonl", "verdicts.jsonl", "scores.jsonl", "metrics.json")
# The rubric row fields the report shows in their own places; the rest are shown as facts.
_SHOWN = ("id", "rubric", "run", "items", "text", "valid")


def read_evaluation(folder: Path) -> Evaluation:
    """The folder's metrics and its queries, in the order `rubrics.jsonl` first names them."""
    responses: dict[str, list[Mapping[str, Any]]] = {}
    for row in json_lines(folder / "scores.jsonl"):
        responses.setdefault(str(row["id"]), []).append(row)
    for rows in responses.values():
        rows.sort(key=lambda r: int(r["response"]))
    verdicts: dict[tuple[str, Any, Any], dict[tuple[int, int], Mapping[str, Any]]] = {}
    for v in json_lines(folder / "verdicts.jsonl"):
        verdicts.setdefault(_key(v), {})[(int(v["item"]), int(v["response"]))] = v
    rubrics: dict[str, list[Rubric]] = {}
    for row in json_lines(folder / "rubrics.jsonl"):
        query = str(row["id"])
        rubrics.setdefault(query, []).append(
            _rubric(folder, row, responses.get(query, []), verdicts.get(_key(row), {})))
    return Evaluation(metrics=json_file(folder / "metrics.json"), queries=tuple(
        Query(id=q, responses=tuple(responses.get(q, [])), rubrics=tuple(r))
        for q, r in rubrics.items()))


def rubric_label(row: Mapping[str, Any]) -> str:
    """``generated run 2``, ``expert``, ``rubric 0``."""
    kind = row["rubric"]
    if isinstance(kind, int):
        return f"rubric {kind}"
    return f"{kind} run {row['run']}" if "run" in row else str(kind)


def _key(row: Mapping[str, Any]) -> tuple[str, Any, Any]:
    return str(row["id"]), row["rubric"], row.get("run")


def _rubric(folder: Path, row: Mapping[str, Any], responses: list[Mapping[str, Any]],
            verdicts: Mapping[tuple[int, int], Mapping[str, Any]]) -> Rubric:
    """A rubrics.jsonl row with its verdicts on the query's responses and its scores."""
    num = len(responses)
    items = []
    for m, it in enumerate(row["items"]):
        cells = []
        for k in range(num):
            v = verdicts.get((m, k))
            if v is None:
                raise ValueError(
                    f"{folder / 'verdicts.jsonl'} has no verdict of response {k} on item {m} "
                    f"of query {row['id']!r}, {rubric_label(row)}")
            cells.append(v)
        items.append(Item(criterion=it["criterion"], weight=int(it["weight"]), slot=m,
                          p=tuple(float(v["p_yes"]) for v in cells),
                          passed=tuple(bool(v["verdict"]) for v in cells)))
    return Rubric(label=rubric_label(row), items=tuple(items),
                  scores=tuple(_score(r, row) for r in responses), text=row.get("text"),
                  valid=row.get("valid"),
                  facts={k: v for k, v in row.items() if k not in _SHOWN})


def _score(response: Mapping[str, Any], rubric: Mapping[str, Any]) -> float | None:
    """The rubric's score of the response (see the module docstring)."""
    kind = rubric["rubric"]
    if "rubric_scores" in response and isinstance(kind, int):
        value = response["rubric_scores"][kind]
    elif isinstance(response.get("scores"), Mapping):
        value = response["scores"].get(kind)
        if isinstance(value, list):
            value = value[rubric["run"]]
    else:
        value = None
    return None if value is None else float(value)
