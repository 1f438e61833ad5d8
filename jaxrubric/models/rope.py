"""Rotary position embeddings (RoPE) with the frequency scalings of Llama 3.x.

Frequencies are computed on the host in float64 (they are constants of the config) and the
rotation in float32, matching transformers' `rotate_half` convention (the two halves of the head
dimension, not interleaved pairs).
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from jaxrubric.models.config import RopeConfig


def inverse_frequencies(rope: RopeConfig, head_dim: int) -> np.ndarray:
    """Per-pair inverse frequencies `[head_dim // 2]`, scaled as the rope type asks."""
    inv_freq = 1.0 / (rope.theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    if rope.type == "linear":
        return inv_freq / rope.factor
    if rope.type == "llama3":
        # Long wavelengths are slowed by `factor`, short ones kept, and the band between is a
        # smooth blend (Llama 3.1's context extension).
        old_len = rope.original_max_position_embeddings
        low_freq_wavelen = old_len / rope.low_freq_factor
        high_freq_wavelen = old_len / rope.high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = np.where(wavelen > low_freq_wavelen, inv_freq / rope.factor, inv_freq)
        smooth = (old_len / wavelen - rope.low_freq_factor) / (
            rope.high_freq_factor - rope.low_freq_factor
        )
        blended = (1 - smooth) * scaled / rope.factor + smooth * scaled
        medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
        return np.where(medium, blended, scaled)
    return inv_freq


def rope_tables(positions: jnp.ndarray, inv_freq: np.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
    """cos and sin `[..., T, head_dim]` for integer positions `[..., T]`."""
    angles = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq, jnp.float32)
    angles = jnp.concatenate([angles, angles], axis=-1)
    return jnp.cos(angles), jnp.sin(angles)


def apply_rope(x: jnp.ndarray, cos: jnp.ndarray, sin: jnp.ndarray) -> jnp.ndarray:
    """Rotates `x [B, T, heads, head_dim]` by the tables `[B, T, head_dim]`."""
    half = x.shape[-1] // 2
    x32 = x.astype(jnp.float32)
    rotated = jnp.concatenate([-x32[..., half:], x32[..., :half]], axis=-1)
    out = x32 * cos[:, :, None, :] + rotated * sin[:, :, None, :]
    return out.astype(x.dtype)
