"""TensorBoard event files and a progress bar for the host loop, written by process 0 only.

Event files are written with the `tensorboard` package alone (its event-file writer and summary
protos): no TensorFlow, no torch. Scalars are classic `simple_value` summaries, text uses the
text plugin's tensor summaries, so TensorBoard and `EventAccumulator` read both.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.plugins.text.summary_v2 import text_pb
from tensorboard.summary.writer.event_file_writer import EventFileWriter
from tqdm.auto import tqdm

REWARD_METRIC = "policy/reward"


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
