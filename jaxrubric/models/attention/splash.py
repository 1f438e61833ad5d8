"""Attention on TPU: Pallas splash attention, under `shard_map` over the current layout.

The kernel streams blocks of keys past blocks of queries in VMEM (online softmax), skips the
blocks its static mask leaves empty and never writes scores to HBM; its backward recomputes
them block by block, so no whole-sequence float32 tensor exists in either pass. Padding and
packed sequences are segment ids (a key is seen only by queries of its id); the structure
(causal, shared-prefix branches) is a static block-sparse mask. Keys and values keep their
own kv heads: the kernel maps each query head to its group's kv head.

On a platform other than TPU the kernel runs in Pallas' interpreter (the tests' CPU check).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as kernel
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as mask_lib
from jax.sharding import PartitionSpec

from jaxrubric import sharding as shd
from jaxrubric.models.attention import masks
from jaxrubric.models.attention.platform import compile_platform

# The kernel's key blocks are whole vector registers' lanes; its query blocks too, where the
# backward pass reads segment ids transposed.
LANES = 128
# The block sizes tried, largest first. Larger blocks amortise the kernel's per-step cost and
# re-read keys and values fewer times; 512 is MaxText's TPU default (a 512 x 512 float32 score
# tile is 1 MiB of VMEM, with room for the q, k, v and output tiles beside it).
BLOCKS = (512, 256, 128)
# Segment ids of the keys that no query may see (padding); real keys share their query's id.
_HIDDEN = 1
# The name scope each kernel call is traced under, with the share of (query block, key block)
# tiles its static mask leaves to compute: HLO keeps no trace of the mask in the kernel's own
# instruction, so `plan.hlo_cost` reads the share off the scope of the mask's constants and
# counts the FLOPs the kernel does, not those of the whole square.
DENSITY_SCOPE = "splash_tiles_"


def block_size(length: int) -> int:
    """The kernel's block for a sequence of `length`: the largest of `BLOCKS` that divides it
    once padded to a multiple of `LANES`, so the block rule adds no padding of its own."""
    padded = -(-length // LANES) * LANES
    return next(b for b in BLOCKS if padded % b == 0)


@dataclasses.dataclass(frozen=True)
class SharedPrefixMask(mask_lib.Mask):
    """The static mask of `[prefix, branch_1, ..., branch_S, tail]`, `length` in all: prefix
    queries see the prefix causally; a branch's queries see the whole prefix and their own
    branch causally, never another branch. Tail positions (block padding) form branches of
    their own. Frozen (hashable): the kernel's mask analysis is cached by it."""

    length: int
    prefix: int
    branch: int

    @property
    def shape(self) -> tuple[int, int]:
        return (self.length, self.length)

    def __getitem__(self, idx: tuple[slice, slice]) -> np.ndarray:
        rows, cols = (range(self.length)[s] for s in idx)
        q = np.arange(rows.start, rows.stop)[:, None]
        k = np.arange(cols.start, cols.stop)[None, :]
        same_branch = (q - self.prefix) // self.branch == (k - self.prefix) // self.branch
        return (q >= k) & ((k < self.prefix) | same_branch)


def causal(q: jax.Array, k: jax.Array, v: jax.Array, mask: masks.CausalPadding) -> jax.Array:
    """`attention` under `mask` (see `masks.CausalPadding`): `q [B, T, heads, D]`, `k`, `v
    [B, kv_heads, S, D]` with `S >= T`; only the first T key slots enter the kernel."""
    t = q.shape[1]
    valid = mask.valid.astype(bool)
    ids = jnp.zeros(valid.shape, jnp.int32) if mask.segment_ids is None else mask.segment_ids
    # Padding keys take an id below every query's, so no query sees them.
    hidden = jnp.min(ids) - _HIDDEN
    out = _run(mask_lib.CausalMask, q, k[:, :, :t], v[:, :, :t], ids,
               jnp.where(valid, ids, hidden), hidden)
    average = masks.value_sum(v, axis=2)[:, None] / v.shape[2]
    return masks.put_average(out, average, masks.causal_has_key(mask))


def shared_prefix(q_p: jax.Array, k_p: jax.Array, v_p: jax.Array, prefix_valid: jax.Array,
                  q_b: jax.Array, k_b: jax.Array, v_b: jax.Array, branch_valid: jax.Array
                  ) -> tuple[jax.Array, jax.Array]:
    """A prefix and its branches in one kernel call over `[prefix, branches]`: the prefix's
    attention (`q_p [B, P, heads, D]`, `k_p`, `v_p [B, kv_heads, P, D]`) and the branches'
    (`q_b [B, S, L, heads, D]`, `k_b`, `v_b [B, S, kv_heads, L, D]`), `prefix_valid [B, P]`
    and `branch_valid [B, S, L]` their real tokens; as `attention` and `branch_attention`."""
    b, s, l, heads, d = q_b.shape
    p, kv = q_p.shape[1], k_p.shape[1]

    def joined(prefix: jax.Array, branches: jax.Array) -> jax.Array:  # [B, kv, P + S L, D]
        rest = branches.transpose(0, 2, 1, 3, 4).reshape(b, kv, s * l, d)
        return jnp.concatenate([prefix, rest], axis=2)

    q = jnp.concatenate([q_p, q_b.reshape(b, s * l, heads, d)], axis=1)
    valid = jnp.concatenate([prefix_valid, branch_valid.reshape(b, s * l)], axis=1).astype(bool)
    ids = jnp.zeros(valid.shape, jnp.int32)
    out = _run(lambda shape: SharedPrefixMask(shape[0], p, l), q, joined(k_p, k_b),
               joined(v_p, v_b), ids, jnp.where(valid, 0, _HIDDEN), _HIDDEN)
    prefix_sum, branch_sum = masks.value_sum(v_p, axis=2), masks.value_sum(v_b, axis=3)
    prefix_seen = jnp.cumsum(prefix_valid, axis=1) > 0
    out_p = masks.put_average(out[:, :p], prefix_sum[:, None] / p, prefix_seen)
    branch_seen = prefix_seen[:, -1:, None] | (jnp.cumsum(branch_valid, axis=2) > 0)
    out_b = masks.put_average(out[:, p:].reshape(b, s, l, heads, d),
                              (prefix_sum[:, None, None] + branch_sum[:, :, None]) / (p + l),
                              branch_seen)
    return out_p, out_b


def _run(make_mask: Callable[[tuple[int, int]], mask_lib.Mask], q: jax.Array, k: jax.Array,
         v: jax.Array, q_ids: jax.Array, kv_ids: jax.Array, pad_id: jax.Array) -> jax.Array:
    """The kernel over `q [B, N, heads, D]`, `k`, `v [B, kv_heads, N, D]` under the static
    mask `make_mask((n, n))` and segment ids `[B, N]`, N padded to the block (`pad_id`),
    returned as `[B, N, heads, D]`."""
    n, d = q.shape[1], q.shape[3]
    block = block_size(n)
    padded = -(-n // block) * block
    grow = lambda x, axis, value=0: jnp.pad(  # noqa: E731
        x, [(0, padded - n if i == axis else 0) for i in range(x.ndim)], constant_values=value)
    q = grow((q * d ** -0.5).astype(q.dtype).transpose(0, 2, 1, 3), 2)
    k, v = grow(k, 2), grow(v, 2)
    q_ids, kv_ids = grow(q_ids, 1, pad_id), grow(kv_ids, 1, pad_id)
    sizes = kernel.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block,
                              block_q_dkv=block, block_kv_dkv=block, block_kv_dkv_compute=block,
                              block_q_dq=block, block_kv_dq=block)
    interpret = compile_platform() != "tpu"
    scope = f"{DENSITY_SCOPE}{tile_share(make_mask((padded, padded)), block):.6f}"

    def rows(q, k, v, q_ids, kv_ids):
        heads = mask_lib.MultiHeadMask([make_mask((padded, padded))] * q.shape[1])
        with jax.named_scope(scope):
            splash = kernel.make_splash_mha(heads, block_sizes=sizes, head_shards=1,
                                            q_seq_shards=1, interpret=interpret)
            return jax.vmap(splash)(q, k, v, segment_ids=kernel.SegmentIds(q_ids, kv_ids))

    out = _sharded(rows, q, k, v, q_ids, kv_ids)
    return out[:, :, :n].transpose(0, 2, 1, 3)


@functools.lru_cache(maxsize=64)
def tile_share(mask: mask_lib.Mask, block: int) -> float:
    """The share of `block` x `block` tiles of `mask` holding any position to attend: the
    tiles the kernel computes (it skips the empty ones, and computes a partial one whole)."""
    n = mask.shape[0]
    touched = 0
    for start in range(0, n, block):
        rows = np.asarray(mask[start:start + block, 0:n]).reshape(-1, n // block, block)
        touched += int(rows.any(axis=(0, 2)).sum())
    return touched / (n // block) ** 2


def _sharded(rows: Callable[..., jax.Array], q: jax.Array, k: jax.Array, v: jax.Array,
             q_ids: jax.Array, kv_ids: jax.Array) -> jax.Array:
    """`rows` per device under `shard_map` over the current layout: rows split as
    `activation_batch`, heads as `activation_heads` / `activation_kv_heads` by the layout's
    rules (replicated where the mesh axes do not divide them), whole sequences.

    Query heads are split only together with their kv heads (or over one kv head shared by
    all), so each device's query heads find their own group's keys."""
    layout = shd.current_layout()
    if layout is None or layout.mesh.size == 1:
        return rows(q, k, v, q_ids, kv_ids)
    mesh, rules = layout.mesh, layout.rules
    names = ("activation_length", "activation_head_dim")
    batch, q_heads = shd.logical_to_spec(("activation_batch", "activation_heads", *names),
                                         q.shape, mesh, rules)[:2]
    kv_heads = shd.logical_to_spec(("activation_batch", "activation_kv_heads", *names),
                                   k.shape, mesh, rules)[1]
    if q_heads != kv_heads and k.shape[1] > 1:
        q_heads = kv_heads = None
    q_spec = PartitionSpec(batch, q_heads, None, None)
    kv_spec = PartitionSpec(batch, kv_heads, None, None)
    ids_spec = PartitionSpec(batch, None)
    return jax.shard_map(rows, mesh=mesh, in_specs=(q_spec, kv_spec, kv_spec, ids_spec, ids_spec),
                         out_specs=q_spec, check_vma=False)(q, k, v, q_ids, kv_ids)
