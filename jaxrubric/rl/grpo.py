"""GRPO over plain arrays: group advantages, chunked token log-probs, the clipped loss, updates.

Everything here is model-agnostic: a model enters only as a function (`unembed` for the
log-probs, `loss_fn` for the update), so the same code trains the policy and the generator.

Conventions: `[B, L]` token arrays are completion tokens with a boolean `mask` of the tokens
that count; `[B, K]` rewards hold K samples per prompt. Named variants (loss aggregation, KL
estimators) live in registries so a config picks them by string.
"""

from __future__ import annotations

import typing
from typing import Any, Callable, Literal, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax import lax

from jaxrubric import microbatch

Array = jax.Array
AdvantageMode = Literal["group_std", "no_std", "batch_std"]
ADVANTAGE_MODES: tuple[str, ...] = typing.get_args(AdvantageMode)


def safe_ratio(total: Array, denominator: Array) -> Array:
    """`total / denominator`, or 0 where the denominator is 0 (an all-masked batch)."""
    denominator = jnp.asarray(denominator, jnp.float32)
    return jnp.where(denominator > 0, total / jnp.where(denominator > 0, denominator, 1.0), 0.0)


def masked_mean(x: Array, mask: Array, axis: int | tuple[int, ...] | None = None) -> Array:
    """Mean of `x` over the entries where `mask` (broadcast to `x`) holds, along `axis` (None:
    all); 0 where it holds nowhere. Masked entries carry nothing, even NaN."""
    mask = jnp.broadcast_to(jnp.asarray(mask, bool), jnp.shape(x))
    return safe_ratio(jnp.where(mask, x, 0.0).sum(axis), mask.sum(axis))


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


def rank_invalid_last(rewards: Array, valid: Array, *, margin: float = 1.0) -> Array:
    """Rewards `[..., G]` with each invalid sample's set `margin` below the lowest valid one
    of its group, so that its advantage is the group's lowest whatever the valid rewards'
    range (a fixed penalty such as 0 or -1 is not below a reward that can be more negative).
    A group with no valid sample gets 0 everywhere: nothing to learn from it."""
    valid = jnp.broadcast_to(jnp.asarray(valid, bool), jnp.shape(rewards))
    lowest = jnp.min(jnp.where(valid, rewards, jnp.inf), axis=-1, keepdims=True)
    ranked = jnp.where(valid, rewards, lowest - margin)
    return jnp.where(valid.any(-1, keepdims=True), ranked, 0.0)


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
    reference: tuple[Array, Callable[[Array], Array]] | None = None,
) -> Array | tuple[Array, ...]:
    """`log p(targets)` `[B, L]` (and the entropy `[B, L]`) from final hidden states `[B, L, D]`.

    The vocabulary projection `unembed: [B, C, D] -> [B, C, V]` is applied to one chunk of C
    positions at a time inside `lax.map`, so only `[B, C, V]` logits exist at once; with a
    large vocabulary the full `[B, L, V]` tensor is what runs a long-context step out of memory.
    With `remat` each chunk is a `jax.checkpoint`, so the backward pass recomputes that chunk's
    logits rather than keeping all of them as residuals. L is padded to a multiple of C.
    Logits are divided by `temperature` so the values match what a tempered sampler drew from;
    masking padded-vocabulary logits is the job of `unembed`.

    `reference = (ref_hidden [B, L, D], ref_unembed)`: also return the forward KL from the
    reference's next-token distribution to this one at each position, `sum_v p_ref (log p_ref -
    log p)` `[B, L]`, over the whole vocabulary (the last output). Unlike a KL estimated on the
    sampled token, it grows as this distribution drops a token the reference writes, even one
    never sampled (mass-covering); no gradient flows into the reference.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    b, length = targets.shape
    n_chunks = -(-length // chunk_size)
    pad = n_chunks * chunk_size - length
    def chunks(x: Array) -> Array:  # [B, L, ...] -> [n_chunks, B, C, ...]
        x = jnp.pad(x, ((0, 0), (0, pad)) + ((0, 0),) * (x.ndim - 2))
        return x.reshape(b, n_chunks, chunk_size, *x.shape[2:]).swapaxes(0, 1)

    ref = None if reference is None else chunks(lax.stop_gradient(reference[0]))

    def chunk(xs: tuple[Array, Array, Array | None]) -> tuple[Array, ...]:
        h_c, t_c, ref_c = xs
        logits = unembed(h_c).astype(jnp.float32) / temperature
        lse = jax.nn.logsumexp(logits, axis=-1)
        logp = jnp.take_along_axis(logits, t_c[..., None], axis=-1)[..., 0] - lse
        outs = [logp]
        # -sum p log p, each log p = z - lse: `lse - sum(p z)` is the same in exact arithmetic
        # but cancels two sums of the logits' size (~1e-5 off at |z| ~ 10 in float32, 10x
        # this form's error), which is all a near-certain token's entropy is made of.
        logp_all = logits - lse[..., None]
        if return_entropy:
            outs.append(-jnp.sum(jnp.exp(logp_all) * logp_all, axis=-1))
        if ref_c is not None:
            ref_all = lax.stop_gradient(jax.nn.log_softmax(
                reference[1](ref_c).astype(jnp.float32) / temperature, axis=-1))
            outs.append(jnp.sum(jnp.exp(ref_all) * (ref_all - logp_all), axis=-1))
        return tuple(outs)

    if remat:
        chunk = jax.checkpoint(chunk)
    outs = lax.map(chunk, (chunks(hidden), chunks(targets), ref))
    outs = tuple(o.swapaxes(0, 1).reshape(b, n_chunks * chunk_size)[:, :length] for o in outs)
    return outs if len(outs) > 1 else outs[0]


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

# |log pi - log pi_old| (and |log pi_ref - log pi| in k3) is clamped to this before `exp`: a
# ratio of e^20 ~ 5e8 is already meaningless, and e^89 overflows float32 (Tunix clamps at 20).
LOG_RATIO_BOUND = 20.0

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
    """`exp(ref - logp) - (ref - logp) - 1`: unbiased and non-negative (GRPO's choice); the
    log-ratio is bounded by `LOG_RATIO_BOUND` before `exp`."""
    d = jnp.clip(ref_logp - logp, -LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    return jnp.exp(d) - d - 1.0


# --------------------------------------------------------------------------------------------
# The clipped policy loss
# --------------------------------------------------------------------------------------------


def _valid_tokens(mask: Array, truncated: Array | None, mask_truncated: bool) -> Array:
    """The tokens that count: `mask`, less truncated completions under `mask_truncated`."""
    if mask_truncated and truncated is None:
        raise ValueError("mask_truncated=True needs the `truncated` [B] flags")
    valid = jnp.asarray(mask, bool)
    if mask_truncated:
        valid = valid & ~jnp.asarray(truncated, bool)[:, None]
    return valid


class BatchTotals(NamedTuple):
    """The whole batch's denominators, for `grpo_loss` on one micro-batch of it.

    Dividing by these instead of the micro-batch's own makes the loss and every metric that
    micro-batch's share of the full-batch value, so sums over micro-batches (and the sums of
    their gradients) are exactly the full-batch ones, whatever the aggregation.
    """

    loss: Array  # the aggregation's denominator
    tokens: Array  # valid tokens
    rows: Array | int  # sequences


def batch_totals(mask: Array, aggregation: str = "token-mean", *, max_len: int | None = None,
                 truncated: Array | None = None, mask_truncated: bool = False) -> BatchTotals:
    """`BatchTotals` of the full batch `[B, L]`, with `grpo_loss`'s arguments of the same
    names. The denominators depend on the mask alone, so they are known before any loss."""
    maskf = _valid_tokens(mask, truncated, mask_truncated).astype(jnp.float32)
    _, denominator = aggregate_loss(jnp.zeros_like(maskf), maskf, aggregation, max_len=max_len)
    return BatchTotals(denominator, jnp.sum(maskf), maskf.shape[0])


def grpo_loss(
    logp: Array,
    old_logp: Array,
    advantages: Array,
    mask: Array,
    *,
    ref_logp: Array | None = None,
    kl: Array | None = None,
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
    entropy_coef: float = 0.0,
    sampler_logp: Array | None = None,
    totals: BatchTotals | None = None,
) -> tuple[Array, dict[str, Array]]:
    """Clipped GRPO/PPO loss over tokens `[B, L]`; returns `(loss, metrics)`.

    Per valid token, with `rho = exp(logp - old_logp)` and advantage A (`[B]` per sequence or
    `[B, L]` per token):

        pg = max(-rho A, -clip(rho, 1 - eps_low, 1 + eps_high) A)

    (`eps_high > eps_low` is DAPO's clip-higher). Dual clip (Ye et al. 2020) bounds the loss for
    negative advantages, where a huge rho would otherwise give an unbounded step: the objective
    becomes `max(min(rho A, clip(rho) A), c A)` for `A < 0`, i.e. `pg = min(pg, -c A)`, with
    `c = dual_clip > 1`. With `beta > 0` and `ref_logp` given, `beta * KL(pi || pi_ref)` is added
    per token using the registered `kl_estimator`, or `kl` `[B, L]` when given (a per-token KL
    the caller computed, e.g. the full-vocabulary one of `token_logprobs_chunked`). Metrics are
    auxiliary outputs: differentiate `loss` only (e.g. `jax.grad(..., has_aux=True)`). The
    per-token loss is reduced by the registered `aggregation` to (sum, denominator);
    `loss = sum / denominator`. With `entropy_coef > 0` the per-token loss also subtracts
    `entropy_coef * entropy` (an entropy bonus: pass the entropy with its gradient), which keeps
    probability on tokens the policy gradient alone would stop sampling.

    On a micro-batch of a larger batch, pass the full batch's `totals` (`batch_totals`): the
    loss and every metric are then this micro-batch's share of the full-batch value, and the
    shares (and their gradients) sum exactly to the full-batch loss and metrics.

    `truncated` `[B]` marks completions cut at the length limit; with `mask_truncated` their
    tokens are dropped (DAPO's overlong filtering). Metrics (token means over valid tokens):
    `loss`, `loss_sum`, `loss_denom`, `pg_loss` (same aggregation), `clip_frac_low` /
    `clip_frac_high` (tokens where the lower / upper clip removes the gradient), `clip_frac`,
    `dual_clip_frac` (with dual clip), `kl` (with a KL term), `entropy` (given `[B, L]`
    entropies), `approx_kl` (k3 estimate of KL(old || new)), `ratio_mean`, `truncated_frac`
    (given `truncated`), and `logprob_gap` = mean |sampler_logp - logp|, the sampler-vs-trainer
    mismatch (exact at the first update of a rollout, where trainer and sampler share params).
    """
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
    if kl_estimator not in KL_ESTIMATORS:
        raise ValueError(f"unknown KL estimator {kl_estimator!r}; registered: {sorted(KL_ESTIMATORS)}")

    valid = _valid_tokens(mask, truncated, mask_truncated)
    maskf = valid.astype(jnp.float32)
    tokens = jnp.sum(maskf) if totals is None else totals.tokens

    def token_mean(x: Array) -> Array:
        return safe_ratio(jnp.sum(x * maskf), tokens)

    logp = logp.astype(jnp.float32)
    adv = jnp.asarray(advantages, jnp.float32)
    adv = jnp.broadcast_to(adv[:, None] if adv.ndim == 1 else adv, logp.shape)

    # Masked positions may hold garbage (padding): zero them before exp so no inf/NaN leaks.
    # The bound keeps exp finite when the policy has moved far from the sampler (past it the
    # ratio is clipped anyway, except under an unclipped negative advantage).
    log_ratio = jnp.clip(jnp.where(valid, logp - old_logp, 0.0), -LOG_RATIO_BOUND,
                         LOG_RATIO_BOUND)
    ratio = jnp.exp(log_ratio)
    clipped = jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high)
    pg = jnp.maximum(-adv * ratio, -adv * clipped)
    metrics: dict[str, Array] = {}
    if dual_clip is not None:
        dual_active = (adv < 0) & (-dual_clip * adv < pg)
        pg = jnp.where(adv < 0, jnp.minimum(pg, -dual_clip * adv), pg)
        metrics["dual_clip_frac"] = token_mean(dual_active.astype(jnp.float32))

    per_token = pg
    if kl is None and ref_logp is not None and beta != 0.0:
        kl = KL_ESTIMATORS[kl_estimator](jnp.where(valid, logp, 0.0), jnp.where(valid, ref_logp, 0.0))
    if kl is not None and beta != 0.0:
        kl = jnp.where(valid, kl, 0.0)
        per_token = pg + beta * kl
        metrics["kl"] = token_mean(kl)
    if entropy_coef != 0.0:
        if entropy is None:
            raise ValueError("entropy_coef needs the per-token entropy")
        if entropy_coef < 0:
            raise ValueError(f"entropy_coef must be >= 0, got {entropy_coef}")
        per_token = per_token - entropy_coef * jnp.where(valid, entropy, 0.0)

    loss_sum, loss_denom = aggregate_loss(per_token, maskf, aggregation, max_len=max_len)
    pg_sum, _ = aggregate_loss(pg, maskf, aggregation, max_len=max_len)
    denominator = loss_denom if totals is None else totals.loss

    clip_low = ((adv < 0) & (ratio < 1.0 - eps_low)).astype(jnp.float32)
    clip_high = ((adv > 0) & (ratio > 1.0 + eps_high)).astype(jnp.float32)
    metrics.update(
        loss=safe_ratio(loss_sum, denominator),
        loss_sum=loss_sum,
        loss_denom=loss_denom,
        pg_loss=safe_ratio(pg_sum, denominator),
        clip_frac_low=token_mean(clip_low),
        clip_frac_high=token_mean(clip_high),
        clip_frac=token_mean(clip_low + clip_high),
        approx_kl=token_mean(ratio - 1.0 - log_ratio),
        ratio_mean=token_mean(ratio),
    )
    if entropy is not None:
        metrics["entropy"] = token_mean(entropy)
    if truncated is not None:
        rows = logp.shape[0] if totals is None else totals.rows
        metrics["truncated_frac"] = jnp.sum(jnp.asarray(truncated, jnp.float32)) / rows
    if sampler_logp is not None:
        metrics["logprob_gap"] = token_mean(jnp.abs(jnp.where(valid, sampler_logp - logp, 0.0)))
    return metrics["loss"], metrics


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
    micro_batches: int = 1,
) -> tuple[Any, optax.OptState, dict[str, Array]]:
    """Take `num_updates` (GRPO's mu) optimiser steps on one rollout `batch`.

    The batch carries the rollout's stored old log-probs, so after the first step the ratio
    moves away from 1 and clipping starts to bind. `params` is any pytree (an NNX state works);
    `loss_fn(params, batch) -> (loss, metrics)`. The steps run in one `lax.scan`, so this is
    jittable with `loss_fn`, `optimizer` and `num_updates` static. Returned metrics are
    stacked along a leading `[num_updates]` axis and include `loss`, `grad_norm` (global
    L2 norm of the gradient before the optimiser) and `skipped` (1 for a step whose loss or
    gradient was not finite: it changed neither the parameters nor the optimiser state).

    With `micro_batches = n > 1`, every leaf of `batch` has the rows as its leading axis and
    each step splits them into n micro-batches (`microbatch.split`), summing the loss, the
    metrics and the gradients of `loss_fn` over them in a `lax.scan`: only one micro-batch's
    activations exist at a time. `loss_fn` must then return its micro-batch's share of the
    full-batch loss and metrics (`grpo_loss` with the full batch's `totals`), and the step is
    the full-batch step.
    """
    for name, value in (("num_updates", num_updates), ("micro_batches", micro_batches)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    if micro_batches > 1:
        grad_fn = _summed_over_micro_batches(grad_fn)
        batch = microbatch.split(batch, micro_batches)

    Carry = tuple[Any, optax.OptState]

    def step(carry: Carry, _: None) -> tuple[Carry, dict[str, Array]]:
        p, state = carry
        (loss, metrics), grads = grad_fn(p, batch)
        grad_norm = optax.global_norm(grads)
        updates, new_state = optimizer.update(grads, state, p)
        # A non-finite loss or gradient skips the step: parameters and optimiser state stay
        # as they were, so one bad batch never poisons the weights (the caller counts skips).
        finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
        keep = lambda new, old: jax.tree.map(  # noqa: E731
            lambda a, b: jnp.where(finite, a, b), new, old)
        p, state = keep(optax.apply_updates(p, updates), p), keep(new_state, state)
        return (p, state), {**metrics, "loss": loss, "grad_norm": grad_norm,
                            "skipped": 1.0 - finite.astype(jnp.float32)}

    (params, opt_state), metrics = lax.scan(step, (params, opt_state), None, length=num_updates)
    return params, opt_state, metrics


def _summed_over_micro_batches(grad_fn: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """`grad_fn(params, split_batch)` summed over the micro-batches `[n, ...]` of a split batch,
    one after another in a `lax.scan` (the accumulator is the gradient's size)."""

    def summed(params: Any, split_batch: Any) -> Any:
        first = jax.tree.map(lambda x: x[0], split_batch)
        shapes = jax.eval_shape(grad_fn, params, first)
        zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)

        def add(total: Any, micro: Any) -> tuple[Any, None]:
            return jax.tree.map(jnp.add, total, grad_fn(params, micro)), None

        return lax.scan(add, zeros, split_batch)[0]

    return summed
