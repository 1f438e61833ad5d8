"""The host loop of training: feeds batches to one jitted round, checkpoints, logs.

The loop knows nothing about policies or rubrics; it drives any `Task` (a pytree state and one
compiled `round_step`), so it is built and tested on a toy task and reused by the co-evolution
round. Resuming is exact: the state, the data position and the base rng key are checkpointed
together, and round r always uses `jax.random.fold_in(key, r)`.

Checkpoints (orbax `CheckpointManager`, async) live in `workdir/checkpoints/<round>/` with two
items, `state` (the whole state pytree) and `meta` (JSON: round, data position, rng key data,
the config and its fingerprint, last metrics and eval metrics); TensorBoard events go to
`workdir/tensorboard/`, and the same scalars and texts to a W&B run when one is asked for. The
workdir also holds what `jaxrubric inspect` reads: the logged scalars (`metrics.jsonl`), the
evaluations (`eval_history.jsonl`), rubric cards (`cards.jsonl`) and the watch's alarms
(`watch.jsonl`).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from jaxrubric import fault_log, host_agreement, peer_watch, resume
from jaxrubric import mfu as mfu_lib
from jaxrubric.logging_utils import (SKIPPED_SUFFIX, CardLog, Progress, WandbSettings, Writers,
                                     open_writers, scalar_metrics)
from jaxrubric.resume import DamagedCheckpointError
from jaxrubric.state_digest import state_digest
from jaxrubric.watch import Alarm, RewardWatch, WatchSettings
from jaxrubric.workdir_lock import WorkdirLock

PyTree = Any
EvalFn = Callable[[PyTree, int], Mapping[str, Any]]

CHECKPOINT_DIR = "checkpoints"
TENSORBOARD_DIR = "tensorboard"
EVAL_HISTORY = "eval_history.jsonl"  # one JSON line of eval scalars per evaluation
METRICS_HISTORY = "metrics.jsonl"  # one JSON line of the logged scalars per logged round
CARDS = "cards.jsonl"  # one JSON line per rubric card
WATCH_LOG = "watch.jsonl"  # one JSON line per alarm of the watch
GENERATED_TOKENS = "tokens/generated"  # a round metric the loop turns into tokens/s


class Task(Protocol):
    """What the host loop drives. Rounds are numbered from 1; `batch(p)` is the batch at data
    position p (one batch per round, positions from 0).

    `text_samples` may be left out. It is called on every process (it may run collectives);
    only process 0's answer is written.
    """

    def init_state(self, rng: jax.Array) -> PyTree:
        """A fresh state, placed with its shardings (may load Hugging Face checkpoints)."""

    def abstract_state(self) -> PyTree:
        """The state as `jax.ShapeDtypeStruct`s carrying shardings: the restore target."""

    def round_step(self, state: PyTree, batch: PyTree, rng: jax.Array
                   ) -> tuple[PyTree, Mapping[str, Any]]:
        """One round, jitted with the state donated (the batch must not be donated). The new
        state keeps the shardings of `abstract_state` (pin `out_shardings`) so that a resumed run
        runs the same program. Metrics: a mapping of replicated device (or host) scalars, or a
        result whose `scalars` is one, its other fields (e.g. token outputs) left on the
        devices: only scalars are fetched every round."""

    def batch(self, position: int) -> PyTree:
        """The deterministic batch at a data position (a per-host shard is allowed)."""

    def text_samples(self, state: PyTree, batch: PyTree, metrics: Mapping[str, Any]
                     ) -> Mapping[str, str] | None:
        """A few texts (e.g. prompt, responses, rubric) for TensorBoard, from the round's
        metrics as `round_step` returned them (fetch only the rows written)."""

    def cards(self, state: PyTree, batch: PyTree, metrics: Mapping[str, Any], round_: int
              ) -> CardLog:
        """The round's rubric cards (fetch only the rows they show); may be left out."""

    # Optional: `round_flops: float`, the model FLOPs of one round, for MFU logging.


class ConfigMismatchError(ValueError):
    """The workdir holds a checkpoint of a run with another config or seed."""


class NonFiniteError(RuntimeError):
    """Training stopped: updates kept failing, or the state went non-finite (never saved)."""


def run_training(task: Task, *, workdir: str | os.PathLike, rounds: int, seed: int = 0,
                 checkpoint_every: int, keep_checkpoints: int | None = None,
                 log_every: int = 1, eval_fn: EvalFn | None = None,
                 eval_every: int | None = None, config: Any = None,
                 allow_config_change: bool = False, profile_round: int | None = None,
                 max_skipped_rounds: int = 3, fallback: bool = True,
                 wandb: WandbSettings | None = None,
                 config_defaults: Any = None,
                 saved_config: Callable[[Any], Any] | None = None, card_every: int = 0,
                 watch: WatchSettings | None = None) -> dict[str, Any]:
    """Runs rounds until `rounds` have been completed in `workdir`, resuming from its latest
    checkpoint, and returns a summary.

    Args:
      task: the state and the round (see `Task`).
      workdir: holds `checkpoints/` and `tensorboard/` (with `wandb`, also `wandb_run_id` and
        `wandb/`); rerunning with it resumes.
      rounds: total number of rounds of the run (not rounds to add).
      seed: base rng key `jax.random.key(seed)`; a resumed run uses the checkpointed key.
      checkpoint_every: save after every round that is a multiple of this; the final round
        and a round stopped by SIGTERM are always saved.
      keep_checkpoints: how many most recent checkpoints to keep (None: all).
      log_every: write TensorBoard scalars (and text samples) every this many rounds and at the
        final round.
      eval_fn: `eval_fn(state, round) -> metrics`, called on every process before the first
        round of a fresh run (round 0), every `eval_every` rounds (None: after the final round
        only); its scalars are logged under `eval/` and appended to `workdir/eval_history.jsonl`.
      config: what defines the run (a mapping or `ml_collections.ConfigDict`), fingerprinted
        together with the seed; resuming under another fingerprint raises
        `ConfigMismatchError` unless `allow_config_change`. Loop arguments (rounds, intervals)
        are not part of it and may change between runs.
      config_defaults: the defaults of `config`'s keys (same nesting): a key the checkpoint's
        config lacks that has its default now is not a change (a key added to the code since
        the checkpoint was written), so older runs still resume.
      saved_config: reads a checkpoint's run config (`{"config": ..., "seed": ...}`) in
        today's layout before it is compared, so a run saved before a key moved still
        resumes.
      profile_round: capture a `jax.profiler` trace of this round into the TensorBoard folder
        (its profile tab splits the compiled round into its stages, op by op).
      max_skipped_rounds: stop with `NonFiniteError` once a `<name>/skipped_updates` metric
        (updates skipped for a non-finite loss or gradient) has been non-zero this many rounds
        in a row. Independently, a state that is not finite is never checkpointed: the run
        stops instead, and the checkpoints already saved are kept.
      fallback: every checkpoint carries a digest of its state; resuming, a checkpoint that
        cannot be read or does not match it is reported and moved aside, and the run resumes
        from the newest one that verifies. False: stop with `DamagedCheckpointError` instead.
      wandb: also log to this W&B run (process 0, needs `wandb`): the same scalars and texts,
        the run config as run config; a rerun in `workdir` continues the same W&B run.
      card_every: every this many rounds (0: never), the task's `cards` go to
        `workdir/cards.jsonl`, the text panels and a W&B table.
      watch: the reward-hacking watch (`jaxrubric.watch`), fed every round and evaluation;
        its alarms are printed, logged as `watch/<kind>` and to `workdir/watch.jsonl`, and with
        `watch.stop` the run saves the round and stops.

    Returns:
      `final_round` (rounds completed), `metrics` (scalar metrics of the last round run, or of
      the checkpoint when nothing ran), `eval` (last eval scalars, {} if none), `resumed_from`
      (the checkpoint round resumed from, None on a fresh start), `preempted` (stopped by
      SIGTERM after saving: the caller should exit 0 and skip any post-training work) and
      `alarms` (the watch's, of this process's rounds).
    """
    _check_positive(rounds=rounds, checkpoint_every=checkpoint_every, log_every=log_every,
                    keep_checkpoints=keep_checkpoints, eval_every=eval_every,
                    card_every=card_every or None)
    workdir = _absolute(workdir)
    run_config = _canonical({"config": config, "seed": seed})
    fingerprint = hashlib.sha256(json.dumps(run_config, sort_keys=True).encode()).hexdigest()
    lock = WorkdirLock.acquire(workdir) if jax.process_index() == 0 else None
    if lock is not None and lock.stale_owner:
        _say(f"{workdir}: took over a stale lock of a run that is gone ({lock.stale_owner})")
    try:
        manager = _checkpoint_manager(os.path.join(workdir, CHECKPOINT_DIR), checkpoint_every,
                                      keep_checkpoints)
    except BaseException:
        if lock is not None:
            lock.release()
        raise
    progress: Progress | None = None
    writer: Writers | None = None
    details = fault_log.details_file(workdir, jax.process_index())
    try:
        with _sigterm_flag() as sigterm:
            latest = max(host_agreement.union(manager.all_steps()), default=None)
            if latest is not None:  # a finished run needs no state: check its meta alone
                meta = resume.read_meta(manager, latest, details)
                if meta is not None and rounds <= latest:
                    _check_fingerprint(meta, fingerprint, run_config, allow_config_change,
                                       _canonical({"config": config_defaults}), saved_config)
                    _say(f"checkpoint at round {latest} already covers rounds={rounds}: "
                         "nothing to do")
                    return _summary(latest, meta["metrics"], meta["eval"], latest, False)
            restored = resume.restore_newest_good(manager, task.abstract_state, fallback,
                                                  details, _say)
            resumed_from = None if restored is None else restored[0]
            if restored is None:
                key = jax.random.key(seed)
                state = task.init_state(jax.random.fold_in(key, 0))
                done, position, last_scalars, eval_scalars = 0, 0, {}, {}
            else:
                _, meta, state = restored
                _check_fingerprint(meta, fingerprint, run_config, allow_config_change,
                                       _canonical({"config": config_defaults}), saved_config)
                key = jax.random.wrap_key_data(np.asarray(meta["rng_key_data"], np.uint32),
                                               impl=meta["rng_impl"])
                done, position = meta["round"], meta["position"]
                last_scalars, eval_scalars = meta["metrics"], meta["eval"]
                _say(f"resumed from round {resumed_from}")

            writer = open_writers(os.path.join(workdir, TENSORBOARD_DIR), wandb,
                                  workdir=workdir, config=run_config)
            writer.start(done + 1)

            def evaluate(round_: int) -> tuple[dict[str, float], float]:
                start = time.perf_counter()
                scalars = {name if name.startswith("eval/") else f"eval/{name}": value
                           for name, value in scalar_metrics(
                               jax.device_get(eval_fn(state, round_))).items()}
                _append_lines(workdir, EVAL_HISTORY, [{"round": round_, **scalars}])
                return scalars, time.perf_counter() - start

            if eval_fn is not None and resumed_from is None:
                eval_scalars, _ = evaluate(0)
                writer.scalars(0, eval_scalars)
            progress = Progress(total=rounds, initial=done)
            text_samples = getattr(task, "text_samples", None)
            cards = getattr(task, "cards", None) if card_every else None
            watcher = RewardWatch(watch) if watch is not None else None
            alarms: list[Alarm] = []
            key_meta = {"rng_key_data": np.asarray(jax.random.key_data(key)).tolist(),
                        "rng_impl": str(jax.random.key_impl(key))}
            preempted = False
            skips = _SkipCounter(max_skipped_rounds)
            batch = task.batch(position)
            tick = time.perf_counter()
            for round_ in range(done + 1, rounds + 1):
                if round_ == profile_round:
                    jax.profiler.start_trace(os.path.join(workdir, TENSORBOARD_DIR))
                state, metrics = task.round_step(state, batch, jax.random.fold_in(key, round_))
                if round_ == profile_round:
                    jax.block_until_ready(state)
                    jax.profiler.stop_trace()
                position += 1
                final = round_ == rounds
                # Built on the host while the device runs the round.
                next_batch = None if final else task.batch(position)
                # Only scalars are fetched every round; outputs stay on the device until a text
                # sample reads the few rows it writes.
                last_scalars = scalar_metrics(jax.device_get(_scalars(metrics)))
                # Fetch to fetch: host work (batches, logging, the blocking part of saves) counts.
                seconds, tick = time.perf_counter() - tick, time.perf_counter()
                skips.record(last_scalars, round_, manager.latest_step())
                preempted = _stop_requested(sigterm, manager, round_)
                raised = watcher.after_round(round_, last_scalars) if watcher else []

                logged = {**last_scalars, "time/round_s": seconds,
                          **_throughput(task, seconds, first=round_ == done + 1)}
                if GENERATED_TOKENS in last_scalars:
                    logged["throughput/tokens_per_s"] = last_scalars[GENERATED_TOKENS] / seconds
                if eval_fn is not None and not preempted and (
                        final or (eval_every is not None and round_ % eval_every == 0)):
                    eval_scalars, eval_seconds = evaluate(round_)
                    tick += eval_seconds  # evaluation is not part of the next round's time
                    logged |= {**eval_scalars, "time/eval_s": eval_seconds}
                    raised += watcher.after_evaluation(round_, eval_scalars) if watcher else []
                if raised:
                    alarms += raised
                    _raise_alarms(workdir, writer, progress, raised)
                    logged |= {f"watch/{a.kind}": 1.0 for a in raised}
                    # watch.stop: the run stops here with this round saved, as on SIGTERM.
                    preempted = preempted or watch.stop
                if final or preempted or raised or round_ % log_every == 0:
                    writer.scalars(round_, logged)
                    _append_lines(workdir, METRICS_HISTORY, [{"round": round_, **logged}])
                    texts = text_samples(state, batch, metrics) if text_samples else None
                    if texts:
                        writer.texts(round_, texts)
                if cards is not None and round_ % card_every == 0:
                    log = cards(state, batch, metrics, round_)
                    _append_lines(workdir, CARDS, log.records)
                    writer.texts(round_, log.texts)
                    writer.table(round_, "cards/items", log.table)

                if final or preempted or round_ % checkpoint_every == 0:  # a round to save
                    _check_finite(state, round_, manager.latest_step())
                saving = final or preempted or round_ % checkpoint_every == 0
                meta = {"round": round_, "position": position, "fingerprint": fingerprint,
                        "config": run_config, "metrics": last_scalars, "eval": eval_scalars,
                        "digest": state_digest(state) if saving else {}, **key_meta}
                manager.save(round_, args=ocp.args.Composite(
                    state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)),
                    force=final or preempted)
                progress.update(round_, last_scalars, seconds)
                if preempted:
                    manager.wait_until_finished()
                    why = "watch.stop" if raised and watch.stop else "SIGTERM"
                    progress.write(f"{why}: saved the checkpoint of round {round_}, stopping")
                    break
                batch = next_batch
            return _summary(round_, last_scalars, eval_scalars, resumed_from, preempted,
                            alarms)
    except BaseException:
        # A collective that failed because a host is gone: say that, not what it broke.
        peer_watch.rule_out_lost_peer()
        raise
    finally:
        # A crash must not lose a save in flight: orbax finalises a checkpoint atomically once
        # its writes finish, so wait for them before the process goes.
        manager.wait_until_finished()
        manager.close()
        if lock is not None:
            lock.release()
        if writer is not None:
            writer.close()
        if progress is not None:
            progress.close()


class _SkipCounter:
    """Consecutive rounds with skipped (non-finite) updates, per `<name>/skipped_updates`."""

    def __init__(self, limit: int):
        self.limit = limit
        self.runs: dict[str, int] = {}

    def record(self, scalars: Mapping[str, float], round_: int, last_checkpoint: int | None
               ) -> None:
        for name, value in scalars.items():
            if not name.endswith(SKIPPED_SUFFIX):
                continue
            self.runs[name] = self.runs.get(name, 0) + 1 if value else 0
            if self.runs[name] >= self.limit:
                who = name.removesuffix(SKIPPED_SUFFIX)
                raise NonFiniteError(
                    f"round {round_}: the {who} update was skipped {self.runs[name]} rounds in "
                    f"a row (non-finite loss or gradient; try a lower learning rate); its "
                    f"weights are those of before the skips. Last checkpoint: "
                    f"{_describe_checkpoint(last_checkpoint)}")


def _check_finite(state: PyTree, round_: int, last_checkpoint: int | None) -> None:
    """Refuses to checkpoint a state with a NaN or inf (it would replace good ones)."""
    if not bool(_all_finite(state)):
        raise NonFiniteError(
            f"round {round_}: the state holds non-finite values; not saved. Last checkpoint: "
            f"{_describe_checkpoint(last_checkpoint)}")


@jax.jit
def _all_finite(state: PyTree) -> jax.Array:
    floats = [x for x in jax.tree.leaves(state) if jnp.issubdtype(x.dtype, jnp.inexact)]
    return jnp.all(jnp.stack([jnp.isfinite(x).all() for x in floats])) if floats else True


def _describe_checkpoint(step: int | None) -> str:
    return "none saved yet" if step is None else f"round {step}"


def _scalars(metrics: Any) -> dict[str, Any]:
    """The single-element entries of a round's metrics (`Task.round_step`): of `metrics.scalars`
    when the task returns its outputs beside them, else of the mapping itself."""
    scalars = getattr(metrics, "scalars", metrics)
    return {name: value for name, value in scalars.items() if np.size(value) == 1}


def restore_checkpoint(workdir: str | os.PathLike, abstract_state: PyTree,
                       round_: int | None = None) -> tuple[PyTree, dict[str, Any]]:
    """The state and metadata saved by `run_training` at `round_` (None: the latest), e.g. for
    export or evaluation; `abstract_state` is the restore target (`Task.abstract_state()`).
    A checkpoint that cannot be read or fails its digest raises `DamagedCheckpointError`."""
    workdir = _absolute(workdir)
    directory = os.path.join(workdir, CHECKPOINT_DIR)
    with resume.reader(directory) as source:
        step = round_ if round_ is not None else max(host_agreement.union(source.all_steps()),
                                                     default=None)
        if step is None:
            raise FileNotFoundError(f"no checkpoint under {directory}")
        state, meta, problem = resume.restore_verified(
            source, step, abstract_state, fault_log.details_file(workdir, jax.process_index()))
    if problem is not None:
        raise DamagedCheckpointError(f"checkpoint of round {step} in {directory} is damaged: {problem}")
    return state, meta


def _checkpoint_manager(directory: str, every: int, keep: int | None
                        ) -> ocp.CheckpointManager:
    # `save_interval_steps` alone would also save round 1 of a fresh run (orbax adds an
    # initial-save policy); this policy saves exactly the multiples, plus preemption points.
    policy = ocp.checkpoint_managers.AnySavePolicy([
        ocp.checkpoint_managers.FixedIntervalPolicy(every),
        ocp.checkpoint_managers.PreemptionCheckpointingPolicy(),
    ])
    options = ocp.CheckpointManagerOptions(
        max_to_keep=keep, save_decision_policy=policy, enable_async_checkpointing=True,
        cleanup_tmp_directories=True, create=True)
    return ocp.CheckpointManager(directory, options=options, item_names=("state", "meta"))


@contextmanager
def _sigterm_flag() -> Iterator[threading.Event]:
    """A flag set by SIGTERM (TPU preemption) while the loop runs, instead of dying mid-round.

    Python can install handlers only in the main thread; elsewhere the flag never sets and only
    orbax's multi-host preemption sync point (when `jax.distributed` provides one) stops the run.
    """
    flag = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: flag.set())
    try:
        yield flag
    finally:
        signal.signal(signal.SIGTERM, previous)


def _stop_requested(sigterm: threading.Event, manager: ocp.CheckpointManager, round_: int
                    ) -> bool:
    """Whether to save and stop after this round, agreed by all processes: hosts receive
    SIGTERM at different moments, and one leaving early would hang the others' collectives."""
    return bool(host_agreement.processes_where(sigterm.is_set())) or manager.reached_preemption(
        round_)


def _throughput(task: Task, seconds: float, first: bool) -> dict[str, float]:
    """Model TFLOP/s per device and MFU from the task's `round_flops` (if it has one); not for
    a process's first round, whose time includes compilation."""
    model_flops = getattr(task, "round_flops", None)
    if not model_flops or first:
        return {}
    devices = jax.device_count()
    out = {"perf/tflops_per_s_per_device": model_flops / seconds / devices / 1e12}
    utilisation = mfu_lib.mfu(model_flops, seconds, devices, jax.devices()[0].device_kind)
    if utilisation is not None:
        out["perf/mfu"] = utilisation
    return out


def _append_lines(workdir: str, name: str, rows: list[dict[str, Any]]) -> None:
    """JSON lines appended to `workdir/name` by process 0 (a local workdir only); after a
    resume the later line of a round is the valid one."""
    if jax.process_index() != 0 or "://" in workdir or not rows:
        return
    with open(os.path.join(workdir, name), "a", encoding="utf-8") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)


def _raise_alarms(workdir: str, writer: Writers, progress: Progress, alarms: list[Alarm]
                  ) -> None:
    """The watch's alarms: a line each on the console, in `watch.jsonl` and TensorBoard text."""
    for alarm in alarms:
        progress.write(alarm.message)
    _append_lines(workdir, WATCH_LOG, [a._asdict() for a in alarms])
    writer.texts(alarms[0].round, {f"watch/{a.kind}": a.message for a in alarms})


def read_eval_history(workdir: str | os.PathLike) -> list[dict[str, float]]:
    """The evaluations of a run, one per round (the latest line wins), in round order."""
    path = os.path.join(_absolute(workdir), EVAL_HISTORY)
    if not os.path.exists(path):
        return []
    by_round: dict[int, dict[str, float]] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                entry = json.loads(line)
                by_round[entry["round"]] = entry
    return [by_round[r] for r in sorted(by_round)]


def _absolute(path: str | os.PathLike) -> str:
    """Orbax wants absolute paths; URLs (gs://...) already are."""
    path = os.fspath(path)
    return path if "://" in path else os.path.abspath(path)


def _canonical(value: Any) -> Any:
    """A JSON-able copy of a config (ConfigDicts become dicts, unknown objects their repr)."""
    if hasattr(value, "to_dict"):
        value = value.to_dict()
    return json.loads(json.dumps(value, sort_keys=True, default=repr))


def _flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts as {"a.b.c": leaf}, to name what changed between two configs."""
    if not isinstance(tree, dict):
        return {prefix.rstrip("."): tree}
    return {k: v for key, sub in tree.items() for k, v in _flatten(sub, f"{prefix}{key}.").items()}


def _check_fingerprint(meta: Mapping[str, Any], fingerprint: str, run_config: Any,
                       allow_change: bool, defaults: Any = None,
                       saved_config: Callable[[Any], Any] | None = None) -> None:
    if meta["fingerprint"] == fingerprint:
        return
    saved = meta["config"] if saved_config is None else _canonical(saved_config(meta["config"]))
    old, new = _flatten(saved), _flatten(run_config)
    default = _flatten(defaults) if isinstance(defaults, dict) else {}
    changed = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k)
                     and not (k not in old and k in default and new.get(k) == default[k]))
    if not changed:  # only keys added since, at their defaults
        return
    message = (f"the checkpoint in this workdir was written with another config or seed "
               f"(changed: {', '.join(changed)})")
    if not allow_change:
        raise ConfigMismatchError(message + "; use a new workdir or allow_config_change=True")
    _say(f"warning: {message}; resuming anyway")


def _check_positive(**values: int | None) -> None:
    for name, value in values.items():
        if value is not None and (not isinstance(value, int) or value < 1):
            raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _say(message: str) -> None:
    if jax.process_index() == 0:
        print(message, flush=True)


def _summary(final_round: int, metrics: Mapping[str, float], eval_metrics: Mapping[str, float],
             resumed_from: int | None, preempted: bool, alarms: list[Alarm] | None = None
             ) -> dict[str, Any]:
    return {"final_round": final_round, "metrics": dict(metrics), "eval": dict(eval_metrics),
            "resumed_from": resumed_from, "preempted": preempted,
            "alarms": [a._asdict() for a in alarms or []]}
