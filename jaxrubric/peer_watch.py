"""Every process of a multi-process run watches the others, so that a lost host ends the job in
bounded time with one line naming it.

Without this, the survivors of a host that dies (kill -9, a VM gone) wait in their next
collective, which never completes: on TPU an ICI collective simply hangs, and on CPU a gloo
collective may too. jax's coordination service would end them after its heartbeat timeout with
a C++ fatal error and a stack trace on every host.

Here each process publishes a counter in the coordination service's key-value store every
`interval` seconds (a daemon thread) and reads everyone's. A process whose counter has not
moved for `timeout` seconds is lost: every other process prints one line naming it and exits
with `LOST_PEER_EXIT` (`os._exit`: the main thread is stuck in a collective, and Python's
clean-up would wait for the dead host too). A checkpoint in flight is never finalised, so no
half-written checkpoint is marked good; the relaunch resumes from the last complete one.

A process that leaves normally publishes `EXITING` first (at interpreter exit, before jax's
shutdown barrier), so peers that finish later never report it. The coordinator itself (process
0, which hosts the service) dying is seen by jax's own error polling at once: every survivor
aborts within about a second, with jax's message, before this watch could speak.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Protocol

from jaxrubric import fault_log

LOST_PEER_EXIT = 75  # EX_TEMPFAIL: a launcher may retry (launch/tpu_pod.sh does)
EXITING = "exiting"
_PREFIX = "jaxrubric/heartbeat/"


class KeyValueClient(Protocol):
    """The part of jax's distributed runtime client the watch uses."""

    def key_value_set(self, key: str, value: str, allow_overwrite: bool = False) -> None: ...
    def key_value_dir_get(self, key: str) -> list[tuple[str, str]]: ...


class PeerWatch:
    """The heartbeat of one process and its verdict on the others (`check`, one poll); the
    thread of `start` polls every `interval` seconds."""

    def __init__(self, client: KeyValueClient, process: int, count: int, timeout: float,
                 clock: Callable[[], float] = time.monotonic):
        self.client, self.process, self.count, self.timeout = client, process, count, timeout
        self.interval = min(5.0, timeout / 4)
        self.clock = clock
        start = clock()
        self._seen: dict[int, tuple[str | None, float]] = {
            peer: (None, start) for peer in range(count) if peer != process}
        self._beat = 0
        self._lock = threading.Lock()
        self._leaving = threading.Event()

    def check(self) -> str | None:
        """Publishes this process's next heartbeat and reads the others'; the line to print when
        a peer is lost (or the coordination service is gone), else None."""
        try:
            self.client.key_value_set(f"{_PREFIX}{self.process}", str(self._beat),
                                      allow_overwrite=True)
            entries = self.client.key_value_dir_get(_PREFIX)
        except Exception as err:  # noqa: BLE001 - any failure to reach the service
            if self._leaving.is_set():
                return None
            reason = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
            return (f"jaxrubric: process {self.process} of {self.count} lost the coordination "
                    f"service on process 0 ({reason}); stopping (exit {LOST_PEER_EXIT})")
        self._beat += 1
        now = self.clock()
        with self._lock:
            for key, value in entries:
                peer = int(key.rsplit("/", 1)[-1])
                if peer in self._seen and self._seen[peer][0] != value:
                    self._seen[peer] = (value, now)
            silent = {peer: now - since for peer, (value, since) in self._seen.items()
                      if value != EXITING and now - since > self.timeout}
        if not silent or self._leaving.is_set():
            return None
        peer, seconds = max(silent.items(), key=lambda item: item[1])
        return (f"jaxrubric: process {peer} of {self.count} sent no heartbeat for {seconds:.0f} s "
                f"(host lost, killed or hung); process {self.process} stops too (exit "
                f"{LOST_PEER_EXIT}): relaunch to resume from the last complete checkpoint")

    def all_alive_since(self, moment: float) -> bool:
        """Whether every peer has published a heartbeat after `moment` (or is leaving)."""
        with self._lock:
            return all(value == EXITING or since > moment
                       for value, since in self._seen.values())

    def leave(self) -> None:
        """Marks this process as leaving normally: peers stop expecting its heartbeat."""
        self._leaving.set()
        try:
            self.client.key_value_set(f"{_PREFIX}{self.process}", EXITING, allow_overwrite=True)
        except Exception:  # noqa: BLE001, S110 - the service may already be shutting down
            pass

    def run(self, stop: Callable[[str], None]) -> None:
        """Polls until the process leaves; `stop(line)` on a verdict."""
        while not self._leaving.wait(self.interval):
            verdict = self.check()
            if verdict is not None:
                stop(verdict)
                return


_WATCH: PeerWatch | None = None


def _stop_process(line: str) -> None:
    """Prints the verdict on a line of its own (after a progress bar, and past a capture of
    library output) and ends the process."""
    sys.stdout.flush()
    fault_log.write_to_terminal(f"\n{line}\n")
    os._exit(LOST_PEER_EXIT)


def start(client: KeyValueClient | None, process: int, count: int, timeout: float
          ) -> PeerWatch | None:
    """Starts this process's watch (nothing for a single process); it leaves at interpreter
    exit, before jax's shutdown barrier (atexit runs the later registration first)."""
    global _WATCH
    if count < 2 or client is None or _WATCH is not None:
        return _WATCH
    _WATCH = PeerWatch(client, process, count, timeout)
    threading.Thread(target=_WATCH.run, args=(_stop_process,), name="jaxrubric-peer-watch",
                     daemon=True).start()
    atexit.register(_WATCH.leave)
    return _WATCH


def rule_out_lost_peer() -> None:
    """Before an error propagates in a multi-process run: waits until every peer has shown a
    heartbeat since now (the error is this process's own), or until the watch declares one lost
    and ends the process with its line (the error was the echo of a lost host, e.g. a
    collective that failed when its peer's connection closed). At most one timeout."""
    watch = _WATCH
    if watch is None:
        return
    moment = watch.clock()
    deadline = moment + watch.timeout + 2 * watch.interval
    while watch.clock() < deadline and not watch.all_alive_since(moment):
        time.sleep(watch.interval / 4)
