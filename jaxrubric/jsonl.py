"""Reading the JSON files a run writes (cards, metrics, evaluations), an unreadable line named by
its file and line."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def json_lines(path: Path) -> Iterator[dict[str, Any]]:
    """The JSON objects of a JSONL file (none when it is absent), blank lines skipped."""
    if not path.is_file():
        return
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path} line {n}: not JSON ({e})") from e
            if not isinstance(row, dict):
                raise ValueError(f"{path} line {n}: not a JSON object")
            yield row


def json_file(path: Path) -> Any:
    """A JSON file's value."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON ({e})") from e
