"""One writer per workdir: two runs writing the same checkpoints would overwrite each other.

An advisory `fcntl.flock` on `workdir/.lock`, taken by process 0 (the other processes of a
multi-host run write their shards of the same checkpoints and must not be refused). The file
names the owner (`host pid`); the kernel drops the lock when the owner dies, so a file left by
a dead process is a stale lock: taken over and reported. Workdirs that are URLs (`gs://`) have
no file locks; there the lock is skipped.
"""

from __future__ import annotations

import fcntl
import os
import socket
from typing import IO

LOCK_FILE = ".lock"


class WorkdirLockedError(RuntimeError):
    """Another live run holds the workdir."""


class WorkdirLock:
    """The held lock of a workdir (`acquire`); `release` when the run ends."""

    def __init__(self, handle: IO[str] | None, stale_owner: str | None = None):
        self._handle = handle
        self.stale_owner = stale_owner  # the owner named by a stale lock that was taken over

    @classmethod
    def acquire(cls, workdir: str) -> WorkdirLock:
        """Locks `workdir` (a local folder, created if missing) or raises `WorkdirLockedError`
        naming the run that holds it."""
        if "://" in workdir:
            return cls(None)
        os.makedirs(workdir, exist_ok=True)
        path = os.path.join(workdir, LOCK_FILE)
        handle = open(path, "a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            owner = handle.read().strip() or "an unknown process"
            handle.close()
            raise WorkdirLockedError(
                f"{workdir} is in use by another training run ({owner}); wait for it to end, "
                "or give this run another --workdir") from None
        handle.seek(0)
        stale = handle.read().strip() or None
        handle.seek(0)
        handle.truncate()
        handle.write(f"host {socket.gethostname()} pid {os.getpid()}\n")
        handle.flush()
        return cls(handle, stale)

    def release(self) -> None:
        if self._handle is not None:
            self._handle.seek(0)
            self._handle.truncate()
            fcntl.flock(self._handle, fcntl.LOCK_UN)
            self._handle.close()
            self._handle = None
