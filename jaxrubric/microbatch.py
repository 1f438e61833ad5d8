"""Running a row-wise computation over micro-batches of its rows, one after another.

A round's stages are row-wise (a row is a prompt, a sampled sequence, a tree row), and the
memory of each stage grows with the rows it holds at once. Splitting the rows into `n`
micro-batches under `lax.map` bounds that memory by `rows / n` while the results stay the
ones the whole batch would give.

Micro-batch `j` holds rows `j, j + n, j + 2n, ...` (strided, not contiguous): rows are sharded
over the mesh in contiguous blocks, so every device holds its own share of every micro-batch
and splitting moves no data between devices.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
from jax import lax

PyTree = Any


def split(tree: PyTree, n: int) -> PyTree:
    """Leaves `[R, ...]` -> `[n, R / n, ...]`, micro-batch `j` holding rows `j::n`."""
    def one(x: jax.Array) -> jax.Array:
        if n < 1 or x.shape[0] % n:
            raise ValueError(f"{n} micro-batches do not split the {x.shape[0]} rows evenly")
        return x.reshape(x.shape[0] // n, n, *x.shape[1:]).swapaxes(0, 1)
    return jax.tree.map(one, tree)


def merge(tree: PyTree) -> PyTree:
    """The inverse of `split`: leaves `[n, R / n, ...]` -> `[R, ...]` in the original order."""
    return jax.tree.map(lambda x: x.swapaxes(0, 1).reshape(-1, *x.shape[2:]), tree)


def map_rows(fn: Callable[[PyTree], PyTree], tree: PyTree, n: int) -> PyTree:
    """`fn(tree)` computed over `n` micro-batches of the rows (leading axis) of `tree`.

    `fn` must be row-wise: its outputs' rows depend only on the same rows of its input. With
    `n == 1` this is `fn(tree)` itself, the same program as without micro-batching.
    """
    if n == 1:
        return fn(tree)
    return merge(lax.map(fn, split(tree, n)))
