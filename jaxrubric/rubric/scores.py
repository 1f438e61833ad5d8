"""Rubric scores: weighted verdicts aggregated per group (docs/design.md, §5).

All functions are pure ``jax.numpy``, jittable, and reduce only the last (item) axis, so any
leading batch dims work. Verdicts and weights follow NumPy broadcasting, which aligns trailing
axes: verdicts of shape ``[B, K, G, M]`` (K responses judged under G groups of M items) need
weights and validity of shape ``[B, 1, G, M]``, i.e. ``weights[:, None]``, not ``[B, G, M]``.

Hard scores take 0/1 verdicts; the soft variant of each score is the same function fed
``p_yes`` (the verifier's probability of "yes") instead, which gives the expected score when
items are judged independently.

Each function returns ``(scores, group_valid)``, both of the broadcast shape without the item
axis. An invalid group (nothing to normalise by) scores exactly 0 and has a finite zero
gradient, so it can be masked out downstream without NaNs.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike


def dynamic_rubric_score(
    verdicts: ArrayLike, weights: ArrayLike, valid: ArrayLike
) -> tuple[jax.Array, jax.Array]:
    """DynamicRubric score ``sum(w * v) / sum(w)`` over valid items.

    Weights are the positive integers 1..5 of the DynamicRubric grammar. A group whose valid
    weights sum to zero or less (in practice: no valid item) is invalid.
    """
    v, w = _masked(verdicts, weights, valid)
    return _ratio(jnp.sum(w * v, axis=-1), jnp.sum(w, axis=-1))


def genrubric_score(
    verdicts: ArrayLike, weights: ArrayLike, valid: ArrayLike, *, clip: bool = False
) -> tuple[jax.Array, jax.Array]:
    """GenRubric score ``sum(w * v) / sum(w for w > 0)`` over valid items.

    Negative weights penalise observable errors, so a score can fall below 0. A group with no
    valid positive weight is invalid. This is also HealthBench's per-example score (points of
    the criteria met over the sum of positive points; HealthBench itself clips only the mean
    over examples to [0, 1]). ``clip=True`` clips each score to [0, 1], for a bounded reward.
    """
    v, w = _masked(verdicts, weights, valid)
    scores, group_valid = _ratio(jnp.sum(w * v, axis=-1), jnp.sum(jnp.maximum(w, 0), axis=-1))
    if clip:
        scores = jnp.clip(scores, 0.0, 1.0)
    return scores, group_valid


def _masked(
    verdicts: ArrayLike, weights: ArrayLike, valid: ArrayLike
) -> tuple[jax.Array, jax.Array]:
    """Verdicts and weights broadcast together, in a float dtype of at least 32 bits, with
    invalid items zeroed in both, so padding (even NaN) carries nothing."""
    v = jnp.asarray(verdicts)
    dtype = jnp.promote_types(v.dtype, jnp.float32)
    v, w, ok = jnp.broadcast_arrays(v.astype(dtype), jnp.asarray(weights, dtype), valid)
    ok = ok.astype(bool)
    return jnp.where(ok, v, 0), jnp.where(ok, w, 0)


def _ratio(numerator: jax.Array, denominator: jax.Array) -> tuple[jax.Array, jax.Array]:
    group_valid = denominator > 0
    safe = jnp.where(group_valid, denominator, 1)
    return jnp.where(group_valid, numerator / safe, 0), group_valid
