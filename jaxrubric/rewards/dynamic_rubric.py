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

from jaxrubric.rl.grpo import AdvantageMode, group_advantages, rank_invalid_last, safe_ratio

Array = jax.Array
DiscMode = Literal["item_variance", "score_variance"]
DISC_MODES: tuple[str, ...] = ("item_variance", "score_variance")
GeneratorCombine = Literal["advantage", "reward"]
GENERATOR_COMBINES: tuple[str, ...] = ("advantage", "reward")


def discriminability(
    verdicts: Array,
    weights: Array,
    item_mask: Array,
    *,
    mode: DiscMode = "item_variance",
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


def anchor_ranking(scores: Array, *, normalize: bool = True, list_mask: Array | None = None,
                   ranks: Array | None = None) -> Array:
    """Rank-biased agreement of a rubric's scores `[..., n]` with a reference ranking.

    `J = Σ_{i≺j} ω_ij log σ(s_i - s_j)` over the pairs the reference orders (i better than j),
    `ω_ij = 1 / ((r_j - r_i) 2^(r_i - 1))` with 1-based ranks r, so inversions near the top and
    between neighbours cost most; divided by `Σ ω_ij` when `normalize` (then `J ∈ (-inf, 0)`,
    `-log 2` for a rubric that ties everything). `ranks` `[..., n]` are the reference's (1 =
    best; equal ranks tie and make no pair); None: the list is strictly ordered best-first.
    `list_mask` `[..., n]` marks the real entries of shorter lists; ranks count valid entries
    only (an entry's rank is 1 + the number of valid entries ranked strictly better), so the
    mask need not be a prefix. Fewer than two ordered entries give 0.
    """
    s = jnp.asarray(scores, jnp.float32)
    valid = jnp.ones(s.shape, bool) if list_mask is None else jnp.asarray(list_mask, bool)
    s = jnp.where(valid, s, 0.0)
    if ranks is None:
        rank = jnp.cumsum(valid.astype(jnp.int32), axis=-1)
    else:
        given = jnp.asarray(ranks)
        better = valid[..., None, :] & (given[..., None, :] < given[..., :, None])
        rank = 1 + better.sum(-1)
    ri, rj = rank[..., :, None], rank[..., None, :]
    pair = valid[..., :, None] & valid[..., None, :] & (ri < rj)
    gap = jnp.where(pair, rj - ri, 1).astype(jnp.float32)
    omega = jnp.where(pair, 1.0 / (gap * jnp.exp2((ri - 1).astype(jnp.float32))), 0.0)
    total = (omega * jax.nn.log_sigmoid(s[..., :, None] - s[..., None, :])).sum((-2, -1))
    return safe_ratio(total, omega.sum((-2, -1))) if normalize else total


def preference_pairs(ranks: Array, list_mask: Array) -> Array:
    """`[..., n, n]`: True where entry i is ranked strictly better than entry j (both listed):
    the pairs a Δgap averages over (ties make none)."""
    valid = jnp.asarray(list_mask, bool)
    ranks = jnp.asarray(ranks)
    return valid[..., :, None] & valid[..., None, :] & (ranks[..., :, None] < ranks[..., None, :])


def generator_reward(disc: Array, anchor: Array, lam: float = 1.0) -> Array:
    """`J_disc + λ J_anchor`: the reward-level combination (`generator_combine="reward"`)."""
    return disc + lam * anchor


def generator_advantages(disc: Array, anchor: Array, group_valid: Array, *, lam: float = 1.0,
                         combine: GeneratorCombine = "advantage",
                         mode: AdvantageMode = "group_std") -> Array:
    """Group advantages `[..., G]` of a prompt's G rubrics from their two rewards.

    `advantage` (the paper's): `adv(J_disc) + λ adv(J_anchor)`, each reward normalised over
    the G rubrics first, so neither term dominates by having the larger spread. `reward`:
    `adv(J_disc + λ J_anchor)`. Invalid rubrics (`group_valid` False) are ranked below every
    valid one before each normalisation (`rank_invalid_last`): their advantage is the lowest.
    """
    if combine == "advantage":
        return (group_advantages(rank_invalid_last(disc, group_valid), mode=mode)
                + lam * group_advantages(rank_invalid_last(anchor, group_valid), mode=mode))
    if combine == "reward":
        return group_advantages(rank_invalid_last(generator_reward(disc, anchor, lam),
                                                  group_valid), mode=mode)
    raise ValueError(f"unknown generator_combine {combine!r}; expected one of "
                     f"{GENERATOR_COMBINES}")


def dynamic_rubric_rewards(
    verdicts: Array,
    weights: Array,
    item_mask: Array,
    anchor_scores: Array,
    *,
    lam: float = 1.0,
    response_mask: Array | None = None,
    anchor_mask: Array | None = None,
    anchor_ranks: Array | None = None,
    disc_mode: DiscMode = "item_variance",
    normalize_anchor: bool = True,
) -> tuple[Array, dict[str, Array]]:
    """Per-group generator rewards `[..., G]` from one query's G rubric groups.

    Shapes: verdicts `[..., G, K, M]` (response k under item m of group g), weights and
    item_mask `[..., G, M]`, anchor_scores `[..., G, n]` (the reference list scored under each
    group). `response_mask` `[..., K]`, `anchor_mask` and `anchor_ranks` `[..., n]` (the
    reference ranks, ties allowed: see `anchor_ranking`) are shared by all groups.
    Returns the reward and its parts `{"disc", "anchor", "group_valid"}`; a group with no valid
    item is flagged invalid so callers may exclude it from `group_advantages`.
    """
    if response_mask is not None:
        response_mask = jnp.expand_dims(jnp.asarray(response_mask), -2)
    if anchor_mask is not None:
        anchor_mask = jnp.expand_dims(jnp.asarray(anchor_mask), -2)
    if anchor_ranks is not None:
        anchor_ranks = jnp.expand_dims(jnp.asarray(anchor_ranks), -2)
    disc = discriminability(verdicts, weights, item_mask, mode=disc_mode, response_mask=response_mask)
    anchor = anchor_ranking(anchor_scores, normalize=normalize_anchor, list_mask=anchor_mask,
                            ranks=anchor_ranks)
    group_valid = jnp.asarray(item_mask, bool).any(-1)
    return generator_reward(disc, anchor, lam), {"disc": disc, "anchor": anchor, "group_valid": group_valid}


def item_rewards(
    verdicts: Array,
    anchor_verdicts: Array,
    item_mask: Array,
    *,
    response_mask: Array | None = None,
    anchor_mask: Array | None = None,
    anchor_ranks: Array | None = None,
) -> tuple[Array, Array]:
    """Each item's share of the two generator rewards, as if it were a rubric by itself.

    A rubric's reward says nothing about which of its items earned it; these say it per item
    (`round.item_credit`). Verdicts `[..., G, K, M]` of the responses and `[..., G, n, M]` of
    the anchor answers; `item_mask` `[..., G, M]`; the masks and ranks as in
    `dynamic_rubric_rewards`. Returns `(disc, anchor)`, each `[..., G, M]`:
    `disc = p_m (1 - p_m)` (`discriminability` of each one-item rubric) and `anchor` =
    `anchor_ranking` of the item's verdicts on the anchors (`-log 2` for an item that passes
    or fails them all); 0 for padding items.
    """
    item_mask = jnp.asarray(item_mask, bool)
    expand = lambda x: None if x is None else jnp.expand_dims(jnp.asarray(x), (-2, -3))  # noqa: E731
    one_item = jnp.moveaxis(jnp.asarray(verdicts), -1, -2)[..., None]  # [..., G, M, K, 1]
    disc = discriminability(one_item, jnp.ones(item_mask.shape + (1,)), item_mask[..., None],
                            response_mask=expand(response_mask))
    anchor = anchor_ranking(jnp.moveaxis(jnp.asarray(anchor_verdicts, jnp.float32), -1, -2),
                            list_mask=expand(anchor_mask), ranks=expand(anchor_ranks))
    return disc, jnp.where(item_mask, anchor, 0.0)
