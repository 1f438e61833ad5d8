"""Joining a multi-process run: `jax.distributed.initialize` when the environment asks for it.

A run spans several processes on a TPU pod (one per host), on GPU machines (started by
`launch/gpu_local.sh`, one per host or per GPU) and in tests (CPU processes on one machine).
Each process must join the distributed runtime before jax creates its backends: otherwise it
sees only its own devices and trains alone, with no error. Hence `initialize` runs first, before
anything asks jax for devices, and does nothing in the ordinary single-process case, so that
every entry point can call it unconditionally.

Where the settings come from, first match wins:
- arguments (the CLI flags `--coordinator`, `--num-processes`, `--process-id`), each falling
  back to its environment variable `JAXRUBRIC_COORDINATOR_ADDRESS`, `JAXRUBRIC_NUM_PROCESSES`,
  `JAXRUBRIC_PROCESS_ID`: all three, or none;
- coordinator `auto`: jax detects everything it can (Cloud TPU VM pods through the metadata
  server, Slurm, Open MPI, Kubernetes); needed for a GCE TPU pod started with
  `gcloud compute tpus tpu-vm ssh --worker=all`, whose environment says nothing;
- a multi-host Cloud TPU environment that jax itself recognises without a network query (GKE
  worker lists, multislice): `jax.distributed.initialize()` with no arguments.

Once joined, every process watches the others (`jaxrubric.peer_watch`): a process silent for
`JAXRUBRIC_HEARTBEAT_TIMEOUT` seconds (default 60) is declared lost, and the others exit with one
line naming it. jax's own heartbeat timeout is set to twice that, a backstop that ends the job
with a C++ fatal error should the watch itself be stuck.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from typing import Any

import jax
from jax._src import distributed as jax_distributed  # the client, as orbax reaches it too

from jaxrubric import peer_watch

COORDINATOR_ENV = "JAXRUBRIC_COORDINATOR_ADDRESS"
NUM_PROCESSES_ENV = "JAXRUBRIC_NUM_PROCESSES"
PROCESS_ID_ENV = "JAXRUBRIC_PROCESS_ID"
HEARTBEAT_TIMEOUT_ENV = "JAXRUBRIC_HEARTBEAT_TIMEOUT"
DEFAULT_HEARTBEAT_TIMEOUT_S = 60.0
AUTO = "auto"

# Worker lists that jax's GKE TPU cluster detection reads (jax/_src/clusters/cloud_tpu_cluster.py).
_TPU_WORKER_LISTS = ("TPU_PROCESS_ADDRESSES", "TPU_WORKER_HOSTNAMES")
# Set on every host of a multislice TPU job; jax takes the coordinator from it.
_MEGASCALE_COORDINATOR = "MEGASCALE_COORDINATOR_ADDRESS"
_MEGASCALE_SLICES = "MEGASCALE_NUM_SLICES"


class DistributedConfigError(ValueError):
    """Multi-process settings that cannot start a run (partial or malformed), naming the
    flag and environment variable to fix."""


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None,
               local_device_ids: Sequence[int] | None = None) -> bool:
    """Joins the distributed runtime if the arguments or the environment describe a
    multi-process run (see the module docstring); returns whether this process is part of one.

    Must run before any jax call that touches devices (`jax.devices()`, any computation);
    jax raises otherwise. Calling it again once initialised is a no-op that returns True.
    """
    if jax.distributed.is_initialized():
        return True
    kwargs = resolve(coordinator_address, num_processes, process_id, local_device_ids)
    if kwargs is None:
        return False
    timeout = heartbeat_timeout()
    # Multi-process CPU needs cross-process collectives; jax >= 0.5 defaults to gloo, older
    # releases to none (every cross-process collective would fail).
    if jax.config.jax_cpu_collectives_implementation is None:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(**kwargs, heartbeat_timeout_seconds=int(2 * timeout) + 1)
    state = jax_distributed.global_state
    peer_watch.start(state.client, state.process_id, state.num_processes or 1, timeout)
    return True


def resolve(coordinator_address: str | None = None, num_processes: int | None = None,
            process_id: int | None = None, local_device_ids: Sequence[int] | None = None,
            environ: Mapping[str, str] | None = None) -> dict[str, Any] | None:
    """The keyword arguments of `jax.distributed.initialize` for these settings, or None for
    a single-process run. Raises `DistributedConfigError` on partial or malformed settings."""
    environ = os.environ if environ is None else environ
    coordinator = coordinator_address or environ.get(COORDINATOR_ENV) or None
    count = num_processes if num_processes is not None else _env_int(environ, NUM_PROCESSES_ENV)
    index = process_id if process_id is not None else _env_int(environ, PROCESS_ID_ENV)
    devices = None if local_device_ids is None else [int(d) for d in local_device_ids]
    if coordinator == AUTO:
        given = {"num_processes": count, "process_id": index, "local_device_ids": devices}
        return {k: v for k, v in given.items() if v is not None}
    if coordinator is None and count is None and index is None:
        if _on_tpu_pod(environ):
            return {} if devices is None else {"local_device_ids": devices}
        if devices is not None:
            raise DistributedConfigError(
                "local_device_ids is only used by a multi-process run: give --coordinator "
                f"({COORDINATOR_ENV}), --num-processes and --process-id too")
        return None
    missing = [f"{flag} ({env})" for value, flag, env in (
        (coordinator, "--coordinator", COORDINATOR_ENV),
        (count, "--num-processes", NUM_PROCESSES_ENV),
        (index, "--process-id", PROCESS_ID_ENV)) if value is None]
    if missing:
        raise DistributedConfigError(
            "a multi-process run needs the coordinator address, the number of processes and "
            f"this process's id; missing: {' and '.join(missing)}. With --coordinator {AUTO}, "
            "jax detects them itself on a TPU pod, under Slurm or Open MPI")
    _check_address(coordinator)
    if count < 1:
        raise DistributedConfigError(f"the number of processes must be >= 1, got {count}")
    if not 0 <= index < count:
        raise DistributedConfigError(
            f"process id {index} is not in 0..{count - 1} (number of processes {count})")
    kwargs: dict[str, Any] = {"coordinator_address": coordinator, "num_processes": count,
                              "process_id": index}
    if devices is not None:
        kwargs["local_device_ids"] = devices
    return kwargs


def heartbeat_timeout(environ: Mapping[str, str] | None = None) -> float:
    """`JAXRUBRIC_HEARTBEAT_TIMEOUT` seconds (default 60): how long a process may be silent
    before the others declare it lost. Long enough for a loaded host's watch thread to be late,
    short enough that a lost host costs a minute, not jax's 100 s and a stack trace per host."""
    raw = (os.environ if environ is None else environ).get(HEARTBEAT_TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_HEARTBEAT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise DistributedConfigError(
            f"{HEARTBEAT_TIMEOUT_ENV}={raw!r} must be a positive number of seconds")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds `--coordinator`, `--num-processes` and `--process-id` (defaults: the environment
    variables) to a command line parser."""
    group = parser.add_argument_group(
        "multi-process runs", "Unset: the JAXRUBRIC_* environment variables, else Cloud TPU "
        "detection, else a single process.")
    group.add_argument("--coordinator", metavar="HOST:PORT",
                       help=f"address of process 0's coordinator ({COORDINATOR_ENV}); "
                            f"'{AUTO}': let jax detect a TPU pod, Slurm or Open MPI")
    group.add_argument("--num-processes", type=int, metavar="N",
                       help=f"number of processes of the run ({NUM_PROCESSES_ENV})")
    group.add_argument("--process-id", type=int, metavar="I",
                       help=f"this process's id, 0..N-1 ({PROCESS_ID_ENV})")


def initialize_from_args(args: argparse.Namespace) -> bool:
    """`initialize` with the flags of `add_arguments`."""
    return initialize(args.coordinator, args.num_processes, args.process_id)


def _env_int(environ: Mapping[str, str], name: str) -> int | None:
    raw = environ.get(name, "").strip()
    if not raw:
        return None
    try:
        return int(raw)
    except ValueError:
        raise DistributedConfigError(f"{name}={raw!r} is not an integer") from None


def _check_address(address: str) -> None:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise DistributedConfigError(
            f"coordinator address {address!r} must be HOST:PORT (e.g. 10.0.0.1:1234)")


def _on_tpu_pod(environ: Mapping[str, str]) -> bool:
    """Whether the environment marks a multi-host Cloud TPU job that jax can join on its own.

    Single-host TPU VMs (and Colab) need no distributed runtime, and jax's GCE TPU detection
    queries the metadata server, so that path is only taken on request (`auto`)."""
    if environ.get(_MEGASCALE_COORDINATOR):
        return True
    if environ.get(_MEGASCALE_SLICES, "").strip() not in ("", "0", "1"):
        return True
    return any(len([w for w in environ.get(name, "").split(",") if w.strip()]) > 1
               for name in _TPU_WORKER_LISTS)
