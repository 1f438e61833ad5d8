"""The round's GRPO role updates, shared by both methods: teacher-forced log-probs of sampled
completions (a prompt under S samples encoded once when `RoundConfig.share_prefix`), one
role's update (`role_update`, a stage on that role's devices) and the round's updates of the
roles a run trains (`update`, what a round calls).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from jaxrubric import microbatch, placement, sampling
from jaxrubric.methods.data import Frozen, RoleState, RoundState
from jaxrubric.methods.keys import RoundKey
from jaxrubric.methods.round_config import RoundConfig
from jaxrubric.methods.setup import RoleSpec, RoundSetup
from jaxrubric.models.transformer import Decoder
from jaxrubric.rl import grpo
from jaxrubric.roles import TRAINED, Role


def completion_hidden(model: Decoder, prompt: jax.Array, prompt_mask: jax.Array,
                      completion: jax.Array, lora_drop_keys: Any = None) -> jax.Array:
    """The final hidden states that predict each completion token, `[R, N, D]`.

    Completions `[R, N]` after left-padded prompts `[R, P]`; or S completions `[B, S, N]` of
    each prompt `[B, P]`, the prompt encoded once (`Decoder.shared_prefix_hidden`; rows
    `R = B * S`, `lora_drop_keys` then the prompts' `[B]` and completions' `[B, S]`).
    Positions count real tokens, as in the sampler, so their log-probs equal the sampler's.
    """
    if completion.ndim == 3:
        b, s, n = completion.shape
        prefix, branches = model.shared_prefix_hidden(prompt, prompt_mask, completion,
                                                      lora_drop_keys)
        first = jnp.broadcast_to(prefix[:, None, -1:], (b, s, 1, prefix.shape[-1]))
        return jnp.concatenate([first, branches[:, :, :-1]], axis=2).reshape(b * s, n, -1)
    width = prompt.shape[1]
    tokens = jnp.concatenate([prompt, completion], axis=1)
    mask = jnp.concatenate([prompt_mask, jnp.ones_like(completion, bool)], axis=1)
    hidden, _ = model.hidden_states(tokens, attention_mask=mask, lora_drop_keys=lora_drop_keys)
    return hidden[:, width - 1:-1]


def shared_completion_logprobs(model: Decoder, prompt: jax.Array, prompt_mask: jax.Array,
                               completion: jax.Array, chunk_size: int,
                               return_entropy: bool = False, lora_drop_keys: Any = None
                               ) -> jax.Array | tuple[jax.Array, jax.Array]:
    """`completion_logprobs` of S completions `[B, S, N]` of each left-padded prompt `[B, P]`,
    the prompt encoded once (`Decoder.shared_prefix_hidden`): `[B, S, N]` (and the entropy).
    `lora_drop_keys`: the adapters' dropout keys of the prompts `[B]` and completions `[B, S]`.
    """
    b, s, n = completion.shape
    predicting = completion_hidden(model, prompt, prompt_mask, completion, lora_drop_keys)
    out = grpo.token_logprobs_chunked(predicting, model.logits, completion.reshape(b * s, n),
                                      chunk_size=chunk_size, return_entropy=return_entropy)
    if return_entropy:
        return tuple(x.reshape(b, s, n) for x in out)
    return out.reshape(b, s, n)


def completion_logprobs(model: Decoder, prompt: jax.Array, prompt_mask: jax.Array,
                        completion: jax.Array, chunk_size: int, return_entropy: bool = False,
                        lora_drop_keys: jax.Array | None = None
                        ) -> jax.Array | tuple[jax.Array, jax.Array]:
    """Teacher-forced `log p(completion)` `[R, N]` after left-padded prompts `[R, P]` (and the
    per-token entropy of the model's distribution, `[R, N]`).

    Positions count real tokens, as in the sampler, so these equal the sampler's log-probs.
    The vocabulary projection runs in chunks (never `[R, N, V]` logits whole).
    `lora_drop_keys [R]`: the adapters' dropout keys (training forwards only).
    """
    predicting = completion_hidden(model, prompt, prompt_mask, completion, lora_drop_keys)
    return grpo.token_logprobs_chunked(predicting, model.logits, completion,
                                       chunk_size=chunk_size, return_entropy=return_entropy)


def grpo_role_update(cfg: RoundConfig, spec: RoleSpec, state: RoleState,
                     base: nnx.State | None, ref_params: nnx.State | None, prompt: jax.Array,
                     prompt_mask: jax.Array, completion: jax.Array, completion_mask: jax.Array,
                     sampler_logp: jax.Array, advantages: jax.Array, rng: jax.Array,
                     off_policy: jax.Array | None = None
                     ) -> tuple[RoleState, dict[str, jax.Array]]:
    """One GRPO update (mu optimiser steps) of a role on its samples (rows `[R, ...]`).

    The rows go through the model in `cfg.update_micro_batches` micro-batches, the reference
    too (its log-probs, or with `spec.settings.kl == "forward"` its hidden states); each
    micro-batch's loss is divided by the whole batch's totals, so the summed gradient is the
    whole batch's.

    `base`: a LoRA role's frozen base weights (`state.params` are then its adapters, the only
    thing differentiated and stepped); its KL reference is that base with the adapters off
    (`ref_params` is None). `rng`: the adapters' dropout, a key per row (the same draw with or
    without micro-batches; the mu steps of one round share it).

    Shared prompts: with `completion [B, S, N]` (and `completion_mask`, `sampler_logp`,
    `advantages` likewise `[B, S, ...]`) each prompt `[B, P]` is encoded once under its S
    completions (`shared_completion_logprobs`), and micro-batches split the B prompts. The loss
    is the rows' loss all the same (`[B * S, ...]`); LoRA dropout then draws one mask per
    prompt for the prompt's tokens and one per row for its completion's.

    `off_policy` (`[R]`, or `[B, S]` shared; bool): rows another model sampled
    (`explorer_rubrics`). Their old log-probs are the role's own at each step (ratio 1: the
    plain policy-gradient step on them, not an importance weight, which would vanish on what
    the role has stopped writing), and they carry no KL term (its estimate needs the role's
    own samples).
    """
    n, graph, beta = cfg.update_micro_batches, spec.graph, spec.settings.beta
    frozen_part = () if base is None else (base,)
    shared = completion.ndim == 3
    batch = {"prompt": prompt, "prompt_mask": prompt_mask, "completion": completion,
             "completion_mask": completion_mask, "sampler_logp": sampler_logp,
             "advantages": advantages}
    if off_policy is not None:
        batch["off_policy"] = off_policy
    if base is not None:  # LoRA (the model reads the keys only when its dropout is on)
        rows = jax.random.split(rng, completion.shape[:2] if shared else completion.shape[0])
        batch["drop_keys"] = (jax.random.split(jax.random.fold_in(rng, 1), prompt.shape[0]),
                              rows) if shared else rows

    def hidden(model, b, drop_keys=None):  # [R, N, D], R = B * S when shared
        return completion_hidden(model, b["prompt"], b["prompt_mask"], b["completion"],
                                 drop_keys)

    length = completion.shape[-1]
    forward_kl = beta > 0 and spec.settings.kl == "forward"
    if beta > 0:
        reference = (nnx.merge(graph, ref_params) if base is None else
                     nnx.merge(graph, base, jax.tree.map(jnp.zeros_like, state.params)))
        if forward_kl:  # its hidden states, for its whole next-token distributions in the loss
            batch["ref_hidden"] = jax.lax.stop_gradient(microbatch.map_rows(
                lambda b: hidden(reference, b).reshape(*b["completion"].shape, -1), batch, n))
        else:
            batch["ref_logp"] = jax.lax.stop_gradient(microbatch.map_rows(
                lambda b: grpo.token_logprobs_chunked(
                    hidden(reference, b), reference.logits,
                    b["completion"].reshape(-1, length), chunk_size=cfg.logprob_chunk
                ).reshape(b["completion"].shape), batch, n))
    totals = None if n == 1 else grpo.batch_totals(completion_mask.reshape(-1, length),
                                                   cfg.aggregation, max_len=length)

    def loss_fn(p, b):
        model = nnx.merge(graph, *frozen_part, p)
        h = hidden(model, b, b.get("drop_keys"))
        ref = (b["ref_hidden"].reshape(h.shape), reference.logits) if forward_kl else None
        logp, entropy, *kl = grpo.token_logprobs_chunked(
            h, model.logits, b["completion"].reshape(-1, length), chunk_size=cfg.logprob_chunk,
            return_entropy=True, reference=ref)
        if shared:  # the loss of the rows, as without sharing
            b = {k: v.reshape(-1, *v.shape[2:]) for k, v in b.items()
                 if k in ("completion_mask", "sampler_logp", "advantages", "ref_logp",
                          "off_policy")}
        old_logp, ref_logp, kl = b["sampler_logp"], b.get("ref_logp"), kl[0] if kl else None
        if "off_policy" in b:  # another model's samples: ratio 1, no KL
            off = b["off_policy"][:, None]
            own = jax.lax.stop_gradient(logp)
            old_logp = jnp.where(off, own, old_logp)
            ref_logp = None if ref_logp is None else jnp.where(off, own, ref_logp)
            kl = None if kl is None else jnp.where(off, 0.0, kl)
        return grpo.grpo_loss(
            logp, jax.lax.stop_gradient(old_logp), b["advantages"],
            b["completion_mask"], ref_logp=ref_logp, kl=kl, beta=beta,
            kl_estimator=cfg.kl_estimator, eps_low=cfg.eps_low, eps_high=cfg.eps_high,
            aggregation=cfg.aggregation, max_len=length,
            sampler_logp=old_logp,
            entropy=entropy if spec.settings.entropy else jax.lax.stop_gradient(entropy),
            entropy_coef=spec.settings.entropy, totals=totals)

    params, opt_state, metrics = grpo.grpo_update(
        state.params, state.opt_state, batch, loss_fn, spec.optimizer,
        num_updates=cfg.num_updates, micro_batches=n)
    skipped = metrics.pop("skipped").sum()  # non-finite steps, each left the role unchanged
    last = {k: v[-1] for k, v in metrics.items()}  # the metrics of the last step
    return RoleState(params, opt_state), {**last, "skipped_updates": skipped}


def _role_update(role: Role, setup: RoundSetup, state: RoleState, base: nnx.State | None,
                 ref_params: nnx.State | None, prompt: jax.Array, prompt_mask: jax.Array,
                 samples: sampling.SampleResult, advantages: jax.Array, key: RoundKey,
                 off_policy: jax.Array | None = None
                 ) -> tuple[RoleState, dict[str, jax.Array]]:
    """`role_update` without the switch."""
    b, s = samples.tokens.shape[:2]
    completion_mask = jnp.arange(samples.tokens.shape[2]) < samples.lengths[..., None]
    if prompt.ndim == 2 and setup.config.share_prefix and s > 1:  # encoded once for S samples
        rows_of = lambda x: x  # noqa: E731
    else:
        rows = b * s
        if prompt.ndim == 2:
            prompt, prompt_mask = (jnp.repeat(x, s, axis=0) for x in (prompt, prompt_mask))
        else:
            prompt, prompt_mask = (x.reshape(rows, -1) for x in (prompt, prompt_mask))
        rows_of = lambda x: x.reshape(rows, *x.shape[2:])  # noqa: E731
    state, metrics = grpo_role_update(
        setup.config, setup.roles[role], state, base, ref_params, prompt, prompt_mask,
        rows_of(samples.tokens), rows_of(completion_mask), rows_of(samples.logprobs),
        rows_of(advantages), key.draw(), None if off_policy is None else rows_of(off_policy))
    return state, {f"{role}/{k}": v for k, v in metrics.items()}


@placement.stage(keep=1)
def role_update(role: Role, setup: RoundSetup, state: RoleState, base: nnx.State | None,
                ref_params: nnx.State | None, prompt: jax.Array, prompt_mask: jax.Array,
                samples: sampling.SampleResult, advantages: jax.Array, key: RoundKey,
                off_policy: jax.Array | None = None, trains: jax.Array | None = None
                ) -> tuple[RoleState, dict[str, jax.Array]]:
    """GRPO update of `role` on its samples `[B, S, L]`, on its devices.

    `prompt`/`prompt_mask` are `[B, P]` (one prompt under all S samples, encoded once when
    `share_prefix` and S > 1, as `Update.shared` counts it) or `[B, S, P]` (a prompt per
    sample); `advantages` are `[B, S]` or token-level `[B, S, L]`; `base` as in
    `grpo_role_update`; `key` this role's LoRA dropout (the round's key plan); `off_policy`
    `[B, S]`: samples another model wrote (`grpo_role_update`). `trains`: the run's switch
    (`RunSwitches`), the update under `lax.cond` (the program holds it either way; a skipped
    one keeps the role and reports zeros). Returns the role's new state and its metrics,
    prefixed by the role.
    """
    args = (state, base, ref_params, prompt, prompt_mask, samples, advantages, key, off_policy)
    run = functools.partial(_role_update, role, setup)
    if trains is None:
        return run(*args)
    metrics = jax.eval_shape(run, *args)[1]
    skip = lambda *a: (a[0], jax.tree.map(  # noqa: E731
        lambda x: jnp.zeros(x.shape, x.dtype), metrics))
    return jax.lax.cond(trains, run, skip, *args)


class UpdateInputs(NamedTuple):
    """What a role's update learns from (see `role_update`)."""

    prompt: jax.Array  # [B, P] or [B, S, P], left-padded
    prompt_mask: jax.Array
    samples: sampling.SampleResult  # [B, S, L]
    advantages: jax.Array  # [B, S] or [B, S, L]
    off_policy: jax.Array | None = None  # [B, S]: samples another model wrote


def update(setup: RoundSetup, state: RoundState, frozen: Frozen,
           inputs: Mapping[Role, UpdateInputs], keys: Mapping[Role, RoundKey]
           ) -> tuple[RoundState, dict[str, jax.Array]]:
    """The round's GRPO updates of the roles this run trains, generator first, each on its
    role's devices (`role_update`); `keys`: each role's LoRA dropout. Returns the new state
    (round counter advanced) and the updates' metrics. With `frozen.switches` a role's update
    runs only where its switch says so."""
    new = {role: state.role(role) for role in TRAINED}
    metrics: dict[str, jax.Array] = {}
    for role in TRAINED:
        if setup.roles[role].compiled_out:
            continue
        x = inputs[role]
        new[role], role_metrics = role_update(
            role, setup, state.role(role), frozen.base(role), frozen.reference(role), x.prompt,
            x.prompt_mask, x.samples, x.advantages, keys[role], x.off_policy,
            None if frozen.switches is None else frozen.switches.trains(role))
        metrics.update(role_metrics)
    return RoundState(new[Role.POLICY], new[Role.GENERATOR], state.round + 1), metrics
