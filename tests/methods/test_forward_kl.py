"""The forward (mass-covering) KL of a role to its reference over the whole vocabulary
(`round.policy.kl` / `round.generator.kl = "forward"`), against a plain NumPy computation on the
full logits: its values, its gradient, and what it does that the sampled-token KL cannot (it pulls
up a token the role has stopped writing)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import jaxrubric
from jaxrubric.methods import update
from jaxrubric.methods.data import RoleState
from jaxrubric.methods.round_config import RoleConfig, RoundConfig
from jaxrubric.methods.setup import RoleSpec
from jaxrubric.rl import grpo


def _log_softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def test_chunked_forward_kl_equals_numpy_on_the_full_logits_and_its_gradient_is_p_minus_p_ref():
    rng = np.random.default_rng(0)
    b, length, d, v = 3, 7, 5, 11
    hidden = jnp.asarray(rng.normal(size=(b, length, d)), jnp.float32)
    ref_hidden = jnp.asarray(rng.normal(size=(b, length, d)), jnp.float32)
    w = jnp.asarray(rng.normal(size=(d, v)), jnp.float32)
    w_ref = jnp.asarray(rng.normal(size=(d, v)), jnp.float32)
    targets = jnp.asarray(rng.integers(0, v, (b, length)), jnp.int32)

    def kl_of(h: jax.Array) -> jax.Array:
        return grpo.token_logprobs_chunked(h, lambda x: x @ w, targets, chunk_size=3,
                                           return_entropy=True,
                                           reference=(ref_hidden, lambda x: x @ w_ref))

    logp, entropy, kl = kl_of(hidden)
    lp, lp_ref = (_log_softmax(np.asarray(x, np.float64)) for x in
                  (hidden @ w, ref_hidden @ w_ref))
    want = (np.exp(lp_ref) * (lp_ref - lp)).sum(-1)
    np.testing.assert_allclose(kl, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(logp, np.take_along_axis(lp, np.asarray(targets)[..., None],
                                                        -1)[..., 0], atol=1e-5)
    np.testing.assert_allclose(entropy, -(np.exp(lp) * lp).sum(-1), atol=1e-5)
    # d KL / d logits = p - p_ref, so d KL / d hidden = (p - p_ref) W^T; nothing reaches the
    # reference's hidden states.
    grad = jax.grad(lambda h: kl_of(h)[2].sum())(hidden)
    np.testing.assert_allclose(grad, (np.exp(lp) - np.exp(lp_ref)) @ np.asarray(w).T,
                               rtol=1e-4, atol=1e-5)
    ref_grad = jax.grad(lambda r: grpo.token_logprobs_chunked(
        hidden, lambda x: x @ w, targets, chunk_size=3,
        reference=(r, lambda x: x @ w_ref))[1].sum())(ref_hidden)
    assert not np.any(np.asarray(ref_grad))


def _role_case():
    model = jaxrubric.init_model(jaxrubric.tiny_config("qwen3", num_layers=1), seed=1)
    rng = np.random.default_rng(2)
    rows, p, n = 4, 5, 6
    prompt = jnp.asarray(rng.integers(3, 257, (rows, p)), jnp.int32)
    prompt_mask = jnp.asarray(np.arange(p)[None] >= np.array([[0], [1], [3], [0]]))
    completion = jnp.asarray(rng.integers(3, 257, (rows, n)), jnp.int32)
    mask = jnp.asarray(np.arange(n)[None] < np.array([[6], [2], [4], [0]]))
    return model, (prompt, prompt_mask, completion, mask)


@pytest.mark.slow
def test_the_role_update_weighs_the_forward_kl_of_the_full_distributions():
    """`grpo_role_update` with `kl="forward"`: its `kl` metric is the token mean over valid
    completion tokens of sum_v p_ref (log p_ref - log p), each distribution computed here from
    the whole sequence's logits (`Decoder.__call__`), the reference a perturbed copy."""
    model, (prompt, prompt_mask, completion, mask) = _role_case()
    graph, params = nnx.graphdef(model), nnx.state(model, nnx.Param)
    ref = jax.tree.map(lambda x: x * 1.05, params)
    cfg = RoundConfig(num_updates=1, logprob_chunk=4)
    spec = RoleSpec(graph, optax.sgd(0.0), RoleConfig(beta=0.2, kl="forward"), compiled_out=False)
    sampler = update.completion_logprobs(model, prompt, prompt_mask, completion, 4)
    _, metrics = update.grpo_role_update(
        cfg, spec, RoleState(params, spec.optimizer.init(params)), None, ref, prompt,
        prompt_mask, completion, mask, sampler, jnp.zeros(4), jax.random.key(0))

    width = prompt.shape[1]
    tokens = jnp.concatenate([prompt, completion], 1)
    full_mask = jnp.concatenate([prompt_mask, jnp.ones_like(completion, bool)], 1)

    def log_probs(p):
        logits = nnx.merge(graph, p)(tokens, attention_mask=full_mask)
        return _log_softmax(np.asarray(logits, np.float64)[:, width - 1:-1])

    lp, lp_ref = log_probs(params), log_probs(ref)
    per_token = (np.exp(lp_ref) * (lp_ref - lp)).sum(-1)
    m = np.asarray(mask)
    # The KL here is ~2e-4, a float32 sum of p_ref (log p_ref - log p) over log-probs near
    # -5.5 (ulp ~5e-7): it is known to ~1e-7 absolute, not to 1e-4 of itself (the decoder's
    # 2-D projections moved it by 2.8e-8, 1.35e-4 relative).
    np.testing.assert_allclose(metrics["kl"], (per_token * m).sum() / m.sum(), rtol=1e-4,
                               atol=1e-7)
    # advantages are zero, so the loss is the KL term alone
    np.testing.assert_allclose(metrics["loss"], 0.2 * metrics["kl"], rtol=1e-5)


def test_the_forward_kl_raises_a_token_the_role_never_samples_and_the_sampled_kl_does_not():
    """A role that has all but stopped writing a token its reference writes half the time:
    on samples without that token, the sampled-token KL's gradient barely moves its logit,
    the forward KL's raises it (the generator's `has <big digit>` items in the toy world)."""
    v, lost = 6, 2
    ref_logits = jnp.zeros(v).at[lost].set(np.log(v - 1.0))  # p_ref(lost) = 0.5
    logits = ref_logits.at[lost].set(-8.0)  # the role: p(lost) ~ 2e-4
    sample = jnp.asarray([[0]])  # a token the role does write
    hidden = jnp.ones((1, 1, 1))

    def lost_logit_step(kind: str) -> float:
        def loss(z):
            unembed = lambda h: h * z  # noqa: E731  (logits = z)
            if kind == "forward":
                _, kl = grpo.token_logprobs_chunked(hidden, unembed, sample, chunk_size=1,
                                                    reference=(hidden, lambda h: h * ref_logits))
            else:
                logp = grpo.token_logprobs_chunked(hidden, unembed, sample, chunk_size=1)
                ref_logp = jax.nn.log_softmax(ref_logits)[sample]
                kl = grpo.KL_ESTIMATORS["k3"](logp, ref_logp)
            return kl.sum()
        return -float(jax.grad(loss)(logits)[lost])  # how much a descent step raises it

    assert lost_logit_step("forward") > 0.49  # p_ref(lost) - p(lost)
    assert abs(lost_logit_step("sampled")) < 1e-3
