"""TensorBoard event files, optionally a W&B run, and a progress bar for the host loop, written
by process 0 only.

Event files are written with the `tensorboard` package alone (its event-file writer and summary
protos): no TensorFlow, no torch. Scalars are classic `simple_value` summaries, text uses the
text plugin's tensor summaries, so TensorBoard and `EventAccumulator` read both. `wandb` is an
optional dependency, imported only when a W&B run is opened.
"""

from __future__ import annotations

import dataclasses
import html
import os
import sys
import time
from collections.abc import Mapping
from typing import Any, Protocol

import jax
import numpy as np
from etils import epath
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.plugins.text.summary_v2 import text_pb
from tensorboard.summary.writer.event_file_writer import EventFileWriter
from tqdm.auto import tqdm

REWARD_METRIC = "policy/reward"


@dataclasses.dataclass(frozen=True)
class CardLog:
    """A round's rubric cards as the loop writes them: `records` (JSON objects, a line each of
    `cards.jsonl`), `texts` for TensorBoard's and W&B's text panels, and `table` (column
    names, rows) for a W&B table."""

    records: list[dict[str, Any]]
    texts: dict[str, str]
    table: tuple[list[str], list[list[Any]]]


def scalar_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The numeric single-element entries of a host-side metrics dict, as Python floats.

    Anything else (token arrays, strings, per-example vectors) is left out: only scalars have a
    curve to draw.
    """
    out = {}
    for name, value in metrics.items():
        arr = np.asarray(value)
        if arr.size == 1 and arr.dtype.kind in "biuf":
            out[name] = float(arr.reshape(()))
    return out


class SummaryWriter:
    """Scalars and text into one TensorBoard run folder; a no-op on every process but 0."""

    def __init__(self, logdir: str | os.PathLike, *, enabled: bool | None = None) -> None:
        self.enabled = jax.process_index() == 0 if enabled is None else enabled
        self._writer = EventFileWriter(os.fspath(logdir)) if self.enabled else None

    def start(self, step: int) -> None:
        """Marks a (re)start at `step`: TensorBoard drops events of this run with step >= `step`
        written before, i.e. rounds a crashed run logged after its last checkpoint."""
        self._add(event_pb2.Event(step=step, session_log=event_pb2.SessionLog(
            status=event_pb2.SessionLog.START)))

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        summary = summary_pb2.Summary(value=[
            summary_pb2.Summary.Value(tag=tag, simple_value=float(value))
            for tag, value in values.items()
        ])
        self._add(event_pb2.Event(step=step, summary=summary))

    def texts(self, step: int, values: Mapping[str, str]) -> None:
        """Text summaries; TensorBoard renders them as Markdown."""
        summary = summary_pb2.Summary()
        for tag, text in values.items():
            summary.MergeFrom(text_pb(tag, str(text)))
        self._add(event_pb2.Event(step=step, summary=summary))

    def table(self, step: int, tag: str, table: tuple[list[str], list[list[Any]]]) -> None:
        """Nothing: TensorBoard has no tables; the same cards are in its text tab."""

    def flush(self) -> None:
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def _add(self, event: event_pb2.Event) -> None:
        if self._writer is not None:
            event.wall_time = time.time()
            self._writer.add_event(event)


class Writer(Protocol):
    """What the loop logs to: `SummaryWriter` and `WandbWriter` alike."""

    def start(self, step: int) -> None: ...
    def scalars(self, step: int, values: Mapping[str, float]) -> None: ...
    def texts(self, step: int, values: Mapping[str, str]) -> None: ...
    def table(self, step: int, tag: str, table: tuple[list[str], list[list[Any]]]) -> None: ...
    def flush(self) -> None: ...
    def close(self) -> None: ...


# In the workdir: the id of the W&B run that a rerun in the same workdir continues.
WANDB_RUN_ID = "wandb_run_id"


@dataclasses.dataclass(frozen=True)
class WandbSettings:
    """The W&B run to log to beside TensorBoard (`config.logging.wandb_*`)."""

    project: str  # empty: the WANDB_PROJECT variable, else W&B's default project
    run_name: str = ""  # empty: W&B picks a name


class WandbWriter:
    """The scalars and texts of `SummaryWriter`, with the same tags and steps, in a W&B run;
    open it on process 0 only (`open_writers` does).

    The run id is kept in `workdir/wandb_run_id`, so a rerun in the workdir continues the same
    W&B run (`resume="allow"`); W&B's own files go to `workdir/wandb/` (for a local workdir). The
    run config is the loop's run config (config and seed) plus the workdir.
    """

    def __init__(self, settings: WandbSettings, *, workdir: str, config: Mapping[str, Any]
                 ) -> None:
        import wandb  # optional: `pip install 'jaxrubric[wandb]'`

        self._wandb = wandb
        id_file = epath.Path(workdir) / WANDB_RUN_ID
        run_id = id_file.read_text().strip() if id_file.exists() else None
        self._run = wandb.init(
            project=settings.project or None, name=settings.run_name or None, id=run_id,
            resume="allow", config={**config, "workdir": workdir},
            dir=None if "://" in workdir else workdir)
        if run_id is None:
            id_file.write_text(self._run.id)

    def start(self, step: int) -> None:
        """Nothing: W&B cannot drop what a crashed run logged after its last checkpoint. It
        ignores steps below those it has (its steps only increase), so a resumed run's first
        rounds keep their first values, which an exact resume repeats (timings aside)."""

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        self._run.log({tag: float(value) for tag, value in values.items()}, step=step)

    def texts(self, step: int, values: Mapping[str, str]) -> None:
        """Each text as escaped preformatted HTML: shown verbatim (line breaks, code, and model
        output that looks like markup), one media panel per tag with a step slider, like
        TensorBoard's text tab; a table would hold one row per logged step, or be re-logged
        whole every round to gather them."""
        self._run.log({tag: self._wandb.Html(
            f'<pre style="white-space: pre-wrap">{html.escape(str(text))}</pre>')
            for tag, text in values.items()}, step=step)

    def table(self, step: int, tag: str, table: tuple[list[str], list[list[Any]]]) -> None:
        """A W&B table (one per card round: its rows are that round's rubric items)."""
        columns, rows = table
        self._run.log({tag: self._wandb.Table(columns=columns, data=rows)}, step=step)

    def flush(self) -> None:
        """Nothing: W&B's service process takes each row as it is logged."""

    def close(self) -> None:
        """Finishes the run; one closed while an exception propagates shows as failed."""
        if self._run is not None:
            self._run.finish(exit_code=0 if sys.exc_info()[0] is None else 1)
            self._run = None


class Writers:
    """Every write to each writer (TensorBoard, and W&B when enabled): the loop's one logger."""

    def __init__(self, *writers: Writer) -> None:
        self.writers = writers

    def start(self, step: int) -> None:
        for writer in self.writers:
            writer.start(step)

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        for writer in self.writers:
            writer.scalars(step, values)

    def texts(self, step: int, values: Mapping[str, str]) -> None:
        for writer in self.writers:
            writer.texts(step, values)

    def table(self, step: int, tag: str, table: tuple[list[str], list[list[Any]]]) -> None:
        for writer in self.writers:
            writer.table(step, tag, table)

    def flush(self) -> None:
        for writer in self.writers:
            writer.flush()

    def close(self) -> None:
        for writer in self.writers:
            writer.close()


def open_writers(tensorboard_dir: str, wandb: WandbSettings | None, *, workdir: str,
                 config: Mapping[str, Any]) -> Writers:
    """TensorBoard events in `tensorboard_dir`, and the W&B run of `workdir` when `wandb` is
    given (process 0 only; `config` becomes its run config). W&B opens first: when it cannot
    start, no event file is left open."""
    run = ([WandbWriter(wandb, workdir=workdir, config=config)]
           if wandb is not None and jax.process_index() == 0 else [])
    return Writers(SummaryWriter(tensorboard_dir), *run)


# A round metric `<role>/skipped_updates`: optimiser steps skipped for a non-finite loss or
# gradient (`rl.grpo.grpo_update`); the progress line shows it when it is not 0.
SKIPPED_SUFFIX = "/skipped_updates"


class Progress:
    """A tqdm bar over rounds showing the reward (or first scalar metric) and seconds per round;
    silent on every process but 0."""

    def __init__(self, total: int, initial: int = 0, *, enabled: bool | None = None) -> None:
        enabled = jax.process_index() == 0 if enabled is None else enabled
        self._bar = tqdm(total=total, initial=initial, desc="round", unit="round",
                         dynamic_ncols=True, disable=not enabled)

    def update(self, round_: int, metrics: Mapping[str, float], seconds: float) -> None:
        """Moves the bar to `round_` (rounds completed) with this round's scalar metrics."""
        name = REWARD_METRIC if REWARD_METRIC in metrics else next(iter(metrics), None)
        shown = [] if name is None else [f"{name} {metrics[name]:.4g}"]
        shown += [f"{key} {value:g}" for key, value in metrics.items()
                  if key.endswith(SKIPPED_SUFFIX) and value]
        self._bar.set_postfix_str(", ".join([*shown, f"{seconds:.2f} s/round"]), refresh=False)
        self._bar.update(round_ - self._bar.n)

    def write(self, message: str) -> None:
        """Prints a line without breaking the bar (process 0 only)."""
        if not self._bar.disable:
            self._bar.write(message)

    def close(self) -> None:
        self._bar.close()
