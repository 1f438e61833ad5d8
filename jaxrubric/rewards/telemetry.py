"""What the evaluator is doing, as a round's scalars: saturation, spread, rubric health, the
policy's answer lengths and, with a ground truth, agreement (docs/observability.md).

Computed inside the round program from arrays the reward stage already holds, so only scalars
leave the device. Every name has one prefix per role: `telemetry/generator/` (the rubrics it
wrote, as the verifier judged them), `telemetry/policy/` (its answers and their rewards).
`tests/training/test_telemetry.py` recomputes each one with NumPy from the round's cards.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxrubric.rl.grpo import masked_mean

Array = jax.Array
GENERATOR = "telemetry/generator/"
POLICY = "telemetry/policy/"
PASS = 0.5  # a soft verdict (p_yes) passes above this, as the hard verdict does


class Judgement(NamedTuple):
    """A round's answers `[B, A]` judged under its rubrics `[B, G]` of up to M items."""

    verdicts: Array  # [B, A, G, M] 0/1 or p_yes
    weights: Array  # [B, G, M] int, signed for GenRubric
    item_valid: Array  # [B, G, M] items that parsed (of complete rubrics)
    group_valid: Array  # [B, G] rubrics that score answers
    complete: Array  # [B, G] the rubric's end token was written
    items: Array  # [B, G, M, Li] item token ids
    item_lengths: Array  # [B, G, M]
    reward: Array  # [B, A] the policy's reward of each answer
    reward_valid: Array  # [B, A] answers that have a reward
    answer_lengths: Array  # [B, A] tokens, without the stop token
    oracle: Array | None = None  # [B, A] the ground truth, where the world has one
    rubric_reward: Array | None = None  # [B, A] the evaluator's score (agreement)


def saturated(verdicts: Array, item_valid: Array) -> Array:
    """`[B, G, M]`: valid items that every answer passes, or none does (they say nothing about
    which answer is better)."""
    passed = jnp.asarray(verdicts) > PASS  # [B, A, G, M]
    return item_valid & (passed.all(1) | ~passed.any(1))


def duplicate_items(items: Array, item_lengths: Array, item_valid: Array) -> Array:
    """`[B, G, M]`: valid items whose tokens equal an earlier valid item's of the same rubric."""
    text = jnp.where(jnp.arange(items.shape[-1]) < item_lengths[..., None], items, -1)
    same = (text[..., :, None, :] == text[..., None, :, :]).all(-1)  # [B, G, M, M]
    m = items.shape[-2]
    earlier = jnp.tril(jnp.ones((m, m), bool), -1)  # [m, m'] m' < m
    both = item_valid[..., :, None] & item_valid[..., None, :]
    return (same & earlier & both).any(-1)


def redundant_items(verdicts: Array, item_valid: Array) -> Array:
    """`[B, G, M]`: valid items whose pass/fail over every answer (their fingerprint) equals
    another valid item's of the same rubric (GenRubric's non-redundancy reward is 0 there)."""
    passed = jnp.moveaxis(jnp.asarray(verdicts) > PASS, 1, -1)  # [B, G, M, A]
    same = (passed[..., :, None, :] == passed[..., None, :, :]).all(-1)
    m = passed.shape[-2]
    others = item_valid[..., :, None] & item_valid[..., None, :] & ~jnp.eye(m, dtype=bool)
    return (same & others).any(-1)


def tied_prompts(reward: Array, valid: Array) -> Array:
    """The share of prompts whose rewarded answers all have one reward: their advantages are
    zero, so the policy learns nothing from them (TRL's `frac_reward_zero_std`)."""
    top = jnp.where(valid, reward, -jnp.inf).max(-1)
    bottom = jnp.where(valid, reward, jnp.inf).min(-1)
    return jnp.mean(jnp.where(valid.any(-1), top == bottom, True).astype(jnp.float32))


def score_length_correlation(reward: Array, lengths: Array, valid: Array) -> Array:
    """The Pearson correlation of reward and answer length over each prompt's answers, averaged
    over the prompts where both vary (0 where none does): a rubric that pays for length shows
    here before the answers get long."""
    x, y = reward.astype(jnp.float32), lengths.astype(jnp.float32)
    dx = x - masked_mean(x, valid, axis=-1)[..., None]
    dy = y - masked_mean(y, valid, axis=-1)[..., None]
    sxy = masked_mean(dx * dy, valid, axis=-1)
    sxx, syy = masked_mean(dx * dx, valid, axis=-1), masked_mean(dy * dy, valid, axis=-1)
    varies = (sxx > 1e-12) & (syy > 1e-12)
    corr = sxy / jnp.sqrt(jnp.where(varies, sxx * syy, 1.0))
    return masked_mean(corr, varies)


def pair_agreement(score: Array, truth: Array) -> Array:
    """Over each prompt's answer pairs the ground truth orders, the share the score orders the
    same way, ties counting half (pooled over the batch)."""
    better = truth[..., :, None] > truth[..., None, :]
    gap = score[..., :, None] - score[..., None, :]
    agree = jnp.where(gap > 0, 1.0, jnp.where(gap == 0, 0.5, 0.0))
    return masked_mean(agree, better)


def round_telemetry(j: Judgement, rubric_lengths: Array, *, redundancy: bool = False
                    ) -> dict[str, Array]:
    """The round's telemetry scalars (see the module docstring); `rubric_lengths` `[B, G]` in
    tokens (the write stage's, which the generator's update reads too: not part of the
    `Judgement` a reward stage returns, so that no stage reads a copy of it from another mesh);
    `redundancy`: GenRubric's fingerprint redundancy too."""
    scoring = j.item_valid & j.group_valid[..., None]  # items of the rubrics that score
    weight = jnp.abs(j.weights).astype(jnp.float32)
    sat = saturated(j.verdicts, scoring)
    p = jnp.asarray(j.verdicts, jnp.float32).mean(1)  # [B, G, M] over the answers
    signed = j.weights.astype(jnp.float32)
    w_mean = masked_mean(signed, scoring)
    lengths = j.answer_lengths.astype(jnp.float32)
    out = {
        GENERATOR + "saturated_items": masked_mean(sat, scoring),
        GENERATOR + "saturated_weight": (jnp.where(sat, weight, 0.0).sum()
                                         / jnp.maximum(jnp.where(scoring, weight, 0.0).sum(),
                                                       1e-9)),
        GENERATOR + "item_discriminability": masked_mean(p * (1.0 - p), scoring),
        GENERATOR + "invalid_rubrics": 1.0 - j.group_valid.mean(),
        GENERATOR + "truncated_rubrics": 1.0 - j.complete.mean(),
        GENERATOR + "items_per_rubric": masked_mean(scoring.sum(-1), j.group_valid),
        GENERATOR + "weight_mean": w_mean,
        GENERATOR + "weight_std": jnp.sqrt(masked_mean(jnp.square(signed - w_mean), scoring)),
        GENERATOR + "rubric_tokens": masked_mean(rubric_lengths, j.group_valid),
        GENERATOR + "duplicate_items": masked_mean(
            duplicate_items(j.items, j.item_lengths, scoring), scoring),
        POLICY + "tied_prompts": tied_prompts(j.reward, j.reward_valid),
        POLICY + "length_mean": lengths.mean(),
        POLICY + "length_std": lengths.std(),
        POLICY + "score_length_corr": score_length_correlation(j.reward, lengths,
                                                                j.reward_valid),
    }
    if redundancy:
        out[GENERATOR + "redundant_items"] = masked_mean(redundant_items(j.verdicts, scoring),
                                                         scoring)
    if j.oracle is not None and j.rubric_reward is not None:
        out[GENERATOR + "oracle_agreement"] = pair_agreement(j.rubric_reward, j.oracle)
    return out
