"""glibc's malloc told to keep the memory XLA:CPU frees, in a toy world's processes.

A toy model's step allocates and frees buffers larger than malloc's mmap threshold, and malloc
gives them back to the kernel each time: the next step's first touch of every page faults again
(the toy worlds spent a large share of their CPU time in the kernel doing so). With one arena,
no mmap'd chunks and a high trim threshold, freed buffers stay in the heap and are reused. The
floats are the same; the processes hold more memory.
"""

from __future__ import annotations

import ctypes
import os

# The environment a process's glibc reads at start (the worker processes a world spawns).
ENVIRONMENT = {"MALLOC_ARENA_MAX": "1", "MALLOC_MMAP_MAX_": "0",
               "MALLOC_TRIM_THRESHOLD_": str(1 << 30)}
# mallopt's parameters (malloc.h) for the same settings, in this process.
_MALLOPT = {"MALLOC_ARENA_MAX": -8, "MALLOC_MMAP_MAX_": -4, "MALLOC_TRIM_THRESHOLD_": -1}


def keep_freed_memory() -> None:
    """These settings for this process (effective for the threads XLA starts after it) and,
    through the environment, for the processes it starts; a setting the user's environment
    already makes is kept. Does nothing where the C library is not glibc."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (AttributeError, OSError):
        return
    for name, value in ENVIRONMENT.items():
        value = os.environ.setdefault(name, value)
        mallopt(_MALLOPT[name], int(value))
