"""GRPO math against independent NumPy references written token by token."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxrubric.rl import grpo

AGGREGATIONS = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]

# Jitted alias: one compilation per configuration is cheaper than eager op-by-op dispatch.
grpo_loss = jax.jit(grpo.grpo_loss, static_argnames=(
    "beta", "kl_estimator", "eps_low", "eps_high", "dual_clip", "aggregation", "max_len", "mask_truncated",
    "entropy_coef"))


# ------------------------------------------------------------------------------------------
# NumPy reference of the token loss and its gradient w.r.t. logp
# ------------------------------------------------------------------------------------------


def reference_loss(logp, old, adv, mask, *, ref=None, beta=0.0, est="k3", eps_low=0.2, eps_high=0.2,
                   dual=None, agg="token-mean", max_len=None, truncated=None, mask_truncated=False):
    logp, old = np.float64(logp), np.float64(old)
    b_, l_ = logp.shape
    valid = np.array(mask, bool)
    if mask_truncated:
        valid[np.asarray(truncated, bool)] = False
    adv = np.float64(adv)
    tok_loss = np.zeros((b_, l_))
    tok_grad = np.zeros((b_, l_))
    for b in range(b_):
        for t in range(l_):
            if not valid[b, t]:
                continue
            a = adv[b] if adv.ndim == 1 else adv[b, t]
            rho = np.exp(logp[b, t] - old[b, t])
            unclipped = -a * rho
            clipped = -a * min(max(rho, 1 - eps_low), 1 + eps_high)
            if unclipped >= clipped:
                loss, grad = unclipped, -a * rho
            else:
                loss, grad = clipped, 0.0
            if dual is not None and a < 0 and -dual * a < loss:
                loss, grad = -dual * a, 0.0
            if ref is not None and beta != 0:
                diff = logp[b, t] - ref[b, t]
                if est == "k1":
                    kl, dkl = diff, 1.0
                elif est == "k2":
                    kl, dkl = 0.5 * diff**2, diff
                else:
                    kl, dkl = np.exp(-diff) + diff - 1, 1 - np.exp(-diff)
                loss, grad = loss + beta * kl, grad + beta * dkl
            tok_loss[b, t], tok_grad[b, t] = loss, grad
    weight = np.zeros((b_, l_))
    if agg == "token-mean":
        weight[valid] = 1.0 / valid.sum()
    elif agg == "seq-mean-token-mean":
        counts = valid.sum(1)
        for b in range(b_):
            if counts[b]:
                weight[b, valid[b]] = 1.0 / (counts[b] * (counts > 0).sum())
    else:
        weight[valid] = 1.0 / (b_ * (l_ if max_len is None else max_len))
    return (tok_loss * weight).sum(), tok_grad * weight


def make_batch(seed, b=4, length=7, spread=0.4, token_adv=False):
    rng = np.random.default_rng(seed)
    logp = -rng.uniform(0.1, 3.0, (b, length)).astype(np.float32)
    old = (logp + rng.normal(0, spread, (b, length))).astype(np.float32)
    ref = (logp + rng.normal(0, 0.5, (b, length))).astype(np.float32)
    adv = rng.normal(0, 1, (b, length) if token_adv else (b,)).astype(np.float32)
    mask = rng.uniform(size=(b, length)) < 0.8
    mask[:, 0] = True
    mask[2, :] = False  # a row with no valid token
    return logp, old, ref, adv, mask


def check_against_reference(kwargs, ref_kwargs, seed=0, token_adv=False, spread=0.4):
    logp, old, ref, adv, mask = make_batch(seed, token_adv=token_adv, spread=spread)
    fn = lambda lp: grpo.grpo_loss(lp, old, adv, mask, ref_logp=ref, **kwargs)
    (loss, metrics), grad = jax.jit(jax.value_and_grad(fn, has_aux=True))(jnp.asarray(logp))
    want_loss, want_grad = reference_loss(logp, old, adv, mask, ref=ref, **ref_kwargs)
    np.testing.assert_allclose(loss, want_loss, atol=1e-6, rtol=1e-6)
    np.testing.assert_allclose(grad, want_grad, atol=1e-6, rtol=1e-5)
    return metrics


@pytest.mark.parametrize("agg", AGGREGATIONS)
@pytest.mark.parametrize("est", ["k1", "k2", "k3"])
def test_loss_matches_reference_for_aggregations_and_kl(agg, est):
    check_against_reference(
        dict(beta=0.05, kl_estimator=est, aggregation=agg),
        dict(beta=0.05, est=est, agg=agg),
    )


@pytest.mark.parametrize("agg", AGGREGATIONS)
def test_clip_higher_dual_clip_token_advantages(agg):
    kwargs = dict(eps_low=0.2, eps_high=0.28, dual_clip=1.3, aggregation=agg, beta=0.0)
    metrics = check_against_reference(
        kwargs, dict(eps_low=0.2, eps_high=0.28, dual=1.3, agg=agg), token_adv=True, spread=0.8, seed=3
    )
    assert float(metrics["dual_clip_frac"]) > 0  # the dual branch is exercised
    assert float(metrics["clip_frac_high"]) > 0 and float(metrics["clip_frac_low"]) > 0


def test_dr_grpo_custom_max_len_and_truncation_masking():
    truncated = np.array([False, True, False, False])
    logp, *_ = make_batch(1)
    for mask_truncated in (False, True):
        metrics = check_against_reference(
            dict(aggregation="seq-mean-token-sum-norm", max_len=32, truncated=truncated,
                 mask_truncated=mask_truncated, beta=0.01),
            dict(agg="seq-mean-token-sum-norm", max_len=32, truncated=truncated,
                 mask_truncated=mask_truncated, beta=0.01),
            seed=1,
        )
        np.testing.assert_allclose(metrics["truncated_frac"], 0.25)
    # truncation masking changes the loss
    logp, old, ref, adv, mask = make_batch(1)
    a, _ = grpo_loss(logp, old, adv, mask, truncated=truncated, mask_truncated=True)
    b, _ = grpo_loss(logp, old, adv, mask, truncated=truncated)
    assert abs(float(a) - float(b)) > 1e-4


def test_no_kl_without_reference_or_beta():
    logp, old, ref, adv, mask = make_batch(2)
    base, m0 = grpo_loss(logp, old, adv, mask)
    zero_beta, m1 = grpo_loss(logp, old, adv, mask, ref_logp=ref, beta=0.0)
    np.testing.assert_allclose(base, zero_beta)
    assert "kl" not in m0 and "kl" not in m1
    with_kl, m2 = grpo_loss(logp, old, adv, mask, ref_logp=ref, beta=0.1)
    assert "kl" in m2 and float(with_kl) != float(base)


@pytest.mark.parametrize("agg", AGGREGATIONS)
def test_entropy_bonus_subtracts_the_aggregated_entropy(agg):
    """`entropy_coef` c: the loss drops by c x the entropy aggregated as the loss is (token-mean:
    the mean over valid tokens, NumPy), linearly in c, and its gradient reaches the entropy of
    valid tokens only."""
    logp, old, ref, adv, mask = make_batch(6)
    entropy = np.random.default_rng(1).uniform(0, 2, logp.shape).astype(np.float32)
    truncated = np.array([False, True, False, True])
    kw = dict(ref_logp=ref, beta=0.05, aggregation=agg, truncated=truncated)

    def loss(e, c):
        return grpo_loss(logp, old, adv, mask, entropy=e, entropy_coef=c, **kw)[0]

    base, once, twice = (float(loss(entropy, c)) for c in (0.0, 0.1, 0.2))
    assert once < base
    np.testing.assert_allclose(twice - base, 2 * (once - base), rtol=1e-4)
    if agg == "token-mean":
        np.testing.assert_allclose(base - once, 0.1 * entropy[mask].mean(), rtol=1e-5)
    grad = np.asarray(jax.grad(loss)(jnp.asarray(entropy), 0.1))
    assert np.all(grad[~mask] == 0) and np.all(grad[mask] <= 0) and np.any(grad[mask] < 0)
    with pytest.raises(ValueError, match="entropy_coef must be >= 0"):
        grpo_loss(logp, old, adv, mask, entropy=entropy, entropy_coef=-0.1)
    with pytest.raises(ValueError, match="needs the per-token entropy"):
        grpo_loss(logp, old, adv, mask, entropy_coef=0.1)


def test_metrics_match_numpy():
    logp, old, ref, adv, mask = make_batch(4, spread=0.6)
    rng = np.random.default_rng(0)
    sampler = logp + rng.normal(0, 0.1, logp.shape).astype(np.float32)
    entropy = rng.uniform(0, 2, logp.shape).astype(np.float32)
    _, m = grpo_loss(logp, old, adv, mask, ref_logp=ref, beta=0.02, entropy=entropy,
                          sampler_logp=sampler, eps_low=0.2, eps_high=0.25)
    v = mask
    lr = np.float64(logp) - old
    rho = np.exp(lr)
    a = np.broadcast_to(adv[:, None], logp.shape)
    d = np.float64(ref) - logp
    np.testing.assert_allclose(m["kl"], (np.exp(d) - d - 1)[v].mean(), rtol=1e-5)
    np.testing.assert_allclose(m["approx_kl"], (rho - 1 - lr)[v].mean(), rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(m["ratio_mean"], rho[v].mean(), rtol=1e-6)
    np.testing.assert_allclose(m["clip_frac_low"], ((a < 0) & (rho < 0.8))[v].mean(), atol=1e-7)
    np.testing.assert_allclose(m["clip_frac_high"], ((a > 0) & (rho > 1.25))[v].mean(), atol=1e-7)
    np.testing.assert_allclose(m["entropy"], entropy[v].mean(), rtol=1e-6)
    np.testing.assert_allclose(m["logprob_gap"], np.abs(sampler - logp)[v].mean(), rtol=1e-5)
    np.testing.assert_allclose(m["loss_sum"] / m["loss_denom"], m["loss"], rtol=1e-6)
    assert float(m["loss_denom"]) == v.sum()


@pytest.mark.parametrize("agg", AGGREGATIONS)
def test_micro_batching_is_exact(agg):
    """With the full batch's totals, micro-batch losses and metrics are shares that add up."""
    logp, old, ref, adv, mask = make_batch(5)
    truncated = np.array([False, True, False, True])
    kw = dict(ref_logp=ref, aggregation=agg, beta=0.05, dual_clip=1.5, truncated=truncated,
              entropy=-logp, sampler_logp=old)
    full, m = grpo_loss(logp, old, adv, mask, **kw)
    totals = grpo.batch_totals(mask, agg)
    assert float(totals.loss) == float(m["loss_denom"])
    parts = [grpo_loss(logp[s], old[s], adv[s], mask[s], totals=totals,
                       **{k: (v[s] if isinstance(v, np.ndarray) else v) for k, v in kw.items()})
             for s in (slice(0, 1), slice(1, 4))]
    # The micro-batch losses (and so their gradients) add up to the full-batch loss ...
    np.testing.assert_allclose(sum(p[0] for p in parts), full, rtol=1e-6)
    # ... and so does every metric.
    for name, value in m.items():
        np.testing.assert_allclose(sum(p[1][name] for p in parts), value, rtol=1e-5,
                                   atol=1e-7, err_msg=name)


def test_garbage_in_masked_positions_is_harmless_and_jittable():
    logp, old, ref, adv, mask = make_batch(6)
    logp = np.where(mask, logp, -np.inf).astype(np.float32)
    old = np.where(mask, old, np.nan).astype(np.float32)
    fn = jax.jit(jax.grad(lambda lp: grpo.grpo_loss(lp, old, adv, mask, ref_logp=ref, dual_clip=3.0)[0]))
    g = fn(jnp.asarray(logp))
    assert np.all(np.isfinite(g)) and np.all(np.asarray(g)[~mask] == 0)


def test_bad_arguments_raise():
    logp, old, ref, adv, mask = make_batch(0)
    with pytest.raises(ValueError, match="aggregation"):
        grpo.grpo_loss(logp, old, adv, mask, aggregation="nope")
    with pytest.raises(ValueError, match="KL"):
        grpo.grpo_loss(logp, old, adv, mask, kl_estimator="k9")
    with pytest.raises(ValueError, match="dual_clip"):
        grpo.grpo_loss(logp, old, adv, mask, dual_clip=0.5)
    with pytest.raises(ValueError, match="truncated"):
        grpo.grpo_loss(logp, old, adv, mask, mask_truncated=True)
    assert set(AGGREGATIONS) <= set(grpo.LOSS_AGGREGATIONS)
    assert {"k1", "k2", "k3"} <= set(grpo.KL_ESTIMATORS)


# ------------------------------------------------------------------------------------------
# group_advantages
# ------------------------------------------------------------------------------------------


def reference_advantages(r, valid, mode, eps, ddof=0):
    r = np.float64(r)
    out = np.zeros_like(r)
    all_valid = r[valid]
    batch_std = all_valid.std(ddof=ddof) if all_valid.size > ddof else 0.0
    for b in range(r.shape[0]):
        vals = r[b][valid[b]]
        if vals.size == 0:
            continue
        centred = vals - vals.mean()
        if mode == "group_std":
            centred = centred / ((vals.std(ddof=ddof) if vals.size > ddof else 0.0) + eps)
        elif mode == "batch_std":
            centred = centred / (batch_std + eps)
        out[b][valid[b]] = centred
    return out


@pytest.mark.parametrize("mode", ["group_std", "no_std", "batch_std"])
@pytest.mark.parametrize("ddof", [0, 1])
def test_group_advantages_match_numpy(mode, ddof):
    rng = np.random.default_rng(7)
    r = rng.normal(size=(5, 6)).astype(np.float32)
    valid = rng.uniform(size=r.shape) < 0.7
    valid[0] = True
    valid[1] = False  # fully invalid group
    valid[2] = [True, False, False, False, False, False]  # singleton
    r[3] = 0.1  # constant group
    got = grpo.group_advantages(r, mode=mode, valid=valid, ddof=ddof)
    np.testing.assert_allclose(got, reference_advantages(r, valid, mode, 1e-6, ddof), atol=1e-5, rtol=1e-5)
    assert np.all(np.isfinite(got))
    assert np.all(np.asarray(got)[~valid] == 0)
    assert np.all(np.asarray(got)[3][valid[3]] == 0)
    unmasked = grpo.group_advantages(r, mode=mode, ddof=ddof)
    np.testing.assert_allclose(
        unmasked, reference_advantages(r, np.ones_like(valid), mode, 1e-6, ddof), atol=1e-5, rtol=1e-5
    )


def test_constant_groups_give_zero_not_nan():
    r = jnp.array([[0.3] * 8, [1.0] * 8, [0.7] * 8])
    for mode in ("group_std", "no_std", "batch_std"):
        a = jax.jit(functools.partial(grpo.group_advantages, mode=mode))(r)
        assert np.all(np.asarray(a) == 0), mode


def test_group_advantages_leading_dims_and_jit():
    rng = np.random.default_rng(1)
    r = rng.normal(size=(2, 3, 4)).astype(np.float32)
    got = jax.jit(functools.partial(grpo.group_advantages, mode="group_std"))(r)
    want = reference_advantages(r.reshape(6, 4), np.ones((6, 4), bool), "group_std", 1e-6)
    np.testing.assert_allclose(got, want.reshape(r.shape), atol=1e-5)
    with pytest.raises(ValueError):
        grpo.group_advantages(r, mode="bogus")


# ------------------------------------------------------------------------------------------
# token_logprobs_chunked
# ------------------------------------------------------------------------------------------


def full_logprobs(hidden, w, targets, temperature=1.0):
    logits = (hidden @ w) / temperature
    logp_all = jax.nn.log_softmax(logits, -1)
    logp = jnp.take_along_axis(logp_all, targets[..., None], -1)[..., 0]
    ent = -jnp.sum(jnp.exp(logp_all) * logp_all, -1)
    return logp, ent


def _chunk_case():
    rng = np.random.default_rng(0)
    b, length, d, v = 2, 12, 8, 11
    hidden = jnp.asarray(rng.normal(size=(b, length, d)), jnp.float32)
    w = jnp.asarray(rng.normal(size=(d, v)), jnp.float32)
    targets = jnp.asarray(rng.integers(0, v, (b, length)), jnp.int32)
    weights = jnp.asarray(rng.normal(size=(b, length)), jnp.float32)
    return hidden, w, targets, weights


def _outputs_and_grads(logprob_fn, hidden, w, weights):
    """(logp, entropy) and the gradient of a weighted sum of both w.r.t. (hidden, w), jitted."""

    def objective(h, w):
        lp, ent = logprob_fn(h, w)
        return jnp.sum(lp * weights) + 0.1 * jnp.sum(ent), (lp, ent)

    return jax.jit(jax.grad(objective, argnums=(0, 1), has_aux=True))(hidden, w)


@functools.cache
def _full_reference():
    hidden, w, targets, weights = _chunk_case()
    return _outputs_and_grads(lambda h, w: full_logprobs(h, w, targets, 0.7), hidden, w, weights)


@pytest.mark.parametrize("chunk_size,remat", [(1, True), (4, False), (5, True), (12, True), (16, False)])
def test_chunked_logprobs_match_full(chunk_size, remat):
    """Values, entropy and gradients equal the unchunked log_softmax, divisible L or not."""
    hidden, w, targets, weights = _chunk_case()

    def chunked(h, w):
        return grpo.token_logprobs_chunked(h, lambda x: x @ w, targets, chunk_size=chunk_size,
                                           temperature=0.7, return_entropy=True, remat=remat)

    grads, outputs = _outputs_and_grads(chunked, hidden, w, weights)
    want_grads, want_outputs = _full_reference()
    for got, want in zip(outputs + grads, want_outputs + want_grads):
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)


def test_chunked_logprobs_without_entropy_returns_array():
    hidden, w, targets, _ = _chunk_case()
    logp = jax.jit(lambda h, w: grpo.token_logprobs_chunked(h, lambda x: x @ w, targets, chunk_size=5))(hidden, w)
    np.testing.assert_allclose(logp, full_logprobs(hidden, w, targets)[0], atol=1e-5)
    with pytest.raises(ValueError):
        grpo.token_logprobs_chunked(hidden, lambda x: x @ w, targets, chunk_size=0)


def _largest_intermediate(fn, *args):
    """Element count of the largest value any equation (nested ones included) produces."""

    def subjaxprs(value):
        if hasattr(value, "eqns"):
            yield value
        elif hasattr(value, "jaxpr") and hasattr(value.jaxpr, "eqns"):
            yield value.jaxpr
        elif isinstance(value, (tuple, list)):
            for v in value:
                yield from subjaxprs(v)

    def sizes(jaxpr):
        for eqn in jaxpr.eqns:
            for var in eqn.outvars:
                yield int(np.prod(getattr(var.aval, "shape", ())))
            for value in eqn.params.values():
                for sub in subjaxprs(value):
                    yield from sizes(sub)

    return max(sizes(jax.make_jaxpr(fn)(*args).jaxpr))


def test_chunked_logprobs_do_not_materialise_full_logits():
    """Neither the forward nor the backward pass holds all [B, L, V] logits at once."""
    b, length, d, v, c = 2, 64, 8, 512, 8
    hidden = jnp.zeros((b, length, d))
    w = jnp.zeros((d, v))
    targets = jnp.zeros((b, length), jnp.int32)
    chunked = jax.grad(
        lambda h, w: grpo.token_logprobs_chunked(h, lambda x: x @ w, targets, chunk_size=c).sum(), argnums=1
    )
    full = jax.grad(lambda h, w: full_logprobs(h, w, targets)[0].sum(), argnums=1)
    assert _largest_intermediate(full, hidden, w) >= b * length * v  # the probe sees full logits
    assert _largest_intermediate(chunked, hidden, w) <= b * c * v


# ------------------------------------------------------------------------------------------
# grpo_update on a toy linear-softmax policy
# ------------------------------------------------------------------------------------------


def toy_problem():
    rng = np.random.default_rng(11)
    b, length, d, v = 6, 5, 4, 7
    params = {"w": jnp.asarray(rng.normal(0, 0.3, (d, v)), jnp.float32), "b": jnp.zeros((v,))}
    x = jnp.asarray(rng.normal(size=(b, length, d)), jnp.float32)
    tokens = jnp.asarray(rng.integers(0, v, (b, length)), jnp.int32)

    @jax.jit
    def logprobs(p, x, tokens):
        return grpo.token_logprobs_chunked(x, lambda h: h @ p["w"] + p["b"], tokens, chunk_size=2)

    mask = jnp.asarray(rng.uniform(size=(b, length)) < 0.9)
    rewards = jnp.asarray(rng.normal(size=(2, 3)), jnp.float32)
    batch = {
        "x": x, "tokens": tokens, "mask": mask,
        "old_logp": logprobs(params, x, tokens),
        "adv": jax.jit(grpo.group_advantages)(rewards).reshape(-1),
    }

    def loss_fn(p, batch):
        lp = logprobs(p, batch["x"], batch["tokens"])
        return grpo.grpo_loss(lp, batch["old_logp"], batch["adv"], batch["mask"], ref_logp=batch["old_logp"])

    return params, batch, loss_fn


def test_grpo_update_decreases_loss_and_first_step_is_the_gradient():
    params, batch, loss_fn = toy_problem()
    lr = 0.5
    opt = optax.sgd(lr)

    @jax.jit
    def update(params):
        return grpo.grpo_update(params, opt.init(params), batch, loss_fn, opt, num_updates=2)

    loss_of = jax.jit(lambda p: loss_fn(p, batch)[0])
    grad_of = jax.jit(jax.grad(lambda p: loss_fn(p, batch)[0]))

    new_params, _, metrics = update(params)
    assert metrics["loss"].shape == (2,) and metrics["grad_norm"].shape == (2,)
    assert float(metrics["loss"][1]) < float(metrics["loss"][0])
    assert float(loss_of(new_params)) < float(metrics["loss"][0])

    g1 = grad_of(params)
    np.testing.assert_allclose(metrics["grad_norm"][0], optax.global_norm(g1), rtol=1e-5)
    p1 = jax.tree.map(lambda p, g: p - lr * g, params, g1)
    p2 = jax.tree.map(lambda p, g: p - lr * g, p1, grad_of(p1))
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), new_params, p2)

    # the second step sees ratios != 1, i.e. the stored old log-probs are used
    np.testing.assert_allclose(metrics["ratio_mean"][0], 1.0, atol=1e-6)
    assert abs(float(metrics["ratio_mean"][1]) - 1.0) > 1e-4
    with pytest.raises(ValueError):
        grpo.grpo_update(params, opt.init(params), batch, loss_fn, opt, num_updates=0)


# ------------------------------------------------------------------------------------------
# Micro-batched updates of a decoder (the round's grpo_role_update) against the whole batch
# ------------------------------------------------------------------------------------------


@functools.cache
def _decoder_update_case(lora: bool = False):
    """A tiny decoder, 8 rollout rows after left-padded prompts, rewards and old log-probs.
    With `lora`: adapters with dropout on two projections (B drawn, so A has a gradient),
    trained over the frozen base."""
    from flax import nnx

    import jaxrubric
    from jaxrubric.methods.data import base_weights, trainable
    from jaxrubric.methods.update import completion_logprobs
    from jaxrubric.models.config import LoraConfig

    adapters = LoraConfig(rank=4, dropout=0.3, targets=("q_proj", "down_proj")) if lora else None
    model = jaxrubric.init_model(jaxrubric.tiny_config("qwen3", num_layers=1, lora=adapters),
                                 seed=4)
    for i, (name, p) in enumerate(sorted(model.layers.items())):
        if name.endswith("_lora_b"):
            p[...] = 0.1 * jax.random.normal(jax.random.key(i), p.shape)
    graph, params = nnx.graphdef(model), nnx.state(model, trainable(model))
    base = base_weights(model)
    rng = np.random.default_rng(8)
    rows, width, length = 8, 4, 5
    prompt = jnp.asarray(rng.integers(3, 257, (rows, width)), jnp.int32)
    prompt_mask = jnp.asarray(np.arange(width)[None] >= rng.integers(0, 3, (rows, 1)))
    completion = jnp.asarray(rng.integers(3, 257, (rows, length)), jnp.int32)
    lengths = rng.integers(1, length + 1, rows)
    lengths[5] = 0  # a row with no valid token
    completion_mask = jnp.asarray(np.arange(length)[None] < lengths[:, None])
    sampler = completion_logprobs(model, prompt, prompt_mask, completion, 2)
    sampler_logp = sampler + jnp.asarray(rng.normal(0, 0.3, (rows, length)), jnp.float32)
    advantages = jnp.asarray(rng.normal(size=(rows, length)), jnp.float32)
    return graph, params, base, (prompt, prompt_mask, completion, completion_mask, sampler_logp,
                                 advantages)


def _decoder_update(aggregation, micro_batches, num_updates=2, lora=False):
    from jaxrubric.methods.data import RoleState
    from jaxrubric.methods.round_config import RoleConfig, RoundConfig
    from jaxrubric.methods.setup import RoleSpec
    from jaxrubric.methods.update import grpo_role_update

    graph, params, base, batch = _decoder_update_case(lora)
    cfg = RoundConfig(aggregation=aggregation, num_updates=num_updates, logprob_chunk=2,
                      update_micro_batches=micro_batches)
    opt = optax.sgd(0.5)  # the parameters move by the gradients themselves
    spec = RoleSpec(graph, opt, RoleConfig(beta=0.1), compiled_out=False)
    # The reference is the initial weights, moved a little so the KL term is not zero (LoRA:
    # the base, the adapters off).
    ref = None if lora else jax.tree.map(lambda p: p * 1.01, params)
    update = jax.jit(lambda p, r: grpo_role_update(cfg, spec, RoleState(p, opt.init(p)), base,
                                                   r, *batch, jax.random.key(3)))
    return update(params, ref)


@pytest.mark.slow
def test_micro_batched_update_equals_the_whole_batch():
    """Two SGD steps over 4 micro-batches of the rows give the parameters and metrics
    (gradient norms included) of the whole-batch update, with the reference log-probs per
    micro-batch. Token-mean only: its denominator (all tokens of the batch) is the one a
    per-micro-batch mean gets wrong; `test_micro_batching_is_exact` holds every aggregation
    mode's shares exact on the loss itself. The update returns its last step's metrics, so
    the first step's are those of a one-step update. With LoRA dropout, each row draws its
    own mask, the same in a micro-batch as in the whole batch."""
    agg = "token-mean"
    for num_updates, lora in ((1, False), (2, False), (2, True)):
        want_state, want = _decoder_update(agg, 1, num_updates, lora)
        got_state, got = _decoder_update(agg, 4, num_updates, lora)
        for a, b in zip(jax.tree.leaves(want_state), jax.tree.leaves(got_state), strict=True):
            np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5, atol=1e-6)
        assert set(got) == set(want)
        for name, value in want.items():
            np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-6,
                                       err_msg=f"{num_updates} steps: {name}")
        assert int(want["skipped_updates"]) == 0
        if num_updates == 1:
            assert float(want["kl"]) > 0
        else:
            assert float(want["clip_frac"]) > 0


def test_micro_batches_must_split_the_rows():
    params, batch, loss_fn = toy_problem()  # 6 rows
    opt = optax.sgd(0.1)
    with pytest.raises(ValueError, match="4 micro-batches do not split the 6 rows"):
        grpo.grpo_update(params, opt.init(params), batch, loss_fn, opt, micro_batches=4)
    with pytest.raises(ValueError, match="micro_batches must be >= 1"):
        grpo.grpo_update(params, opt.init(params), batch, loss_fn, opt, micro_batches=0)
