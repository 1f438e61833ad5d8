"""A content digest of a training state, so a checkpoint can prove on restore that it holds
what was saved (a flipped byte in a data file otherwise restores silently as garbage).

Each array leaf gets one 32-bit checksum of its raw bits: the bits as unsigned integers,
multiplied by an odd per-position factor and summed (wrapping mod 2^32). It is computed on the
devices where the leaf lives, in one jitted pass over the state: a read of the state, small
next to the save itself, and on a multi-host mesh every process gets the same global value.
Any change of one element changes its leaf's checksum; a change of several cancels with
probability about 2^-32.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

PyTree = Any
_UNSIGNED = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint32}


def _leaf_checksum(x: jax.Array) -> jax.Array:
    bits = jax.lax.bitcast_convert_type(x, _UNSIGNED[x.dtype.itemsize]).astype(jnp.uint32)
    position = jnp.arange(bits.size, dtype=jnp.uint32).reshape(bits.shape)
    return jnp.sum(bits * (position * jnp.uint32(2654435761) | jnp.uint32(1)), dtype=jnp.uint32)


@jax.jit
def _checksums(leaves: list[jax.Array]) -> list[jax.Array]:
    return [_leaf_checksum(x) for x in leaves]


def state_digest(state: PyTree) -> dict[str, int]:
    """`{leaf path: checksum}` of every array leaf of `state` (JSON-able, for checkpoint meta).

    Leaves are summed in one program per set of devices holding them (roles on sub-meshes
    live on different devices, and one program cannot read both)."""
    groups: dict[frozenset, list[tuple[str, jax.Array]]] = {}
    for path, x in jax.tree_util.tree_flatten_with_path(state)[0]:
        if isinstance(x, (jax.Array, np.ndarray)) and np.size(x):
            x = jnp.asarray(x)
            groups.setdefault(frozenset(x.sharding.device_set), []).append(
                (jax.tree_util.keystr(path), x))
    digest = {}
    for arrays in groups.values():
        sums = jax.device_get(_checksums([x for _, x in arrays]))
        digest.update({path: int(value) for (path, _), value in zip(arrays, sums)})
    return digest


def digest_mismatch(state: PyTree, expected: dict[str, int]) -> str | None:
    """None when `state` matches the digest saved with it, else which leaves differ."""
    got = state_digest(state)
    bad = sorted(k for k in set(got) | set(expected) if got.get(k) != expected.get(k))
    if not bad:
        return None
    shown = ", ".join(bad[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
    return f"content digest mismatch in {len(bad)} of {len(expected)} arrays ({shown})"
