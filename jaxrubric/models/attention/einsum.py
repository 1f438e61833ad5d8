"""The einsum forms of attention: the CPU path, and the reference the kernels are held to.

`attention` is a layer's grouped-query attention under an explicit mask; `branch_attention`
is the shared-prefix form (S branches continuing one prefix, no scores between branches).
Both can run over blocks of queries (`attention_chunk`), each block recomputed in the
backward pass, so a layer never holds every query's scores at once.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, chunk: int = 0
              ) -> jax.Array:
    """Grouped-query attention, the einsum form XLA lowers well on CPU, GPU and TPU.

    `q [B, T, heads, D]`; `k`, `v [B, kv_heads, S, D]` (the KV-cache layout, so decoding reads
    the cache without transposing it); `mask [B, T, S]` True where a query may attend a key.
    Query heads are grouped under their kv head, never materialising repeated keys. A query
    with nothing to attend (padding) gets a uniform average rather than NaN. With
    `0 < chunk < T` the queries go through `chunked_attention` (same values, less memory).
    """
    if 0 < chunk < q.shape[1]:
        return chunked_attention(q, k, v, mask, chunk)
    return _dense_attention(q, k, v, mask)


def chunked_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, chunk: int
                      ) -> jax.Array:
    """`attention` computed over blocks of `chunk` queries, one block after another.

    The dense form holds float32 scores `[B, heads, T, S]`: with long prompts or tree rows that
    one tensor is what runs a layer out of memory. A block holds `[B, heads, chunk, S]`
    (`_query_blocks`). Keys and values enter the blocks in float32 so their cotangents, summed
    over blocks, keep the precision the dense einsum's accumulation has.
    """
    k32, v32 = k.astype(jnp.float32), v.astype(jnp.float32)
    return _query_blocks(
        lambda q_b, mask_b: _dense_attention(q_b, k32.astype(k.dtype), v32.astype(v.dtype),
                                             mask_b), q, mask, chunk, axis=1)


def _query_blocks(attend, q: jax.Array, mask: jax.Array, chunk: int, axis: int) -> jax.Array:
    """`attend(q, mask)` over blocks of `chunk` queries along `axis` (of `q`, of its output
    and of the mask's query rows), one block after another.

    Each block is a `jax.checkpoint`, so the backward pass recomputes one block's
    probabilities at a time instead of keeping all of them. The last block ends at the last
    query (overlapping the one before when `chunk` does not divide the queries; its repeated
    rows are dropped), so nothing is padded and each block reads its rows of `mask` in place.
    """
    t = q.shape[axis]
    blocks = -(-t // chunk)
    starts = np.minimum(np.arange(blocks) * chunk, t - chunk)
    q_blocks = jnp.stack([jax.lax.slice_in_dim(q, s, s + chunk, axis=axis) for s in starts])

    @jax.checkpoint
    def block(xs: tuple[jax.Array, jax.Array]) -> jax.Array:
        start, q_b = xs
        return attend(q_b, jax.lax.dynamic_slice_in_dim(mask, start, chunk, axis=axis))

    out = jax.lax.map(block, (jnp.asarray(starts), q_blocks))  # [blocks, ..., chunk, ...]
    tail = t - (blocks - 1) * chunk  # rows of the last block that no other block has
    head = jnp.moveaxis(out[:-1], 0, axis)
    head = head.reshape(*q.shape[:axis], (blocks - 1) * chunk, *head.shape[axis + 2:])
    last = jax.lax.slice_in_dim(out[-1], chunk - tail, chunk, axis=axis)
    return jnp.concatenate([head, last], axis=axis)


def _dense_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array) -> jax.Array:
    """`attention` with every query at once (see there)."""
    b, t, n, d = q.shape
    kv = k.shape[1]
    q = q.reshape(b, t, kv, n // kv, d).transpose(0, 2, 3, 1, 4).reshape(b, kv, n // kv * t, d)
    scores = jnp.einsum("bkqd,bksd->bkqs", q, k, preferred_element_type=jnp.float32)
    scores = scores * (d ** -0.5)
    scores = scores.reshape(b, kv, n // kv, t, -1)
    scores = jnp.where(mask[:, None, None, :, :], scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype).reshape(b, kv, n // kv * t, -1)
    out = jnp.einsum("bkqs,bksd->bkqd", probs, v)
    return out.reshape(b, kv, n // kv, t, d).transpose(0, 3, 1, 2, 4).reshape(b, t, n, d)


def branch_attention(q: jax.Array, prefix_k: jax.Array, prefix_v: jax.Array,
                     prefix_valid: jax.Array, k: jax.Array, v: jax.Array,
                     branch_valid: jax.Array | None = None, chunk: int = 0) -> jax.Array:
    """Attention of S branches that continue one shared prefix, without scores between
    branches: each branch's queries attend to the prefix's keys (shared, never copied per
    branch) and causally to their own.

    `q [B, S, L, heads, D]`; `prefix_k`, `prefix_v [B, kv_heads, P, D]`, `prefix_valid
    [B, P]`; `k`, `v [B, S, kv_heads, L, D]`; `branch_valid [B, S, L]` the real tokens of
    each branch (None: all), padding anywhere in a branch is never attended. One softmax over
    both parts, so the result is the dense masked attention over `[prefix, branch]` exactly.
    With `0 < chunk` and `chunk // S < L`, the branches' queries go through `_query_blocks` by
    positions: a block holds the same `max(1, chunk // S)` positions of every branch, about
    `chunk` queries, as a `chunked_attention` block does. Returns `[B, S, L, heads, D]`.
    """
    b, s, l = q.shape[:3]
    own = jnp.arange(l)[:, None] >= jnp.arange(l)[None, :]
    if branch_valid is None:
        own = jnp.broadcast_to(own, (b, s, l, l))
    else:
        own = own & branch_valid.astype(bool)[:, :, None, :]
    rows = max(1, chunk // s)
    if not 0 < chunk or rows >= l:
        return _branch_attention(q, prefix_k, prefix_v, prefix_valid, k, v, own)
    kv = (prefix_k, prefix_v, k, v)
    kv32 = [x.astype(jnp.float32) for x in kv]  # as in `chunked_attention`

    def attend(q_b: jax.Array, own_b: jax.Array) -> jax.Array:
        pk, pv, k_b, v_b = (x32.astype(x.dtype) for x32, x in zip(kv32, kv))
        return _branch_attention(q_b, pk, pv, prefix_valid, k_b, v_b, own_b)

    return _query_blocks(attend, q, own, rows, axis=2)


def decode_attention(q: jax.Array, prefix_k: jax.Array, prefix_v: jax.Array,
                     prefix_valid: jax.Array, k: jax.Array, v: jax.Array, written: jax.Array
                     ) -> jax.Array:
    """A decoding step of S samples continuing each of B prompts: `q [B S, T, heads, D]`
    (rows prompt-major) attend to their prompt's keys `prefix_k`, `prefix_v [B, kv_heads, P,
    D]` (`prefix_valid [B, P]`) and to their own `k`, `v [B S, kv_heads, L, D]` at the slots
    `written [L]` holds, in one softmax over both. Returns `[B S, T, heads, D]`.

    The two parts share the softmax's maximum and denominator instead of being concatenated
    (`branch_attention`'s form): each part is one batched matrix product in its own cache's
    layout, and only the per-query statistics and outputs (`[.., D]`, not `[.., P]`) change
    layout between them, which keeps a step's ops few and small where the model is small.
    """
    b, kv_heads, p_len, d = prefix_k.shape
    rows, t, n, _ = q.shape
    s, g = rows // b, n // kv_heads
    low = jnp.finfo(jnp.float32).min
    scale = d ** -0.5

    def to_prompts(x: jax.Array) -> jax.Array:  # [B S, kv, T g, X] -> [B, kv, S T g, X]
        x = x.reshape(b, s, kv_heads, t * g, x.shape[-1]).transpose(0, 2, 1, 3, 4)
        return x.reshape(b, kv_heads, s * t * g, x.shape[-1])

    def to_samples(x: jax.Array) -> jax.Array:  # the inverse of `to_prompts`
        x = x.reshape(b, kv_heads, s, t * g, x.shape[-1]).transpose(0, 2, 1, 3, 4)
        return x.reshape(rows, kv_heads, t * g, x.shape[-1])

    q_own = q.reshape(rows, t, kv_heads, g, d).transpose(0, 2, 1, 3, 4).reshape(
        rows, kv_heads, t * g, d)
    to_prefix = jnp.einsum("bkqd,bkpd->bkqp", to_prompts(q_own), prefix_k,
                           preferred_element_type=jnp.float32) * scale
    to_prefix = jnp.where(prefix_valid.astype(bool)[:, None, None, :], to_prefix, low)
    own = jnp.einsum("rkqd,rkld->rkql", q_own, k, preferred_element_type=jnp.float32) * scale
    own = jnp.where(written[None, None, None, :], own, low)
    top = jnp.maximum(to_samples(to_prefix.max(-1, keepdims=True)), own.max(-1, keepdims=True))
    prefix_p = jnp.exp(to_prefix - to_prompts(top))
    own_p = jnp.exp(own - top)
    total = to_samples(prefix_p.sum(-1, keepdims=True)) + own_p.sum(-1, keepdims=True)
    out = (to_samples(jnp.einsum("bkqp,bkpd->bkqd", prefix_p.astype(v.dtype), prefix_v,
                                 preferred_element_type=jnp.float32))
           + jnp.einsum("rkql,rkld->rkqd", own_p.astype(v.dtype), v,
                        preferred_element_type=jnp.float32)) / total
    out = out.astype(v.dtype).reshape(rows, kv_heads, t, g, d).transpose(0, 2, 1, 3, 4)
    return out.reshape(rows, t, n, d)


def _branch_attention(q, prefix_k, prefix_v, prefix_valid, k, v, own_mask):
    """`branch_attention` of the queries `q [B, S, T, heads, D]` (T of the L positions), with
    `own_mask [B, S, T, L]`: which of its branch's keys each query sees."""
    b, s, t, n, d = q.shape
    kv = prefix_k.shape[1]
    q = q.reshape(b, s, t, kv, n // kv, d)
    scale = d ** -0.5
    low = jnp.finfo(jnp.float32).min
    to_prefix = jnp.einsum("bslkgd,bkpd->bkgslp", q, prefix_k,
                           preferred_element_type=jnp.float32) * scale
    to_prefix = jnp.where(prefix_valid[:, None, None, None, None, :], to_prefix, low)
    own = jnp.einsum("bslkgd,bskmd->bkgslm", q, k, preferred_element_type=jnp.float32) * scale
    own = jnp.where(own_mask[:, None, None], own, low)
    probs = jax.nn.softmax(jnp.concatenate([to_prefix, own], axis=-1), axis=-1)
    probs = probs.astype(v.dtype)
    p_len = prefix_k.shape[2]
    out = (jnp.einsum("bkgslp,bkpd->bslkgd", probs[..., :p_len], prefix_v)
           + jnp.einsum("bkgslm,bskmd->bslkgd", probs[..., p_len:], v))
    return out.reshape(b, s, t, n, d)
