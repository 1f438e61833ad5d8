"""GRPO over plain arrays: group advantages, chunked token log-probs, the clipped loss, updates.

Everything here is model-agnostic: a model enters only as a function (`unembed` for the
log-probs, `loss_fn` for the update), so the same code trains the policy and the generator.

Conventions: `[B, L]` token arrays are completion tokens with a boolean `mask` of the tokens
that count; `[B, K]` rewards hold K samples per prompt. Named variants (loss aggregation, KL
estimators) live in registries so a config picks them by string.
"""

from __future__ import annotations

from typing import Any, Callable, Literal

import jax
import jax.numpy as jnp
import optax
from jax import lax

Array = jax.Array
AdvantageMode = Literal["group_std", "no_std", "batch_std"]


def safe_ratio(total: Array, denominator: Array) -> Array:
    """`total / denominator`, or 0 where the denominator is 0 (an all-masked batch)."""
    denominator = jnp.asarray(denominator, jnp.float32)
    return jnp.where(denominator > 0, total / jnp.where(denominator > 0, denominator, 1.0), 0.0)


# --------------------------------------------------------------------------------------------
# Advantages
# --------------------------------------------------------------------------------------------


def group_advantages(
    rewards: Array,
    *,
    mode: AdvantageMode = "group_std",
    eps: float = 1e-6,
    valid: Array | None = None,
    ddof: int = 0,
) -> Array:
    """Normalise rewards `[..., K]` within each group of K samples of one prompt.

    - `group_std`: `(r - mean_group) / (std_group + eps)` (GRPO);
    - `no_std`: `r - mean_group` (Dr.GRPO: dividing by the std up-weights easy prompts);
    - `batch_std`: `(r - mean_group) / (std_batch + eps)`, the std of the raw rewards over every
      valid sample of the whole array (TRL's `scale_rewards="batch"`).

    Invalid samples (`valid` False) are left out of every statistic and get advantage 0.
    `ddof=0` is the population std; pass 1 for the unbiased std of TRL/verl.
    Deviations are taken from a valid member of the group before averaging, so a group of equal
    rewards gives exactly 0 (not rounding noise amplified by `1/eps`).
    """
    r = jnp.asarray(rewards, jnp.float32)
    v = jnp.ones(r.shape, bool) if valid is None else jnp.broadcast_to(jnp.asarray(valid, bool), r.shape)
    vf = v.astype(jnp.float32)

    def centred(axis: int | tuple[int, ...] | None) -> tuple[Array, Array]:
        n = vf.sum(axis, keepdims=True)
        anchor = jnp.max(jnp.where(v, r, -jnp.inf), axis, keepdims=True)
        d = jnp.where(v, r - jnp.where(n > 0, anchor, 0.0), 0.0)
        return jnp.where(v, d - d.sum(axis, keepdims=True) / jnp.maximum(n, 1.0), 0.0), n

    adv, n = centred(-1)
    if mode == "no_std":
        return adv
    if mode == "group_std":
        dev, count = adv, n
    elif mode == "batch_std":
        dev, count = centred(None)
    else:
        raise ValueError(f"unknown advantage mode {mode!r}; expected group_std, no_std or batch_std")
    axis = -1 if mode == "group_std" else None
    std = jnp.sqrt(jnp.sum(dev**2, axis, keepdims=True) / jnp.maximum(count - ddof, 1.0))
    return adv / (std + eps)


# --------------------------------------------------------------------------------------------
# Token log-probs without materialising [B, L, V]
# --------------------------------------------------------------------------------------------


def token_logprobs_chunked(
    hidden: Array,
    unembed: Callable[[Array], Array],
    targets: Array,
    *,
    chunk_size: int,
    temperature: float = 1.0,
    return_entropy: bool = False,
    remat: bool = True,
) -> Array | tuple[Array, Array]:
    """`log p(targets)` `[B, L]` (and the entropy `[B, L]`) from final hidden states `[B, L, D]`.

    The vocabulary projection `unembed: [B, C, D] -> [B, C, V]` is applied to one chunk of C
    positions at a time inside `lax.map`, so only `[B, C, V]` logits exist at once; with a
    large vocabulary the full `[B, L, V]` tensor is what runs a long-context step out of memory.
    With `remat` each chunk is a `jax.checkpoint`, so the backward pass recomputes that chunk's
    logits rather than keeping all of them as residuals. L is padded to a multiple of C.
    Logits are divided by `temperature` so the values match what a tempered sampler drew from;
    masking padded-vocabulary logits is the job of `unembed`.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    b, length, d = hidden.shape
    n_chunks = -(-length // chunk_size)
    pad = n_chunks * chunk_size - length
    h = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0))).reshape(b, n_chunks, chunk_size, d).swapaxes(0, 1)
    t = jnp.pad(targets, ((0, 0), (0, pad))).reshape(b, n_chunks, chunk_size).swapaxes(0, 1)

    def chunk(xs: tuple[Array, Array]) -> tuple[Array, ...]:
        h_c, t_c = xs
        logits = unembed(h_c).astype(jnp.float32) / temperature
        lse = jax.nn.logsumexp(logits, axis=-1)
        logp = jnp.take_along_axis(logits, t_c[..., None], axis=-1)[..., 0] - lse
        if not return_entropy:
            return (logp,)
        probs = jnp.exp(logits - lse[..., None])
        return logp, lse - jnp.sum(probs * logits, axis=-1)

    if remat:
        chunk = jax.checkpoint(chunk)
    outs = lax.map(chunk, (h, t))
    outs = tuple(o.swapaxes(0, 1).reshape(b, n_chunks * chunk_size)[:, :length] for o in outs)
    return outs if return_entropy else outs[0]


# --------------------------------------------------------------------------------------------
# Loss aggregation registry: each returns (sum, denominator)
# --------------------------------------------------------------------------------------------

LossAggregation = Callable[[Array, Array, int], tuple[Array, Array]]
LOSS_AGGREGATIONS: dict[str, LossAggregation] = {}


def register_loss_aggregation(name: str) -> Callable[[LossAggregation], LossAggregation]:
    """Register `fn(loss_mat [B, L], mask [B, L] float, max_len) -> (sum, denominator)`."""

    def deco(fn: LossAggregation) -> LossAggregation:
        LOSS_AGGREGATIONS[name] = fn
        return fn

    return deco


@register_loss_aggregation("token-mean")
def _token_mean(loss_mat: Array, mask: Array, max_len: int) -> tuple[Array, Array]:
    """Mean over every valid token of the batch (DAPO): long answers weigh more in total."""
    del max_len
    return jnp.sum(loss_mat * mask), jnp.sum(mask)


@register_loss_aggregation("seq-mean-token-mean")
def _seq_mean_token_mean(loss_mat: Array, mask: Array, max_len: int) -> tuple[Array, Array]:
    """Mean over sequences of each sequence's token mean (original GRPO).

    Sequences with no valid token (e.g. masked-out truncations) are not counted, since their
    mean is undefined. Splitting a batch by rows keeps (sum, denominator) exact.
    """
    del max_len
    per_seq_tokens = jnp.sum(mask, axis=-1)
    seq_mean = safe_ratio(jnp.sum(loss_mat * mask, axis=-1), per_seq_tokens)
    return jnp.sum(seq_mean), jnp.sum((per_seq_tokens > 0).astype(jnp.float32))


@register_loss_aggregation("seq-mean-token-sum-norm")
def _seq_mean_token_sum_norm(loss_mat: Array, mask: Array, max_len: int) -> tuple[Array, Array]:
    """Dr.GRPO: each sequence's token sum over the constant `max_len`, averaged over all rows.

    The denominator `B * max_len` does not depend on lengths or masks, which removes GRPO's
    length bias; every row counts, including fully masked ones.
    """
    return jnp.sum(loss_mat * mask), jnp.asarray(loss_mat.shape[0] * max_len, jnp.float32)


def aggregate_loss(
    loss_mat: Array, mask: Array, mode: str = "token-mean", *, max_len: int | None = None
) -> tuple[Array, Array]:
    """Reduce a per-token loss `[B, L]` to `(sum, denominator)` with the registered `mode`.

    Summing both parts over micro-batches and dividing once gives the full-batch loss exactly.
    `max_len` (Dr.GRPO's constant) defaults to L.
    """
    if mode not in LOSS_AGGREGATIONS:
        raise ValueError(f"unknown loss aggregation {mode!r}; registered: {sorted(LOSS_AGGREGATIONS)}")
    max_len = loss_mat.shape[-1] if max_len is None else max_len
    return LOSS_AGGREGATIONS[mode](loss_mat, jnp.asarray(mask, jnp.float32), max_len)


# --------------------------------------------------------------------------------------------
# KL estimators registry: per-token estimates of KL(pi || pi_ref) from samples of pi
# --------------------------------------------------------------------------------------------

KLEstimator = Callable[[Array, Array], Array]
KL_ESTIMATORS: dict[str, KLEstimator] = {}


def register_kl_estimator(name: str) -> Callable[[KLEstimator], KLEstimator]:
    """Register `fn(logp, ref_logp) -> per-token KL estimate`."""

    def deco(fn: KLEstimator) -> KLEstimator:
        KL_ESTIMATORS[name] = fn
        return fn

    return deco


@register_kl_estimator("k1")
def _kl_k1(logp: Array, ref_logp: Array) -> Array:
    """`logp - ref`: unbiased, high variance, can be negative per token."""
    return logp - ref_logp


@register_kl_estimator("k2")
def _kl_k2(logp: Array, ref_logp: Array) -> Array:
    """`0.5 (logp - ref)^2`: biased value, but as a loss on on-policy samples its gradient is
    the gradient of KL(pi || pi_ref)."""
    return 0.5 * jnp.square(logp - ref_logp)


@register_kl_estimator("k3")
def _kl_k3(logp: Array, ref_logp: Array) -> Array:
    """`exp(ref - logp) - (ref - logp) - 1`: unbiased and non-negative (GRPO's choice)."""
    d = ref_logp - logp
    return jnp.exp(d) - d - 1.0


# --------------------------------------------------------------------------------------------
# The clipped policy loss
# --------------------------------------------------------------------------------------------


def _masked_mean(x: Array, maskf: Array) -> Array:
    return safe_ratio(jnp.sum(x * maskf), jnp.sum(maskf))


def grpo_loss(
    logp: Array,
    old_logp: Array,
    advantages: Array,
    mask: Array,
    *,
    ref_logp: Array | None = None,
    beta: float = 0.01,
    kl_estimator: str = "k3",
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    dual_clip: float | None = None,
    aggregation: str = "token-mean",
    max_len: int | None = None,
    truncated: Array | None = None,
    mask_truncated: bool = False,
    entropy: Array | None = None,
    sampler_logp: Array | None = None,
    loss_denominator: Array | float | None = None,
) -> tuple[Array, dict[str, Array]]:
    """Clipped GRPO/PPO loss over tokens `[B, L]`; returns `(loss, metrics)`.

    Per valid token, with `rho = exp(logp - old_logp)` and advantage A (`[B]` per sequence or
    `[B, L]` per token):

        pg = max(-rho A, -clip(rho, 1 - eps_low, 1 + eps_high) A)

    (`eps_high > eps_low` is DAPO's clip-higher). Dual clip (Ye et al. 2020) bounds the loss for
    negative advantages, where a huge rho would otherwise give an unbounded step: the objective
    becomes `max(min(rho A, clip(rho) A), c A)` for `A < 0`, i.e. `pg = min(pg, -c A)`, with
    `c = dual_clip > 1`. With `beta > 0` and `ref_logp` given, `beta * KL(pi || pi_ref)` is added
    per token using the registered `kl_estimator`. Metrics are auxiliary outputs: differentiate
    `loss` only (e.g. `jax.grad(..., has_aux=True)`). The per-token loss is reduced by the
    registered `aggregation` to (sum, denominator); `loss = sum / denominator`, or
    `sum / loss_denominator` when a global denominator is given (exact micro-batching: the
    micro-batch losses then add up to the full-batch loss).

    `truncated` `[B]` marks completions cut at the length limit; with `mask_truncated` their
    tokens are dropped (DAPO's overlong filtering). Metrics (token means over valid tokens):
    `loss`, `loss_sum`, `loss_denom`, `pg_loss` (same aggregation), `clip_frac_low` /
    `clip_frac_high` (tokens where the lower / upper clip removes the gradient), `clip_frac`,
    `dual_clip_frac` (with dual clip), `kl` (with a KL term), `entropy` (given `[B, L]`
    entropies), `approx_kl` (k3 estimate of KL(old || new)), `ratio_mean`, `truncated_frac`
    (given `truncated`), and `logprob_gap` = mean |sampler_logp - logp|, the sampler-vs-trainer
    mismatch (exact at the first update of a rollout, where trainer and sampler share params).
    """
    if mask_truncated and truncated is None:
        raise ValueError("mask_truncated=True needs the `truncated` [B] flags")
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
    if kl_estimator not in KL_ESTIMATORS:
        raise ValueError(f"unknown KL estimator {kl_estimator!r}; registered: {sorted(KL_ESTIMATORS)}")

    valid = jnp.asarray(mask, bool)
    if mask_truncated:
        valid = valid & ~jnp.asarray(truncated, bool)[:, None]
    maskf = valid.astype(jnp.float32)
    logp = logp.astype(jnp.float32)
    adv = jnp.asarray(advantages, jnp.float32)
    adv = jnp.broadcast_to(adv[:, None] if adv.ndim == 1 else adv, logp.shape)

    # Masked positions may hold garbage (padding): zero them before exp so no inf/NaN leaks.
    log_ratio = jnp.where(valid, logp - old_logp, 0.0)
    ratio = jnp.exp(log_ratio)
    clipped = jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high)
    pg = jnp.maximum(-adv * ratio, -adv * clipped)
    metrics: dict[str, Array] = {}
    if dual_clip is not None:
        dual_active = (adv < 0) & (-dual_clip * adv < pg)
        pg = jnp.where(adv < 0, jnp.minimum(pg, -dual_clip * adv), pg)
        metrics["dual_clip_frac"] = _masked_mean(dual_active.astype(jnp.float32), maskf)

    per_token = pg
    if ref_logp is not None and beta != 0.0:
        kl = KL_ESTIMATORS[kl_estimator](jnp.where(valid, logp, 0.0), jnp.where(valid, ref_logp, 0.0))
        per_token = pg + beta * kl
        metrics["kl"] = _masked_mean(kl, maskf)

    loss_sum, loss_denom = aggregate_loss(per_token, maskf, aggregation, max_len=max_len)
    loss = safe_ratio(loss_sum, loss_denom if loss_denominator is None else loss_denominator)
    pg_sum, pg_denom = aggregate_loss(pg, maskf, aggregation, max_len=max_len)

    clip_low = ((adv < 0) & (ratio < 1.0 - eps_low)).astype(jnp.float32)
    clip_high = ((adv > 0) & (ratio > 1.0 + eps_high)).astype(jnp.float32)
    metrics.update(
        loss=loss,
        loss_sum=loss_sum,
        loss_denom=loss_denom,
        pg_loss=safe_ratio(pg_sum, pg_denom),
        clip_frac_low=_masked_mean(clip_low, maskf),
        clip_frac_high=_masked_mean(clip_high, maskf),
        clip_frac=_masked_mean(clip_low + clip_high, maskf),
        approx_kl=_masked_mean(ratio - 1.0 - log_ratio, maskf),
        ratio_mean=_masked_mean(ratio, maskf),
    )
    if entropy is not None:
        metrics["entropy"] = _masked_mean(entropy, maskf)
    if truncated is not None:
        metrics["truncated_frac"] = jnp.mean(jnp.asarray(truncated, jnp.float32))
    if sampler_logp is not None:
        gap = jnp.abs(jnp.where(valid, sampler_logp - logp, 0.0))
        metrics["logprob_gap"] = _masked_mean(gap, maskf)
    return loss, metrics


# --------------------------------------------------------------------------------------------
# Update step
# --------------------------------------------------------------------------------------------


def grpo_update(
    params: Any,
    opt_state: optax.OptState,
    batch: Any,
    loss_fn: Callable[[Any, Any], tuple[Array, dict[str, Array]]],
    optimizer: optax.GradientTransformation,
    *,
    num_updates: int = 1,
) -> tuple[Any, optax.OptState, dict[str, Array]]:
    """Take `num_updates` (GRPO's mu) optimiser steps on one rollout `batch`.

    The batch carries the rollout's stored old log-probs, so after the first step the ratio
    moves away from 1 and clipping starts to bind. `params` is any pytree (an NNX state works);
    `loss_fn(params, batch) -> (loss, metrics)`. The steps run in one `lax.scan`, so this is
    jittable with `loss_fn`, `optimizer` and `num_updates` static. Returned metrics are
    stacked along a leading `[num_updates]` axis and include `loss` and `grad_norm` (global
    L2 norm of the gradient before the optimiser).
    """
    if num_updates < 1:
        raise ValueError(f"num_updates must be >= 1, got {num_updates}")
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

    Carry = tuple[Any, optax.OptState]

    def step(carry: Carry, _: None) -> tuple[Carry, dict[str, Array]]:
        p, state = carry
        (loss, metrics), grads = grad_fn(p, batch)
        updates, state = optimizer.update(grads, state, p)
        p = optax.apply_updates(p, updates)
        return (p, state), {**metrics, "loss": loss, "grad_norm": optax.global_norm(grads)}

    (params, opt_state), metrics = lax.scan(step, (params, opt_state), None, length=num_updates)
    return params, opt_state, metrics
