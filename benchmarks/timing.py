"""Shared timing for the benchmark scripts (run as `python benchmarks/NAME.py`, which puts this
folder on the import path)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import jax


def first_and_best(fn: Callable[[], object], repeats: int) -> tuple[float, float]:
    """Wall time of the first call of `fn()` (which compiles) and the best of `repeats` calls
    after it. `fn` returns when its work is done (block on JAX results inside it)."""
    start = time.perf_counter()
    fn()
    first = time.perf_counter() - start
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return first, min(times)


def best_time(fn, args, repeats: int) -> float:
    """Best wall time of `fn(*args)` over `repeats` runs, after one run that compiles."""
    return first_and_best(lambda: jax.block_until_ready(fn(*args)), repeats)[1]


def load_average() -> float:
    """The 1-minute load average (the benchmarks print it before and after their runs: on a
    shared box, a ratio measured in one run holds better than an absolute time)."""
    return os.getloadavg()[0]


def load_note(before: float) -> str:
    """`load average (1 min) B before, A after, N cores`, A read now."""
    return (f"load average (1 min) {before:.1f} before, {load_average():.1f} after, "
            f"{os.cpu_count()} cores")
