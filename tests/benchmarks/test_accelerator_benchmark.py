"""`benchmarks/accelerator.py` runs end to end on CPU at its tiny size, so it cannot rot before
an accelerator runs it. No timing is asserted: only that every row is printed with finite
numbers (MFU is n/a on CPU, which has no peak)."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from xla_flags import FAST_COMPILE

pytestmark = pytest.mark.slow  # runs the whole benchmark script

ROOT = Path(__file__).resolve().parents[2]
ROWS = (
    "decode (`sampling.sample`)",
    "decode ceiling: every weight read once per step",
    "policy GRPO update (`role_update`)",
    "verifier tree forward (`verify`)",
    "round: policy samples",
    "round: generator writes rubrics",
    "round: verification + rewards",
    "round: GRPO updates (both roles)",
    "round: whole round",
)
# Rows whose tokens/s and model TFLOP/s are numbers (the round's stages have neither).
THROUGHPUT = ROWS[:4]
FLOP_RATE = (ROWS[0], ROWS[2], ROWS[3], ROWS[-1])


def number(cell: str) -> float:
    value = float(cell.rstrip("%"))
    assert math.isfinite(value), cell
    return value


def test_accelerator_benchmark_tiny_cpu(tmp_path):
    # One CPU device, and XLA:CPU's cheapest code generation: the script compiles about ten
    # programs (the round four times, by prefixes), and their compile is nearly all its time.
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": FAST_COMPILE}
    out = tmp_path / "table.md"
    result = subprocess.run(
        [sys.executable, "benchmarks/accelerator.py", "--size", "tiny", "--dtype", "float32",
         "--repeats", "1", "--out", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert lines[0].startswith("device: cpu") and "jax " in lines[0], lines[0]
    assert out.read_text().splitlines() == lines
    cells = {}
    for line in lines:
        if line.startswith("| ") and not line.startswith("| row "):
            row = [c.strip() for c in line.strip("|").split("|")]
            cells[row[0]] = row
    assert tuple(cells) == ROWS, list(cells)
    for name, (_, work, first_s, ms, tokens_s, tflops, utilisation, _) in cells.items():
        assert work, name
        assert number(first_s) > 0, name
        number(ms)  # a stage is a difference of two times: finite, not necessarily > 0
        assert utilisation == "n/a", (name, utilisation)  # no peak on CPU
        if name in THROUGHPUT:
            assert number(tokens_s) > 0, name
        if name in FLOP_RATE:
            assert number(tflops) > 0, name
    assert number(cells["round: whole round"][3]) > 0
