"""Finding the checkpoint a run resumes from: the newest one that every process reads and
verifies, chosen alike on every host.

Each host reads the shards its own devices hold, so a damaged file may fail on one host only,
and hosts may list a checkpoint differently for a moment; a host acting on its own view would
resume from another round than the others, or wait in a collective they never enter. So reads
go through a reader without orbax's cross-process barriers, and every outcome is combined
across hosts (`host_agreement`) before anyone acts on it. What orbax and TensorStore print
about a failed read goes to the workdir's details file (`fault_log`), not the terminal.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import Any

import jax
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from jaxrubric import fault_log, host_agreement
from jaxrubric.state_digest import digest_mismatch

PyTree = Any


class DamagedCheckpointError(RuntimeError):
    """A checkpoint cannot be read, or does not hold what was saved."""


def reader(directory: str) -> ocp.CheckpointManager:
    """Reads checkpoints with none of orbax's cross-process barriers (this process alone is
    active; each reads the shards its devices hold), so that a host whose read fails cannot
    leave the others waiting in one: the hosts agree on each outcome afterwards."""
    me = jax.process_index()
    return ocp.CheckpointManager(directory, item_names=("state", "meta"), options=(
        ocp.CheckpointManagerOptions(create=False, multiprocessing_options=(
            ocp.options.MultiprocessingOptions(primary_host=me, active_processes={me})))))


def read_meta(manager: ocp.CheckpointManager, step: int, details: str) -> dict[str, Any] | None:
    """A checkpoint's metadata, or None (on every process) when some process cannot read it;
    what the libraries print about a failed read goes to the file `details`."""
    with reader(str(manager.directory)) as source, fault_log.captured() as capture:
        try:
            meta = dict(source.restore(step, args=ocp.args.Composite(
                meta=ocp.args.JsonRestore()))["meta"])
        except Exception as err:  # noqa: BLE001 - any read failure marks it damaged
            traceback.print_exception(err)
            meta = None
    if meta is None:
        capture.keep(details, f"metadata of round {step}: unreadable")
    else:
        capture.release()
    return None if host_agreement.processes_where(meta is None) else meta


def restore_verified(source: ocp.CheckpointManager, step: int, abstract_state: PyTree,
                     details: str) -> tuple[PyTree, dict[str, Any], str | None]:
    """`(state, meta, None)`, or `(None, None, what is wrong)` when the checkpoint of `step`
    cannot be read (on any process) or its state does not match the digest saved with it.
    What the libraries print about a failed read goes to the file `details`."""
    with fault_log.captured() as capture:
        try:
            restored = source.restore(step, args=ocp.args.Composite(
                state=ocp.args.StandardRestore(abstract_state), meta=ocp.args.JsonRestore()))
            problem = None
        except Exception as err:  # noqa: BLE001 - orbax/TensorStore raise many kinds
            traceback.print_exception(err)  # into the capture, for the details file
            restored, problem = None, f"unreadable ({_root_cause(err)}; details in {details})"
    failed = host_agreement.processes_where(problem is not None)
    if failed and problem is None:
        problem = (f"unreadable on process {', '.join(map(str, failed))} of "
                   f"{jax.process_count()} (details in its fault_details log)")
    if problem is None:
        meta = dict(restored["meta"])
        problem = digest_mismatch(restored["state"], meta["digest"]) if meta.get("digest") else None
    if problem is not None:
        capture.keep(details, f"checkpoint of round {step}: {problem}")
        return None, None, problem
    capture.release()
    return restored["state"], meta, None


def _root_cause(err: BaseException) -> str:
    """The first line of the innermost cause (TensorStore's own message, not orbax's wrapper
    with the store's whole spec)."""
    while (err.__cause__ or err.__context__) is not None:
        err = err.__cause__ or err.__context__
    lines = [line for line in str(err).strip().splitlines() if line.strip()]
    return f"{type(err).__name__}: {(lines or [''])[0][:200]}"


def restore_newest_good(manager: ocp.CheckpointManager, abstract_state: Callable[[], PyTree],
                        fallback: bool, details: str, say: Callable[[str], None]
                        ) -> tuple[int, dict[str, Any], PyTree] | None:
    """The newest checkpoint that reads and verifies on every process, as `(step, meta,
    state)`; None when there is none. Steps are those any process lists (one that another host
    does not see complete fails there, and so on all). Damaged newer ones are reported and,
    once a good one is found, moved aside to `checkpoints/<step>.corrupt` (never deleted). With
    every checkpoint failing, nothing is moved (more likely code that no longer reads them than
    damage): `DamagedCheckpointError`."""
    steps = sorted(host_agreement.union(manager.all_steps()), reverse=True)
    damaged: list[tuple[int, str]] = []
    with reader(str(manager.directory)) as source:
        for step in steps:
            state, meta, problem = restore_verified(source, step, abstract_state(), details)
            if problem is None:
                break
            say(f"checkpoint of round {step} is damaged: {problem}")
            damaged.append((step, problem))
            if not fallback:
                raise DamagedCheckpointError(
                    f"checkpoint of round {step} is damaged: {problem}; stopping (without "
                    "--no-fallback the run resumes from the newest good checkpoint)")
        else:
            if steps:
                raise DamagedCheckpointError(
                    f"no checkpoint in {manager.directory} can be restored: "
                    + "; ".join(f"round {s}: {p}" for s, p in damaged))
            return None
    if damaged:
        _move_aside(manager, [s for s, _ in damaged])
        say(f"resuming from round {step}, the newest good checkpoint; the damaged ones were "
            f"moved to {', '.join(f'{s}.corrupt' for s, _ in damaged)}")
    return step, meta, state


def _move_aside(manager: ocp.CheckpointManager, steps: list[int]) -> None:
    """Renames damaged checkpoints to `<step>.corrupt` (process 0) and rescans (every process)."""
    if jax.process_index() == 0:
        for step in steps:
            source = manager.directory / str(step)
            source.rename(source.parent / f"{step}.corrupt")
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices("jaxrubric: damaged checkpoints moved aside")
    manager.reload()
