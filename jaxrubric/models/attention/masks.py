"""What every backend agrees on: which keys a query sees, and what a query that sees none gets.

The einsum form is the reference. A query attends the real keys its mask allows, padding
queries included (a right-padded row's padding attends the real tokens before it). A query
with no key to attend (left padding before the first real token) gets the plain average of
every value it was given: its scores all sit at the same floor, so its softmax is uniform.
The kernels skip masked blocks and cannot give that average themselves; they compute it here
and put it in place (`put_average`), so every backend returns the same values at every
position, and finite gradients, padding included.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


class CausalPadding(NamedTuple):
    """Causal self-attention over rows with padding anywhere: query `t` sits at key slot `t`
    and sees the real keys at slots `<= t` (of its own segment, with `segment_ids`).

    `valid [B, T]` the real tokens; `segment_ids [B, T]` packed sequences, each a contiguous
    run of one id (as `segment_positions` reads them), or None. Keys past the T queries (the
    empty slots of a fresh KV cache) are never seen.
    """

    valid: jax.Array
    segment_ids: jax.Array | None = None


def causal_mask(mask: CausalPadding, key_slots: int) -> jax.Array:
    """The einsum form's `[B, T, key_slots]` boolean mask of `mask`."""
    valid = mask.valid.astype(bool)
    t = valid.shape[1]
    key_valid = jnp.pad(valid, ((0, 0), (0, key_slots - t)))
    seen = (jnp.arange(key_slots)[None, :] <= jnp.arange(t)[:, None])[None] & key_valid[:, None]
    if mask.segment_ids is not None:
        if key_slots != t:
            raise ValueError("segment_ids need as many key slots as queries (no KV cache)")
        ids = mask.segment_ids
        seen = seen & (ids[:, :, None] == ids[:, None, :])
    return seen


def causal_has_key(mask: CausalPadding) -> jax.Array:
    """`[B, T]`: whether query `t` sees any real key under `mask`: a real token at or before
    it, in its own run of segment ids."""
    valid = mask.valid.astype(bool)
    idx = jnp.broadcast_to(jnp.arange(valid.shape[1]), valid.shape)
    last_real = jax.lax.cummax(jnp.where(valid, idx, -1), axis=1)
    if mask.segment_ids is None:
        return last_real >= 0
    ids = mask.segment_ids
    starts = jnp.concatenate([jnp.ones_like(ids[:, :1], bool), ids[:, 1:] != ids[:, :-1]], 1)
    return last_real >= jax.lax.cummax(jnp.where(starts, idx, 0), axis=1)


def value_sum(v: jax.Array, axis: int) -> jax.Array:
    """Values summed over their key axis in float32 (the average a keyless query gets is
    this sum over the number of keys it was given)."""
    return jnp.sum(v.astype(jnp.float32), axis=axis)


def put_average(out: jax.Array, average: jax.Array, has_key: jax.Array) -> jax.Array:
    """`out [..., heads, D]` where `has_key [...]`, else `average [..., kv_heads, D]`
    (broadcast over the leading dimensions): each query head takes its kv head's average,
    heads grouped under their kv head as the einsum form groups them."""
    *lead, heads, d = out.shape
    kv = average.shape[-2]
    grouped = out.reshape(*lead, kv, heads // kv, d)
    filled = jnp.where(has_key[..., None, None, None], grouped,
                       average[..., :, None, :].astype(out.dtype))
    return filled.reshape(out.shape)
