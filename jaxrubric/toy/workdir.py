"""A toy world's workdir, either world's: its saved config (a workdir built with another one
is refused), the tokenizer, the compilation cache its processes share, and the stage graph
run with each stage's seconds kept.

Every stage writes into the workdir and is skipped when its output is already there, so a
rerun resumes (warm starts and finished runs are cached; an interrupted run resumes from its
checkpoint).
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import jax

import jaxrubric
from jaxrubric.toy import allocator
from jaxrubric.toy import digits_task as task
from jaxrubric.toy import stages as stages_lib
from jaxrubric.toy.config_tree import differences
from jaxrubric.train_loop import ConfigMismatchError

CONFIG_FILE = "toy_config.json"
# Settings a workdir's cache does not depend on: which runs a world compares, and how its final
# evaluation samples (redone whenever the world runs). Any other difference is refused.
REUSABLE_SETTINGS = ("runs", "final_samples")


def prepare_workdir(workdir: str | Path, cfg: Any) -> tuple[Path, Any]:
    """A world's workdir made (absolute), its config (a dataclass) saved, and the toy tokenizer
    built there once; then `use_workdir`: returns the workdir and the tokenizer.

    A workdir that a world with another config (other than its `REUSABLE_SETTINGS`) was saved
    in is refused before anything loads: its cached warm starts and runs would be reused as if
    they were this config's (a default changed since, or another setting)."""
    workdir = Path(workdir).absolute()
    workdir.mkdir(parents=True, exist_ok=True)
    saved, config = workdir / CONFIG_FILE, json.loads(json.dumps(dataclasses.asdict(cfg)))
    if saved.exists():
        there = json.loads(saved.read_text())
        if "round" not in there:
            raise ConfigMismatchError(
                f"{workdir} holds a toy world saved before a world's config held its round "
                "settings under `round` (a field such as policy_beta is "
                "round.policy.beta now): use a new workdir, or delete this one.")
        differ = differences(there, config, REUSABLE_SETTINGS)
        if differ:
            raise ConfigMismatchError(
                f"{workdir} holds a toy world built with another config ({'; '.join(differ)}): "
                "its cached warm starts and runs would be reused. Use a new workdir, or delete "
                "this one.")
    saved.write_text(json.dumps(config, indent=1))
    if not (workdir / "tokenizer" / "tokenizer.json").exists():
        task.build_tokenizer(workdir / "tokenizer")
    return workdir, use_workdir(workdir)


def use_workdir(workdir: Path) -> Any:
    """This process's JAX compilation cache turned on in the workdir (shared by the world's
    processes: a program compiled by one stage is read by the next), and the toy tokenizer.
    Every program is cached, the sub-second ones too: a run stage compiles dozens of those
    (eager operations, initialisation), and reading them back is faster."""
    jax.config.update("jax_compilation_cache_dir", str(workdir / "jax_cache"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    return jaxrubric.load_tokenizer(workdir / "tokenizer")


class StageTimer:
    """Wall-clock seconds of a world's stages, printed and kept in a JSON file (a rerun that
    finds a stage cached records its few seconds of loading instead): where a run's time goes."""

    def __init__(self, path: Path):
        self.path = path
        self.seconds: dict[str, float] = (json.loads(path.read_text()) if path.exists() else {})

    def record(self, name: str, seconds: float) -> None:
        self.seconds[name] = round(seconds, 1)
        self.path.write_text(json.dumps(self.seconds, indent=1))
        print(f"time: {name} {self.seconds[name]:.1f} s", flush=True)


def run_world(workdir: Path, graph: list[stages_lib.Stage], jobs: int) -> None:
    """Runs either world's stage graph (`toy/stages.py`), each stage's seconds and the whole
    world's wall clock ("world") kept in `workdir/timings.json`; malloc keeps what XLA frees
    in every process that runs a stage (`toy/allocator.py`)."""
    allocator.keep_freed_memory()
    timings = StageTimer(workdir / "timings.json")
    start = time.perf_counter()
    stages_lib.run_stages(graph, timings, jobs, workdir / "logs")
    timings.record("world", time.perf_counter() - start)
