"""A toy world's stages (warm starts, generator rounds, compared runs) as a dependency graph,
run side by side in worker processes.

A toy model keeps one to one and a half cores busy (its matmuls are too small for XLA to spread
further), so on a machine with more cores, independent stages can run side by side. Each
stage is seeded by itself and reads only what the stages it depends on saved in the workdir, so
running them in parallel changes no result, only the wall-clock time. `jobs=1` (the worlds'
default) runs them in this process, in order. Even on two cores two workers help once the runs
share their compiled round programs: a compile keeps one core busy while the other stage
computes (`cli.default_toy_jobs`). Worker processes are spawned, so a script that runs a world
with `jobs > 1` must do so under `if __name__ == "__main__":`.

With workers, each stage's output (progress bars, logs) goes to `<log_dir>/<stage>.log`, and
this process prints a line as each stage starts and ends. A SIGTERM to this process is passed
to the workers: a training run checkpoints and stops
(`train.train`), the world stops with the stage named, and a rerun resumes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from pathlib import Path
from typing import Any, Protocol


class Timer(Protocol):
    def record(self, name: str, seconds: float) -> None: ...


@dataclasses.dataclass(frozen=True)
class Stage:
    """`fn(*args)` once every stage named in `after` is done. `fn` is a module-level function
    (workers import it by name) whose outputs go to files."""

    name: str
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    after: tuple[str, ...] = ()


def check_graph(stages: Sequence[Stage]) -> None:
    """Names unique, every dependency an earlier stage (so the list order is a valid serial
    order and the graph has no cycle)."""
    seen: set[str] = set()
    for stage in stages:
        if stage.name in seen:
            raise ValueError(f"stage {stage.name!r} appears twice")
        missing = [d for d in stage.after if d not in seen]
        if missing:
            raise ValueError(f"stage {stage.name!r} runs after {missing}, which are not "
                             "earlier stages")
        seen.add(stage.name)


def run_stages(stages: Sequence[Stage], timer: Timer, jobs: int = 1,
               log_dir: Path | None = None) -> None:
    """Runs every stage once, each after its dependencies, with at most `jobs` at a time;
    `timer.record(name, seconds)` as each ends. A stage's error stops the world (stages
    already running finish first) and is raised here. `log_dir` (needed with `jobs > 1`)
    receives the workers' output."""
    check_graph(stages)
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    if jobs == 1:
        for stage in stages:
            timer.record(stage.name, _timed(stage.fn, stage.args))
        return
    if log_dir is None:
        raise ValueError("run_stages with jobs > 1 needs a log_dir for the workers' output")
    log_dir.mkdir(parents=True, exist_ok=True)
    pids: multiprocessing.SimpleQueue = multiprocessing.get_context("spawn").SimpleQueue()
    pool = ProcessPoolExecutor(max_workers=min(jobs, len(stages)),
                               mp_context=multiprocessing.get_context("spawn"),
                               initializer=_report_pid, initargs=(pids,))
    stop = _Stop(pids)
    main = threading.current_thread() is threading.main_thread()  # where handlers may be set
    previous = signal.signal(signal.SIGTERM, stop.request) if main else None
    try:
        _schedule(stages, pool, timer, jobs, log_dir, stop)
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous)
        pool.shutdown(wait=True, cancel_futures=True)


class _Stop:
    """A SIGTERM received: passed to every worker, including one that registers later (a
    worker still starting when the signal came); no stage starts after it."""

    def __init__(self, pids: multiprocessing.SimpleQueue):
        self.pids = pids
        self.workers: set[int] = set()
        self.signum: int | None = None

    def request(self, signum: int, _frame: Any) -> None:
        self.signum = signum
        self._drain()
        self._kill(self.workers)

    def forward(self) -> None:
        """After a stop: the signal to the workers that registered since."""
        self._kill(self._drain())

    def _drain(self) -> set[int]:
        fresh = set()
        while not self.pids.empty():
            fresh.add(self.pids.get())
        self.workers |= fresh
        return fresh

    def _kill(self, pids: set[int]) -> None:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, self.signum)


def _schedule(stages: Sequence[Stage], pool: ProcessPoolExecutor, timer: Timer, jobs: int,
              log_dir: Path, stop: _Stop) -> None:
    pending = list(stages)
    running: dict[Future, Stage] = {}
    done: set[str] = set()
    while pending or running:
        for stage in list(pending):
            if stop.signum is None and len(running) < jobs and all(d in done
                                                                   for d in stage.after):
                log = log_dir / (re.sub(r"[^\w.-]+", "_", stage.name) + ".log")
                running[pool.submit(_timed, stage.fn, stage.args, log)] = stage
                pending.remove(stage)
                print(f"start: {stage.name} (output: {log})", flush=True)
        if not running:
            raise SystemExit(f"stopped by signal {stop.signum} before {pending[0].name}; rerun "
                             "to resume")
        finished, _ = wait(running, timeout=1.0, return_when=FIRST_COMPLETED)
        if stop.signum is not None:
            stop.forward()
        for future in finished:
            stage = running.pop(future)
            error = future.exception()
            if error is not None:
                wait(running)  # let the others end (a run saves its checkpoint) first
                raise error
            timer.record(stage.name, future.result())
            done.add(stage.name)


def _timed(fn: Callable[..., Any], args: tuple[Any, ...], log: Path | None = None) -> float:
    """`fn(*args)`'s seconds; with `log`, this process's stdout and stderr go to that file
    meanwhile (at the descriptors, so compiled code's and tqdm's output does too)."""
    start = time.perf_counter()
    if log is None:
        fn(*args)
        return time.perf_counter() - start
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(log, "a") as out:
        os.dup2(out.fileno(), 1)
        os.dup2(out.fileno(), 2)
        try:
            fn(*args)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
    return time.perf_counter() - start


def _report_pid(queue: multiprocessing.SimpleQueue) -> None:
    queue.put(os.getpid())

