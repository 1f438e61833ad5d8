"""DynamicRubric generator rewards: discriminability over the response set plus anchor ranking.

A generated rubric is good when its items split the policy's current responses (an item every
response passes, or none does, says nothing about which is better) and when its scores order a
reference list of anchors the way the reference does. All functions are pure `jnp`, accept any
leading batch dimensions and are jittable; masks carry validity (padding items, short lists).
"""

from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp

from jaxrubric.rl.grpo import safe_ratio

Array = jax.Array


def discriminability(
    verdicts: Array,
    weights: Array,
    item_mask: Array,
    *,
    mode: Literal["item_variance", "score_variance"] = "item_variance",
    response_mask: Array | None = None,
) -> Array:
    """How well a rubric group separates the K responses; verdicts `[..., K, M]` -> `[...]`.

    `item_variance` (the paper's J_disc): `p_m = mean_k v_m(y_k)`,
    `J = Σ_m w_m p_m (1 - p_m) / Σ_m w_m` over valid items, a weighted Bernoulli variance in
    `[0, 0.25]`. `score_variance`: the variance over responses of the weighted score `E(y_k)`,
    which also rewards items that agree in how they split the responses. Verdicts may be soft
    (p_yes). Weights `[..., M]` are DynamicRubric's positive integers; `item_mask` `[..., M]`
    drops padding items, `response_mask` `[..., K]` padding responses. A group with no valid
    item (or zero total weight) gets 0.
    """
    v = jnp.asarray(verdicts, jnp.float32)
    w = jnp.where(jnp.asarray(item_mask, bool), jnp.asarray(weights, jnp.float32), 0.0)
    rm = jnp.ones(v.shape[:-1]) if response_mask is None else jnp.asarray(response_mask, jnp.float32)
    rm = jnp.broadcast_to(rm, v.shape[:-1])
    n = rm.sum(-1)
    if mode == "item_variance":
        p = safe_ratio((v * rm[..., None]).sum(-2), n[..., None])
        return safe_ratio((w * p * (1.0 - p)).sum(-1), w.sum(-1))
    if mode == "score_variance":
        total = w.sum(-1)
        score = safe_ratio((v * w[..., None, :]).sum(-1), total[..., None])
        mean = safe_ratio((score * rm).sum(-1), n)
        var = safe_ratio((jnp.square(score - mean[..., None]) * rm).sum(-1), n)
        return jnp.where(total > 0, var, 0.0)
    raise ValueError(f"unknown discriminability mode {mode!r}; expected item_variance or score_variance")


def anchor_ranking(scores: Array, *, normalize: bool = True, list_mask: Array | None = None) -> Array:
    """Rank-biased agreement of a rubric's scores `[..., n]` with a best-first reference list.

    `J = Σ_{i<j} ω_ij log σ(s_i - s_j)`, `ω_ij = 1 / ((j - i) 2^(i-1))` with 1-based ranks, so
    inversions near the top and between neighbours cost most; divided by `Σ ω_ij` when
    `normalize` (then `J ∈ (-inf, 0)`, `-log 2` for a rubric that ties everything). `list_mask`
    `[..., n]` marks the real entries of shorter lists; ranks count valid entries only, so the
    mask need not be a prefix. Fewer than two valid entries give 0.
    """
    s = jnp.asarray(scores, jnp.float32)
    valid = jnp.ones(s.shape, bool) if list_mask is None else jnp.asarray(list_mask, bool)
    s = jnp.where(valid, s, 0.0)
    rank = jnp.cumsum(valid.astype(jnp.int32), axis=-1)
    ri, rj = rank[..., :, None], rank[..., None, :]
    pair = valid[..., :, None] & valid[..., None, :] & (ri < rj)
    gap = jnp.where(pair, rj - ri, 1).astype(jnp.float32)
    omega = jnp.where(pair, 1.0 / (gap * jnp.exp2((ri - 1).astype(jnp.float32))), 0.0)
    total = (omega * jax.nn.log_sigmoid(s[..., :, None] - s[..., None, :])).sum((-2, -1))
    return safe_ratio(total, omega.sum((-2, -1))) if normalize else total


def generator_reward(disc: Array, anchor: Array, lam: float = 1.0) -> Array:
    """`J_disc + λ J_anchor`: the single place the anchor weight λ lives."""
    return disc + lam * anchor


def dynamic_rubric_rewards(
    verdicts: Array,
    weights: Array,
    item_mask: Array,
    anchor_scores: Array,
    *,
    lam: float = 1.0,
    response_mask: Array | None = None,
    anchor_mask: Array | None = None,
    disc_mode: Literal["item_variance", "score_variance"] = "item_variance",
    normalize_anchor: bool = True,
) -> tuple[Array, dict[str, Array]]:
    """Per-group generator rewards `[..., G]` from one query's G rubric groups.

    Shapes: verdicts `[..., G, K, M]` (response k under item m of group g), weights and
    item_mask `[..., G, M]`, anchor_scores `[..., G, n]` (the reference list scored under each
    group). `response_mask` `[..., K]` and `anchor_mask` `[..., n]` are shared by all groups.
    Returns the reward and its parts `{"disc", "anchor", "group_valid"}`; a group with no valid
    item is flagged invalid so callers may exclude it from `group_advantages`.
    """
    if response_mask is not None:
        response_mask = jnp.expand_dims(jnp.asarray(response_mask), -2)
    if anchor_mask is not None:
        anchor_mask = jnp.expand_dims(jnp.asarray(anchor_mask), -2)
    disc = discriminability(verdicts, weights, item_mask, mode=disc_mode, response_mask=response_mask)
    anchor = anchor_ranking(anchor_scores, normalize=normalize_anchor, list_mask=anchor_mask)
    group_valid = jnp.asarray(item_mask, bool).any(-1)
    return generator_reward(disc, anchor, lam), {"disc": disc, "anchor": anchor, "group_valid": group_valid}
