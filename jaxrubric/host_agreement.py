"""Decisions the processes of a multi-process run must take alike, taken together.

Each host sees the workdir and its own reads: one may list a checkpoint another does not yet see
complete, or fail to read the shards only it reads. Were each to act on its own view, they would
resume from different rounds, or one would enter a collective the others never reach and hang.
So each host's view goes through a small all-gather and all act on the combination. Every
process must call these functions at the same point; with one process they are plain.
"""

from __future__ import annotations

from collections.abc import Iterable

import jax
import numpy as np
from jax.experimental import multihost_utils


def processes_where(flag: bool) -> list[int]:
    """The processes on which `flag` is true."""
    if jax.process_count() == 1:
        return [0] if flag else []
    flags = multihost_utils.process_allgather(np.asarray(flag))
    return [int(i) for i in np.flatnonzero(flags)]


def union(values: Iterable[int]) -> list[int]:
    """Every non-negative integer that any process holds, sorted."""
    mine = sorted({int(v) for v in values})
    if jax.process_count() == 1:
        return mine
    longest = int(np.max(multihost_utils.process_allgather(np.asarray(len(mine), np.int32))))
    if longest == 0:
        return []
    padded = np.full(longest, -1, np.int32)  # the same shape on every process
    padded[:len(mine)] = mine
    everyone = multihost_utils.process_allgather(padded)
    return sorted(int(v) for v in set(np.ravel(everyone)) if v >= 0)
