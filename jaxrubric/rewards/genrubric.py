"""GenRubric generator rewards: sequence-level (whole rubric group) and criterion-level (items).

Setting, per query: G rubric groups (items m = 1..M with signed integer weights and a validity
mask) and G induced responses, r_g written while shown rubric g. Verdicts
`v[..., g_resp, g_rub, m]` say whether r_{g_resp} satisfies item m of group g_rub (hard 0/1 or
soft p_yes). Group scores are `S_{g'}(r) = Σ_m w_m v_m / Σ_{m: w_m > 0} w_m`.

A group is malformed when it has no valid item or no positive weight (its score has no scale).
Malformed groups get reward 0 everywhere, their items reward 0, and they take no part in
anyone's evaluation; their induced responses are left out of the response set too, since they
were written against a broken rubric (pass `response_valid` to drop other responses).

Credit is token level: item tokens get the item advantage on top of the sequence advantage,
structural tokens the sequence advantage only (`credit.token_level_advantages`). Sequence rewards are
normalised by `group_advantages` over the G groups of a query, malformed groups included and
ranked below every well-formed one (`rl.grpo.rank_invalid_last`), so producing one is always
penalised; item rewards are z-scored over all valid items of the query's
well-formed groups (`credit.item_advantages`). The paper leaves the exact spread and combination
coefficients open: they are keyword arguments here, with the defaults documented.
"""

from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp

from jaxrubric.rewards.credit import item_advantages, token_level_advantages
from jaxrubric.rl.grpo import AdvantageMode, group_advantages, rank_invalid_last, safe_ratio
from jaxrubric.rubric.scores import genrubric_score

Array = jax.Array
Spread = Literal["std", "range", "pairs"]
SPREADS = ("std", "range", "pairs")


def group_validity(weights: Array, item_valid: Array) -> Array:
    """`[..., G]`: True where a group has a valid item and a positive total of positive weights."""
    iv = jnp.asarray(item_valid, bool)
    positive = jnp.where(iv & (jnp.asarray(weights) > 0), weights, 0).sum(-1)
    return iv.any(-1) & (positive > 0)


def group_scores(verdicts: Array, weights: Array, item_valid: Array, *, clip: bool = False
                 ) -> Array:
    """`S[..., g_resp, g_rub]`: response g_resp scored under group g_rub (0 under malformed g_rub).

    The GenRubric score of `jaxrubric.rubric.scores.genrubric_score` (the one evaluation uses):
    negative-weight items subtract when satisfied, so S may be negative; a response that meets
    every positive item and no negative one scores 1. `clip`: each score clipped to [0, 1]
    (what the rewards read, see `genrubric_rewards`).
    """
    scores, _ = genrubric_score(verdicts, jnp.asarray(weights)[..., None, :, :],
                                jnp.asarray(item_valid)[..., None, :, :], clip=clip)
    return scores


def _response_mask(group_valid: Array, response_valid: Array | None) -> Array:
    """Responses that count: those induced by well-formed groups (and flagged valid)."""
    return group_valid if response_valid is None else group_valid & jnp.asarray(response_valid, bool)


def cross_rubric_comprehensiveness(scores: Array, group_valid: Array) -> Array:
    """`[..., G]`: mean over valid g' != g of `S_{g'}(r_g)`.

    A rubric is comprehensive when the response it induces also does well under the other
    rubrics. 0 for a malformed g or when no other group is valid.
    """
    g = scores.shape[-1]
    others = group_valid[..., None, :] & ~jnp.eye(g, dtype=bool)
    mean = safe_ratio((scores * others).sum(-1), others.sum(-1))
    return jnp.where(group_valid, mean, 0.0)


def group_discrimination(
    scores: Array, group_valid: Array, *, response_valid: Array | None = None, spread: Spread = "std",
    tol: float = 1e-6,
) -> Array:
    """`[..., G]`: how far group g tells the valid induced responses g'' apart by `S_g(r_{g''})`.

    `spread="std"` (default) is the population std, which uses every response and is in
    `[0, 0.5]` for scores in [0, 1]; `"range"` is max - min, in `[0, 1]`, which only looks at
    the extremes; `"pairs"` is the share of response pairs whose scores differ (by more than
    `tol`), in `[0, 1]`. Std and range grow as a rubric gets coarser (one all-or-nothing
    item has the largest std a score can have), pairs as it resolves more answers from each
    other, whatever its scale. 0 for a malformed g or fewer than two valid responses.
    """
    rv = _response_mask(group_valid, response_valid)[..., :, None]
    n = rv.sum(-2)
    if spread == "std":
        mean = safe_ratio((scores * rv).sum(-2), n)
        value = jnp.sqrt(safe_ratio((jnp.square(scores - mean[..., None, :]) * rv).sum(-2), n))
    elif spread == "range":
        value = jnp.max(jnp.where(rv, scores, -jnp.inf), -2) - jnp.min(jnp.where(rv, scores, jnp.inf), -2)
    elif spread == "pairs":
        both = rv[..., :, None, :] & rv[..., None, :, :]  # [..., G_resp, G_resp, 1]
        apart = jnp.abs(scores[..., :, None, :] - scores[..., None, :, :]) > tol
        pairs = both.sum((-3, -2)) - n  # ordered pairs of distinct responses
        value = safe_ratio((apart & both).sum((-3, -2)), pairs)
    else:
        raise ValueError(f"unknown spread {spread!r}; expected one of {SPREADS}")
    return jnp.where(group_valid & (n >= 2), value, 0.0)


def _item_verdicts(verdicts: Array, soft: bool, threshold: float) -> Array:
    """Soft metrics use p_yes as given; hard ones a yes/no verdict (p_yes >= threshold)."""
    v = jnp.asarray(verdicts, jnp.float32)
    return v if soft else (v >= threshold).astype(jnp.float32)


def item_discriminative(
    verdicts: Array,
    item_valid: Array,
    group_valid: Array,
    *,
    response_valid: Array | None = None,
    soft: bool = False,
    threshold: float = 0.5,
) -> Array:
    """`[..., G, M]`: does item m of group g split the valid induced responses?

    Hard (default): verdicts are binarised at `threshold` and the reward is 1 when some but not
    all responses satisfy the item. Soft: `4 p (1 - p)` with p the mean p_yes over responses,
    the Bernoulli variance scaled to [0, 1]. Invalid items and malformed groups get 0.
    """
    v = _item_verdicts(verdicts, soft, threshold)
    rv = _response_mask(group_valid, response_valid).astype(jnp.float32)
    count = (v * rv[..., :, None, None]).sum(-3)
    n = rv.sum(-1)[..., None, None]
    if soft:
        p = safe_ratio(count, n)
        value = 4.0 * p * (1.0 - p)
    else:
        value = ((count > 0) & (count < n)).astype(jnp.float32)
    return jnp.where(jnp.asarray(item_valid, bool) & group_valid[..., None], value, 0.0)


def item_nonredundant(
    verdicts: Array,
    item_valid: Array,
    group_valid: Array,
    *,
    response_valid: Array | None = None,
    soft: bool = False,
    threshold: float = 0.5,
) -> Array:
    """`[..., G, M]`: does item m's fingerprint over the responses differ from its siblings'?

    The fingerprint of item m of group g is its verdict vector over the valid induced responses.
    The distance to another valid item m' of the same group is the mean absolute difference of
    fingerprints. Hard (default, verdicts binarised at `threshold`): 1 when the distance to
    every other item is positive, so both copies of a duplicate get 0. Soft: the minimum
    distance, in [0, 1]. An item with no valid sibling gets 1; invalid items and malformed
    groups get 0.
    """
    v = _item_verdicts(verdicts, soft, threshold)
    iv = jnp.asarray(item_valid, bool)
    rv = _response_mask(group_valid, response_valid).astype(jnp.float32)
    fingerprint = jnp.moveaxis(v, -3, -1)  # [..., G, M, G_resp]
    diff = jnp.abs(fingerprint[..., :, None, :] - fingerprint[..., None, :, :])
    rv_b = rv[..., None, None, None, :]
    dist = safe_ratio((diff * rv_b).sum(-1), rv_b.sum(-1))  # [..., G, M, M]
    m = iv.shape[-1]
    siblings = iv[..., None, :] & ~jnp.eye(m, dtype=bool)
    min_dist = jnp.min(jnp.where(siblings, dist, 1.0), -1)
    value = min_dist if soft else (min_dist > 0).astype(jnp.float32)
    return jnp.where(iv & group_valid[..., None], value, 0.0)


def genrubric_rewards(
    verdicts: Array,
    weights: Array,
    item_valid: Array,
    *,
    response_valid: Array | None = None,
    comprehensiveness_coef: float = 1.0,
    discrimination_coef: float = 1.0,
    discriminative_coef: float = 0.5,
    nonredundant_coef: float = 0.5,
    spread: Spread = "std",
    soft_items: bool = False,
    threshold: float = 0.5,
    clip_scores: bool = True,
) -> tuple[Array, Array]:
    """Sequence rewards `[..., G]` and item rewards `[..., G, M]` for G rubric groups.

    Inputs: verdicts `[..., G, G, M]` (`[g_resp, g_rub, m]`), signed weights and item_valid
    `[..., G, M]`, optional response_valid `[..., G]`.

    - sequence: `comprehensiveness_coef * comprehensiveness + discrimination_coef *
      group_discrimination` (defaults 1 and 1: a rubric must both describe good answers
      and tell answers apart);
    - item: `discriminative_coef * discriminative + nonredundant_coef * nonredundant`
      (defaults 0.5 and 0.5, so an item that does both earns 1 and one that only splits the
      responses but duplicates a sibling earns 0.5).

    Malformed groups (see `group_validity`) get 0 for both, invalid items 0.

    The sequence rewards read scores clipped to [0, 1] (`clip_scores`, as HealthBench clips
    its aggregate). Unclipped, a score is normalised by the positive weights alone, so a rubric
    of one light positive item and heavy negative ones (``[1] a``, ``[-5] b``, ``[-5] c``)
    spreads its scores over [-10, 1]: its discrimination grows with the ratio of its weights,
    not with what it tells apart, and the answers it scores fall far below 0 in the others'
    comprehensiveness. The GenRubric toy world's generator learned exactly that rubric.
    """
    group_valid = group_validity(weights, item_valid)
    scores = group_scores(verdicts, weights, item_valid, clip=clip_scores)
    sequence = comprehensiveness_coef * cross_rubric_comprehensiveness(scores, group_valid)
    sequence += discrimination_coef * group_discrimination(
        scores, group_valid, response_valid=response_valid, spread=spread
    )
    item_kw = dict(response_valid=response_valid, soft=soft_items, threshold=threshold)
    item = discriminative_coef * item_discriminative(verdicts, item_valid, group_valid, **item_kw)
    item += nonredundant_coef * item_nonredundant(verdicts, item_valid, group_valid, **item_kw)
    return jnp.where(group_valid, sequence, 0.0), item


def genrubric_token_advantages(
    sequence_reward: Array,
    item_reward: Array,
    item_mask: Array,
    token_item_index: Array,
    *,
    group_valid: Array | None = None,
    mode: AdvantageMode = "group_std",
    eps: float = 1e-6,
) -> Array:
    """Rewards to token advantages `[..., G, L]`: group advantages over the G groups of a query
    for the sequence part (when `group_valid` is given, malformed groups are first ranked below
    every well-formed one, `rl.grpo.rank_invalid_last`: a reward of 0 is no penalty when the
    well-formed groups score `[-2, -2]`), `credit.item_advantages` for the item part, then
    `credit.token_level_advantages`."""
    seq_adv = sequence_advantages(sequence_reward, group_valid, mode, eps)
    item_adv = item_advantages(item_reward, item_mask, mode=mode, eps=eps)
    return token_level_advantages(seq_adv, item_adv, token_item_index)


def sequence_advantages(sequence_reward: Array, group_valid: Array | None = None,
                        mode: AdvantageMode = "group_std", eps: float = 1e-6) -> Array:
    """The sequence part of `genrubric_token_advantages`: group advantages `[..., G]` of the
    sequence rewards, malformed groups ranked last first when `group_valid` is given."""
    if group_valid is not None:
        sequence_reward = rank_invalid_last(sequence_reward, group_valid)
    return group_advantages(sequence_reward, mode=mode, eps=eps)


def shuffle_among_valid(values: Array, valid: Array, key: jax.Array) -> Array:
    """`values [..., N]` with the valid entries of each row permuted at random among the valid
    positions (invalid entries stay where they are): the same rewards, no longer attached to
    what earned them. The control run of the GenRubric toy world uses it to tell learning from
    the rewards apart from the sharpening any update of a sampled distribution brings."""
    valid = jnp.asarray(valid, bool)
    noise = jax.random.uniform(key, values.shape)
    # Valid positions in a random order, then the invalid ones in their own order (argsort is
    # stable); and valid positions in their own order, then the invalid ones.
    shuffled = jnp.argsort(jnp.where(valid, noise, 2.0), axis=-1)
    ordered = jnp.argsort(jnp.where(valid, 0, 1), axis=-1)
    source = jnp.take_along_axis(shuffled, jnp.argsort(ordered, axis=-1), axis=-1)
    return jnp.take_along_axis(values, source, axis=-1)
