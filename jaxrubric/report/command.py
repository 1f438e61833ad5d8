"""The `inspect` subcommand: read a folder (`report.read`), write its HTML page
(`report.html`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

DEFAULT_OUT = "report.html"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Registers the `inspect` subcommand on an `add_subparsers()` object."""
    p = subparsers.add_parser(
        "inspect", help="write one self-contained HTML report of what a run's evaluator did",
        description="Curves (quality, Δgap, saturation, spread, invalid rubrics, score-length "
                    "correlation) with the watch's warnings, every rubric card with its "
                    "verdict grid, and the criteria the generator writes most, round by round. "
                    "WORKDIR is a training workdir, a toy world's workdir (its runs overlaid) "
                    "or a `jaxrubric evaluate` output folder.")
    p.add_argument("workdir", metavar="WORKDIR", help="the folder to inspect")
    p.add_argument("--out", help=f"the HTML file to write (default: WORKDIR/{DEFAULT_OUT})")
    p.add_argument("--top", type=int, default=10,
                   help="criteria listed per card round in the round-to-round diff")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Writes the report; a folder of no known kind or an unreadable file is a one-line error
    (exit 2)."""
    from jaxrubric.report.html import render
    from jaxrubric.report.read import read_folder

    if args.top < 1:
        return _error(f"--top must be >= 1, got {args.top}")
    try:
        inspected = read_folder(args.workdir)
    except ValueError as e:  # NotInspectableError, or a file that breaks its schema
        return _error(str(e))
    out = Path(args.out) if args.out else Path(args.workdir) / DEFAULT_OUT
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(inspected, top=args.top), encoding="utf-8")
    runs = f"{len(inspected.runs)} runs, " if inspected.kind == "world" else ""
    print(f"wrote {out} ({inspected.kind}: {runs}{out.stat().st_size // 1024} KiB)")
    return 0


def _error(message: str) -> int:
    print(f"jaxrubric inspect: error: {message}", file=sys.stderr)
    return 2
