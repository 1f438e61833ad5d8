"""Shared timing for the benchmark scripts (run as `python benchmarks/NAME.py`, which puts this
folder on the import path)."""

from __future__ import annotations

import time

import jax


def best_time(fn, args, repeats: int) -> float:
    """Best wall time of `fn(*args)` over `repeats` runs, after one run that compiles."""
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return min(times)
