"""Attention on NVIDIA GPUs: cuDNN's fused flash attention through
`jax.nn.dot_product_attention(implementation="cudnn")`.

What that path accepts (jax `_src/cudnn/fused_attention_stablehlo.py`): bfloat16 or float16
q, k, v in `[B, T, heads, D]` (kv heads may be fewer: grouped-query attention), a head
dimension that is a multiple of 8 and at most 128 (256 from Hopper on), `is_causal` (blocks
above the diagonal skipped), and padding only as right-aligned lengths; any other mask is
turned into an additive bias `[B, 1, T, S]`, which training then needs even lengths for.
Padding anywhere and segment ids are that bias here, with `is_causal` still skipping the
upper blocks. The shared-prefix branches stay on the einsum form: a dense bias over
`[prefix, branches]` would compute the scores between branches that form skips, and
`return_residual`'s log-sum-exp carries no gradient for merging two partial calls.

`jax.nn.dot_product_attention(implementation="xla")` takes the same arguments on any
backend: that is how this module is checked against the einsum form on CPU.
"""

from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp

from jaxrubric.models.attention import masks

# The compute dtypes cuDNN's flash attention takes, and the largest head dimension every
# architecture it runs on accepts.
DTYPES = ("bfloat16", "float16")
MAX_HEAD_DIM = 128


def supports(q: jax.Array) -> bool:
    """Whether cuDNN's flash attention takes queries like `q [B, T, heads, D]`."""
    d = q.shape[-1]
    return q.dtype.name in DTYPES and d % 8 == 0 and d <= MAX_HEAD_DIM


def causal(q: jax.Array, k: jax.Array, v: jax.Array, mask: masks.CausalPadding,
           implementation: Literal["cudnn", "xla"] = "cudnn") -> jax.Array:
    """`attention` under `mask` (see `masks.CausalPadding`): `q [B, T, heads, D]`, `k`, `v
    [B, kv_heads, S, D]` with `S >= T`; only the first T key slots are attended."""
    t = q.shape[1]
    seen = masks.causal_mask(mask, t)
    keys, values = (x[:, :, :t].transpose(0, 2, 1, 3) for x in (k, v))
    if t % 2:  # one masked key and query more: a bias in training needs even lengths
        q, keys, values = (jnp.pad(x, ((0, 0), (0, 1), (0, 0), (0, 0)))
                           for x in (q, keys, values))
        seen = jnp.pad(seen, ((0, 0), (0, 1), (0, 1)))
    out = jax.nn.dot_product_attention(q, keys, values, mask=seen[:, None], is_causal=True,
                                       implementation=implementation)[:, :t]
    average = masks.value_sum(v, axis=2)[:, None] / v.shape[2]
    return masks.put_average(out, average, masks.causal_has_key(mask))
