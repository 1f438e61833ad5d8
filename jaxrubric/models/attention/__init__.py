"""Attention for the decoder: one interface, a kernel per backend (`ModelConfig.attention_impl`).

- `xla`: the einsum forms (`einsum.py`), the CPU path and the reference the others are
  tested against; also what decoding steps (`decode_attention`) and explicit `[B, T, S]`
  masks always use.
- `splash`: Pallas splash attention on TPU (`splash.py`), under `shard_map`.
- `cudnn`: cuDNN's flash attention on NVIDIA GPUs (`cudnn.py`), where it takes the inputs;
  the einsum form elsewhere (float32, shared-prefix branches).
- `auto`: by the platform the program is compiled for (`resolve_impl`).

Every backend gives the einsum form's values at every position, padding included
(`masks.py`).
"""

from __future__ import annotations

import jax

from jaxrubric.models.attention import cudnn, splash
from jaxrubric.models.attention.einsum import (attention, branch_attention, chunked_attention,
                                               decode_attention)
from jaxrubric.models.attention.masks import CausalPadding, causal_mask
from jaxrubric.models.attention.platform import compile_platform

__all__ = ["CausalPadding", "attention", "branch_attention", "chunked_attention",
           "decode_attention", "resolve_impl", "self_attention", "shared_prefix_attention"]

_BY_PLATFORM = {"tpu": "splash", "gpu": "cudnn"}


def resolve_impl(impl: str, platform: str | None = None) -> str:
    """`impl`, or for `auto` the backend of the platform the program is compiled for:
    `platform` when given (`jaxrubric plan` for a slice), else the devices of the current
    activation layout's mesh when one is set (an ahead-of-time TPU compile traced on a CPU
    host gets splash), else JAX's default backend."""
    if impl != "auto":
        return impl
    return _BY_PLATFORM.get(platform or compile_platform(), "xla")


def self_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array | CausalPadding,
                   *, impl: str = "xla", chunk: int = 0) -> jax.Array:
    """A layer's grouped-query attention, `q [B, T, heads, D]`, `k`, `v [B, kv_heads, S, D]`.

    `mask` is either an explicit `[B, T, S]` boolean mask (decoding steps, tree masks: always
    the einsum form) or a `CausalPadding` (training forwards, a fresh cache's prefill), which
    goes to the backend `impl` names. `chunk`: the einsum form's query blocks (`attention`).
    """
    if not isinstance(mask, CausalPadding):
        return attention(q, k, v, mask, chunk)
    impl = resolve_impl(impl)
    if impl == "splash":
        return splash.causal(q, k, v, mask)
    if impl == "cudnn":
        if compile_platform() != "gpu":
            raise ValueError(f"attention_impl 'cudnn' needs an NVIDIA GPU; this program is "
                             f"compiled for {compile_platform()}")
        if cudnn.supports(q):
            return cudnn.causal(q, k, v, mask)
    return attention(q, k, v, causal_mask(mask, k.shape[2]), chunk)


def shared_prefix_attention(q_p: jax.Array, k_p: jax.Array, v_p: jax.Array,
                            prefix_valid: jax.Array, q_b: jax.Array, k_b: jax.Array,
                            v_b: jax.Array, branch_valid: jax.Array, *, impl: str = "xla",
                            chunk: int = 0) -> tuple[jax.Array, jax.Array]:
    """The attention of a prefix (`q_p [B, P, heads, D]`, `k_p`, `v_p [B, kv_heads, P, D]`,
    `prefix_valid [B, P]`: causal over its real tokens) and of S branches continuing it
    (`q_b [B, S, L, heads, D]`, `k_b`, `v_b [B, S, kv_heads, L, D]`, `branch_valid
    [B, S, L]`: see `branch_attention`). Splash computes both in one call; the other
    backends use the einsum forms."""
    prefix_valid, branch_valid = prefix_valid.astype(bool), branch_valid.astype(bool)
    if resolve_impl(impl) == "splash":
        return splash.shared_prefix(q_p, k_p, v_p, prefix_valid, q_b, k_b, v_b, branch_valid)
    out_p = attention(q_p, k_p, v_p, causal_mask(CausalPadding(prefix_valid), q_p.shape[1]),
                      chunk)
    return out_p, branch_attention(q_b, k_p, v_p, prefix_valid, k_b, v_b, branch_valid, chunk)
