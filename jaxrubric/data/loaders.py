"""Loaders: a local JSONL / JSON / parquet file or a hub data set, every row validated into
a record.

JSON text is parsed here, row by row, so a bad value reaches the validator exactly as it was
written and a syntax error names its row and line; parquet files and hub data sets go through
`datasets`, whose import alone costs ~2 s (paid only where it is needed). With
``skip_bad_rows=True`` a bad row is left out and its error kept in `Loaded.problems`, so
the caller always learns how many rows were dropped and why.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Generic, TypeVar

from jaxrubric.data.schemas import (
    AnchorRecord,
    DataError,
    HealthBenchRecord,
    PromptRecord,
    RowChecker,
    parse_anchor_row,
    parse_healthbench_row,
    parse_prompt_row,
)

T = TypeVar("T")

_SUFFIXES = (".jsonl", ".json", ".parquet")


@dataclasses.dataclass(frozen=True)
class Loaded(Generic[T]):
    """The valid records of a source, and one error message per row that was skipped."""

    source: str
    records: list[T]
    problems: list[str]

    @property
    def skipped(self) -> int:
        return len(self.problems)


def _decode_utf8(path: Path) -> str:
    """JSON text must be UTF-8: a stray byte is an error naming its row (counted as
    `_json_lines` counts them, without blank lines), line and offset."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        before = data[:e.start].split(b"\n")[:-1]  # the whole lines before the bad byte's
        row = sum(1 for line in before if line.strip())
        where = (f"row {row} (line {len(before) + 1})" if path.suffix == ".jsonl"
                 else f"line {len(before) + 1}")
        raise DataError(f"{path} {where}, byte offset {e.start}: byte 0x{data[e.start]:02x} is "
                        "not UTF-8") from None


def _json_lines(name: str, text: str) -> list[Any]:
    """One value per non-blank line (blank lines are not rows)."""
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise DataError(f"{name} row {len(rows)} (line {number}): not valid JSON: {e.msg} "
                            f"at column {e.colno}") from None
    return rows


def _json_rows(name: str, text: str, suffix: str) -> list[Any]:
    """The rows of a .jsonl file, or of a .json file holding an array of rows, one object
    (one row) or JSON lines (as many hub exports are, whatever their extension)."""
    if suffix == ".jsonl":
        return _json_lines(name, text)
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        if e.msg != "Extra data":
            raise DataError(f"{name} line {e.lineno}: not valid JSON: {e.msg} at column "
                            f"{e.colno}") from None
        return _json_lines(name, text)
    return value if isinstance(value, list) else [value]


def read_rows(source: str | os.PathLike, *, split: str = "train") -> Sequence[Mapping[str, Any]]:
    """The raw rows of a local file (by extension: .jsonl, .json, .parquet) or a hub data set.

    A path that exists, or that ends in a known extension, is a local file; anything else is
    a hub name, loaded with ``split``. Failures (missing file, unparsable JSON, unreachable
    hub) raise `DataError` naming the source (and, for JSON, the row and line).
    """
    name = str(source)
    path = Path(name)
    suffix = path.suffix.lower()
    if path.exists() or suffix in _SUFFIXES:
        if not path.is_file():
            raise DataError(f"{name}: no such file")
        if suffix not in _SUFFIXES:
            raise DataError(f"{name}: unsupported file type {suffix!r}; use one of "
                            f"{sorted(_SUFFIXES)}")
        if path.stat().st_size == 0:
            raise DataError(f"{name}: the file is empty")
        if suffix in (".jsonl", ".json"):
            return _json_rows(name, _decode_utf8(path), suffix)
    import datasets

    try:
        if suffix == ".parquet":
            return datasets.load_dataset("parquet", data_files=name, split="train")
        return datasets.load_dataset(name, split=split)
    except Exception as e:  # datasets wraps Arrow and hub errors in many types
        cause = f" ({e.__cause__})" if e.__cause__ is not None else ""
        raise DataError(f"{name}: cannot be read as a data set: {type(e).__name__}: {e}{cause}"
                        ) from e


def _load(source: str | os.PathLike, parse: Callable[[RowChecker, Mapping[str, Any]], T], *,
          skip_bad_rows: bool, split: str) -> Loaded[T]:
    """Validates every row with ``parse``; ids must be unique."""
    name = str(source)
    records: list[T] = []
    problems: list[str] = []
    seen: dict[str, int] = {}
    count = 0
    for index, row in enumerate(read_rows(source, split=split)):
        count += 1
        check = RowChecker(name, index)
        try:
            if not isinstance(row, Mapping):
                raise DataError(f"{name} row {index}: must be an object, got {type(row).__name__}")
            record = parse(check, row)
            if record.id in seen:
                check.fail(check.id_field, f"repeats the id {record.id!r} of row {seen[record.id]}")
        except DataError as e:
            if not skip_bad_rows:
                raise
            problems.append(str(e))
            continue
        seen[record.id] = index
        records.append(record)
    if count == 0:
        raise DataError(f"{name}: has no rows")
    return Loaded(name, records, problems)


def load_prompts(source: str | os.PathLike, *, skip_bad_rows: bool = False,
                 split: str = "train") -> Loaded[PromptRecord]:
    """Prompts: rows ``{prompt: str | [{role, content}], id?}``."""
    return _load(source, parse_prompt_row, skip_bad_rows=skip_bad_rows, split=split)


def load_anchors(source: str | os.PathLike, *, skip_bad_rows: bool = False,
                 split: str = "train") -> Loaded[AnchorRecord]:
    """Nectar-style ranked answers: rows ``{prompt, answers: [{answer, rank}], id?}``."""
    return _load(source, parse_anchor_row, skip_bad_rows=skip_bad_rows, split=split)


def load_healthbench(source: str | os.PathLike, *, skip_bad_rows: bool = False,
                     split: str = "train") -> Loaded[HealthBenchRecord]:
    """HealthBench rows (see `jaxrubric.data.schemas.parse_healthbench_row`)."""
    return _load(source, parse_healthbench_row, skip_bad_rows=skip_bad_rows, split=split)
