"""The co-evolution round: one compiled program from prompts to two GRPO updates.

DynamicRubric round (DESIGN.md section 1):
policy samples K responses -> the generator sees prompt + responses and samples G rubrics
(grammar-constrained) -> token-level parse -> one-forward verification of every response and
every anchor answer under every item -> scores -> generator rewards (discriminability on the
policy's set + anchor ranking) -> generator GRPO update -> policy rewards from the scores ->
policy GRPO update.

Everything here is a pure function of pytrees. `RoundSetup` holds what is static (graph
definitions, token templates, the grammar, optimisers); `make_round_step` returns the jitted
`round_step(state, batch, rng) -> (state, metrics)` with the state donated. Policy, generator
and verifier must share one tokenizer: responses are spliced into the generator's and the
verifier's prompts as token ids.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, Literal, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from jaxrubric import microbatch, placement, sampling
from jaxrubric.models.transformer import Decoder
from jaxrubric.rewards.dynamic_rubric import dynamic_rubric_rewards
from jaxrubric.rl import grpo
from jaxrubric.rubric import grammar as grammar_lib
from jaxrubric.rubric import templates as tpl
from jaxrubric.rubric import verifier as ver
from jaxrubric.rubric.scores import dynamic_rubric_score

PyTree = Any


@dataclasses.dataclass(frozen=True)
class RoundConfig:
    """The static knobs of a round (each distinct value compiles once)."""

    num_responses: int = 8  # K
    num_rubrics: int = 4  # G
    response_tokens: int = 64  # policy max_new_tokens (static output length)
    policy_temperature: float = 1.0
    generator_temperature: float = 1.0
    top_p: float | None = None
    # GRPO, per role
    policy_beta: float = 0.01
    generator_beta: float = 0.01
    kl_estimator: str = "k3"
    eps_low: float = 0.2
    eps_high: float = 0.2
    aggregation: str = "token-mean"
    advantage_mode: str = "group_std"
    num_updates: int = 1  # mu
    logprob_chunk: int = 64
    # Memory: each GRPO update runs its rows through the model in this many micro-batches
    # (gradients summed, one optimiser step: the same step as the whole batch); each rollout
    # stage (sampling, verification) its prompts likewise. 1: all rows at once.
    update_micro_batches: int = 1
    rollout_micro_batches: int = 1
    # rewards
    anchor_weight: float = 1.0  # lambda
    disc_mode: str = "item_variance"
    soft_verdicts: bool = False  # rewards from p_yes instead of 0/1 verdicts
    invalid_rubric_reward: float = -1.0
    # Which rubric scores the policy: the mean over valid groups, or the group the generator's
    # reward ranks best (the sharpest evaluator of this round).
    policy_score: Literal["mean", "best_group"] = "mean"
    freeze_generator: bool = False  # the stale-evaluator ablation
    freeze_policy: bool = False
    # "dynamic": the generator sees the prompt and the K responses (DynamicRubric); "static": the
    # prompt alone, the baseline DynamicRubric claims to beat (same rewards, same updates).
    rubric_source: Literal["dynamic", "static"] = "dynamic"
    # "rubric": the policy is rewarded by rubric scores; "oracle": by the setup's ground-truth
    # reward (a toy world's checker), the ceiling the rubric runs are compared with.
    policy_reward: Literal["rubric", "oracle"] = "rubric"

    def __post_init__(self) -> None:
        for name in ("num_responses", "num_rubrics", "response_tokens", "num_updates",
                     "logprob_chunk", "update_micro_batches", "rollout_micro_batches"):
            if getattr(self, name) < 1:
                raise ValueError(f"round config: {name} must be >= 1, got {getattr(self, name)}")
        if self.num_responses < 2:
            raise ValueError("round config: num_responses must be >= 2 (GRPO needs a group)")
        for name, allowed in (("policy_score", ("mean", "best_group")),
                              ("rubric_source", ("dynamic", "static")),
                              ("policy_reward", ("rubric", "oracle"))):
            if getattr(self, name) not in allowed:
                raise ValueError(f"round config: {name} {getattr(self, name)!r} is not one of "
                                 f"{allowed}")


@dataclasses.dataclass(frozen=True, eq=False)
class RoundSetup:
    """Everything static about a round: built once on the host from the tokenizer."""

    config: RoundConfig
    policy_graph: Any
    generator_graph: Any
    verifier_graph: Any
    generator_template: tpl.TokenTemplate
    verifier_template: tpl.TokenTemplate
    readout: ver.VerifierReadout
    grammar: grammar_lib.RubricGrammar
    stop_token_ids: tuple[int, ...]
    pad_id: int
    policy_optimizer: optax.GradientTransformation
    generator_optimizer: optax.GradientTransformation
    # `oracle_reward(response_tokens [B, K, L], response_len [B, K], batch) -> [B, K]`: the
    # ground-truth reward of `policy_reward="oracle"` (a toy world provides one); jittable.
    oracle_reward: Callable[..., jax.Array] | None = dataclasses.field(default=None,
                                                                       kw_only=True)


def shared_setup_fields(tokenizer: Any, policy: Decoder, generator: Decoder,
                        verifier: Decoder, chat_template_kwargs: dict | None = None,
                        template_style: str = "full") -> dict[str, Any]:
    """What every round's setup takes from the shared tokenizer and the three models."""
    sizes = [m.config.vocab_size for m in (policy, generator, verifier)]
    if len(set(sizes)) != 1 or sizes[0] < len(tokenizer):
        raise ValueError(f"policy, generator and verifier must share the tokenizer's vocabulary "
                         f"({len(tokenizer)} tokens); their vocab sizes are {sizes}")
    verifier_template = tpl.verifier_template(tokenizer, chat_template_kwargs, template_style)
    stops = set(policy.config.eos_token_ids)
    if tokenizer.eos_token_id is not None:
        stops.add(tokenizer.eos_token_id)
    return dict(
        policy_graph=nnx.graphdef(policy), generator_graph=nnx.graphdef(generator),
        verifier_graph=nnx.graphdef(verifier), verifier_template=verifier_template,
        readout=ver.verifier_readout(tokenizer, verifier_template),
        stop_token_ids=tuple(sorted(stops)),
        pad_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0,
    )


def build_setup(config: RoundConfig, tokenizer: Any, policy: Decoder, generator: Decoder,
                verifier: Decoder, *, max_items: int, max_item_tokens: int,
                policy_optimizer: optax.GradientTransformation,
                generator_optimizer: optax.GradientTransformation,
                chat_template_kwargs: dict | None = None, template_style: str = "full",
                oracle_reward: Callable[..., jax.Array] | None = None) -> RoundSetup:
    """Templates, grammar and answer ids from the shared tokenizer; graphs from the models."""
    if config.policy_reward == "oracle" and oracle_reward is None:
        raise ValueError("policy_reward='oracle' needs an oracle_reward function")
    shown = 0 if config.rubric_source == "static" else config.num_responses
    return RoundSetup(
        config=config,
        generator_template=tpl.dynamic_rubric_generator_template(
            tokenizer, shown, max_items=max_items, chat_template_kwargs=chat_template_kwargs,
            style=template_style),
        grammar=grammar_lib.build_rubric_grammar(
            tokenizer, weights=range(1, 6), max_items=max_items, max_item_tokens=max_item_tokens),
        policy_optimizer=policy_optimizer, generator_optimizer=generator_optimizer,
        **shared_setup_fields(tokenizer, policy, generator, verifier, chat_template_kwargs,
                              template_style),
        oracle_reward=oracle_reward,
    )


def init_state(setup: RoundSetup, policy: Decoder, generator: Decoder) -> dict[str, PyTree]:
    """The trainable state: both models' parameters and optimiser states, and the round."""
    # Scalars (optimiser counts, the round counter) go on their role's mesh, replicated, so the
    # state that comes out of a round has the shardings of the one that went in: no recompiles.
    state: dict[str, PyTree] = {}
    replicated = {}
    for role, model, optimizer in (("policy", policy, setup.policy_optimizer),
                                   ("generator", generator, setup.generator_optimizer)):
        params = nnx.state(model, nnx.Param)
        replicated[role] = NamedSharding(jax.tree.leaves(params)[0].sharding.mesh,
                                         PartitionSpec())
        state[role] = params
        state[f"{role}_opt"] = jax.tree.map(
            lambda x, r=replicated[role]: x if isinstance(x.sharding, NamedSharding)
            else jax.device_put(x, r), optimizer.init(params))
    state["round"] = jax.device_put(jnp.zeros((), jnp.int32), replicated["policy"])
    return state


def completion_logprobs(model: Decoder, prompt: jax.Array, prompt_mask: jax.Array,
                        completion: jax.Array, chunk_size: int, return_entropy: bool = False
                        ) -> jax.Array | tuple[jax.Array, jax.Array]:
    """Teacher-forced `log p(completion)` `[R, N]` after left-padded prompts `[R, P]` (and the
    per-token entropy of the model's distribution, `[R, N]`).

    Positions count real tokens, as in the sampler, so these equal the sampler's log-probs.
    The vocabulary projection runs in chunks (never `[R, N, V]` logits whole).
    """
    width = prompt.shape[1]
    tokens = jnp.concatenate([prompt, completion], axis=1)
    mask = jnp.concatenate([prompt_mask, jnp.ones_like(completion, bool)], axis=1)
    hidden, _ = model.hidden_states(tokens, attention_mask=mask)
    predicting = hidden[:, width - 1:-1]
    return grpo.token_logprobs_chunked(predicting, model.logits, completion,
                                       chunk_size=chunk_size, return_entropy=return_entropy)


def policy_update(cfg: RoundConfig, graph, optimizer, params, opt_state, ref_params, prompt,
                   prompt_mask, completion, completion_mask, sampler_logp, advantages,
                   beta: float):
    """One GRPO update (mu optimiser steps) of a role on its own samples.

    The rows go through the model in `cfg.update_micro_batches` micro-batches, the reference
    log-probs too; each micro-batch's loss is divided by the whole batch's totals, so the
    summed gradient is the whole batch's.
    """
    n = cfg.update_micro_batches
    batch = {"prompt": prompt, "prompt_mask": prompt_mask, "completion": completion,
             "completion_mask": completion_mask, "sampler_logp": sampler_logp,
             "advantages": advantages}
    if beta > 0:
        reference = nnx.merge(graph, ref_params)
        batch["ref_logp"] = jax.lax.stop_gradient(microbatch.map_rows(
            lambda b: completion_logprobs(reference, b["prompt"], b["prompt_mask"],
                                          b["completion"], cfg.logprob_chunk), batch, n))
    totals = None if n == 1 else grpo.batch_totals(completion_mask, cfg.aggregation,
                                                   max_len=completion.shape[1])

    def loss_fn(p, b):
        logp, entropy = completion_logprobs(nnx.merge(graph, p), b["prompt"], b["prompt_mask"],
                                            b["completion"], cfg.logprob_chunk,
                                            return_entropy=True)
        return grpo.grpo_loss(
            logp, jax.lax.stop_gradient(b["sampler_logp"]), b["advantages"],
            b["completion_mask"], ref_logp=b.get("ref_logp"), beta=beta,
            kl_estimator=cfg.kl_estimator, eps_low=cfg.eps_low, eps_high=cfg.eps_high,
            aggregation=cfg.aggregation, max_len=completion.shape[1],
            sampler_logp=b["sampler_logp"], entropy=jax.lax.stop_gradient(entropy),
            totals=totals)

    return grpo.grpo_update(params, opt_state, batch, loss_fn, optimizer,
                            num_updates=cfg.num_updates, micro_batches=n)


def last_update_metrics(metrics: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """Metrics of the last of the mu updates."""
    return {k: v[-1] for k, v in metrics.items()}


def role_update_stage(role: str, setup: RoundSetup, params: PyTree, opt_state: PyTree,
                      ref_params: PyTree | None, prompt: jax.Array, prompt_mask: jax.Array,
                      samples: sampling.SampleResult, advantages: jax.Array
                      ) -> tuple[PyTree, PyTree, dict[str, jax.Array]]:
    """GRPO update of `role` ("policy" or "generator") on its samples `[B, S, L]`.

    `prompt`/`prompt_mask` are `[B, P]` (one prompt under all S samples) or `[B, S, P]` (a
    prompt per sample); `advantages` are `[B, S]` or token-level `[B, S, L]`. Returns the
    role's new parameters and optimiser state and its metrics, prefixed by the role.
    """
    b, s = samples.tokens.shape[:2]
    rows = b * s
    if prompt.ndim == 2:
        prompt, prompt_mask = (jnp.repeat(x, s, axis=0) for x in (prompt, prompt_mask))
    else:
        prompt, prompt_mask = (x.reshape(rows, -1) for x in (prompt, prompt_mask))
    tokens = samples.tokens.reshape(rows, -1)
    params, opt_state, metrics = policy_update(
        setup.config, getattr(setup, f"{role}_graph"), getattr(setup, f"{role}_optimizer"),
        params, opt_state, ref_params, prompt, prompt_mask,
        tokens, jnp.arange(tokens.shape[1]) < samples.lengths.reshape(rows, 1),
        samples.logprobs.reshape(rows, -1), advantages.reshape(rows, *advantages.shape[2:]),
        getattr(setup.config, f"{role}_beta"))
    return params, opt_state, {f"{role}/{k}": v for k, v in last_update_metrics(metrics).items()}


# Stable stage objects: a sub-mesh placement compiles one program per stage object.
policy_update_stage = functools.partial(role_update_stage, "policy")
generator_update_stage = functools.partial(role_update_stage, "generator")


def update_roles(setup: RoundSetup, run: placement.Placement, state: dict, frozen: dict,
                 inputs: dict[str, tuple]) -> tuple[dict, dict[str, jax.Array]]:
    """The round's GRPO updates of the unfrozen roles, generator first; `inputs[role]` is
    `(prompt, prompt_mask, samples, advantages)` (see `role_update_stage`). Returns the new
    state (round counter advanced) and the updates' metrics."""
    new_state = dict(state, round=state["round"] + 1)
    metrics: dict[str, jax.Array] = {}
    stages = {"generator": generator_update_stage, "policy": policy_update_stage}
    for role in ("generator", "policy"):
        if getattr(setup.config, f"freeze_{role}"):
            continue
        params, opt_state, role_metrics = run(
            role, stages[role], state[role], state[f"{role}_opt"], frozen.get(f"{role}_ref"),
            *inputs[role], keep=2)
        new_state.update({role: params, f"{role}_opt": opt_state})
        metrics.update(role_metrics)
    return new_state, metrics


def write_rubrics(setup: RoundSetup, generator: Decoder, gen_input: tpl.Packed,
                  rng: jax.Array) -> tuple[sampling.SampleResult, grammar_lib.ParsedRubric]:
    """The generator samples G grammar-constrained rubrics per (left-padded) prompt, parsed."""
    rubrics = sampling.sample(
        generator, gen_input.tokens, gen_input.mask, gen_input.lengths, rng,
        num_samples=setup.config.num_rubrics, max_new_tokens=setup.grammar.max_rubric_tokens,
        temperature=setup.config.generator_temperature, grammar=setup.grammar,
        micro_batches=setup.config.rollout_micro_batches)
    return rubrics, grammar_lib.parse_rubric_tokens(rubrics.tokens, setup.grammar, setup.pad_id)


def policy_responses(setup: RoundSetup, policy: Decoder, batch: dict, rng: jax.Array
                     ) -> tuple[sampling.SampleResult, jax.Array]:
    """K sampled answers per prompt `[B, K, Lr]`, and their lengths without the stop token."""
    cfg = setup.config
    responses = sampling.sample(
        policy, batch["policy_input"], batch["policy_mask"], batch["policy_len"], rng,
        num_samples=cfg.num_responses, max_new_tokens=cfg.response_tokens,
        temperature=cfg.policy_temperature, top_p=cfg.top_p,
        stop_token_ids=setup.stop_token_ids, micro_batches=cfg.rollout_micro_batches)
    return responses, responses.lengths - responses.finished.astype(jnp.int32)


def generator_input(setup: RoundSetup, batch: dict, responses: sampling.SampleResult,
                    text_len: jax.Array) -> tpl.Packed:
    """The generator's left-padded prompts: the question and the responses its template shows
    (all K for DynamicRubric, none for the static rubric)."""
    shown = len(setup.generator_template.slots) - 1
    return tpl.assemble(
        setup.generator_template,
        [batch["prompt"], *(responses.tokens[:, k] for k in range(shown))],
        [batch["prompt_len"], *(text_len[:, k] for k in range(shown))],
        pad_id=setup.pad_id, align="right")


def pick(batch: dict, keys: tuple[str, ...]) -> dict:
    """The batch entries a stage reads: only those move to its mesh."""
    return {k: batch[k] for k in keys}


POLICY_KEYS = ("policy_input", "policy_mask", "policy_len")
QUESTION_KEYS = ("prompt", "prompt_len")


def respond_stage(setup: RoundSetup, policy_params: PyTree, batch: dict, rng: jax.Array
                  ) -> tuple[sampling.SampleResult, jax.Array]:
    """Stage 1 (policy): K answers per prompt and their lengths without the stop token."""
    policy = nnx.merge(setup.policy_graph, policy_params)
    return policy_responses(setup, policy, batch, jax.random.split(rng)[0])


def rubric_stage(setup: RoundSetup, generator_params: PyTree, batch: dict,
                 responses: sampling.SampleResult, text_len: jax.Array, rng: jax.Array
                 ) -> tuple[tpl.Packed, sampling.SampleResult, grammar_lib.ParsedRubric]:
    """Stage 2 (generator): it sees the prompt and the whole response set (or, static, the
    prompt alone) and writes G rubrics, parsed at the token level."""
    generator = nnx.merge(setup.generator_graph, generator_params)
    gen_input = generator_input(setup, batch, responses, text_len)
    return (gen_input, *write_rubrics(setup, generator, gen_input, jax.random.split(rng)[1]))


class Judged(NamedTuple):
    """What the verifier stage of a DynamicRubric round computes."""

    verdicts: jax.Array  # [B, K, G, M] (p_yes with soft_verdicts)
    scores: jax.Array  # [B, K, G] rubric scores of the responses
    anchor_scores: jax.Array  # [B, n, G] rubric scores of the anchor answers
    group_valid: jax.Array  # [B, G]
    gen_reward: jax.Array  # [B, G]
    gen_parts: dict[str, jax.Array]
    policy_reward: jax.Array  # [B, K]
    oracle_reward: jax.Array | None  # [B, K] ground truth, when the setup has an oracle
    generator_advantages: jax.Array  # [B, G]
    policy_advantages: jax.Array  # [B, K]
    metrics: dict[str, jax.Array]  # the rollout's scalar summaries


def judge_stage(setup: RoundSetup, verifier_params: PyTree, batch: dict,
                responses: sampling.SampleResult, text_len: jax.Array,
                rubrics: sampling.SampleResult, parsed: grammar_lib.ParsedRubric) -> Judged:
    """Stages 3-4 (verifier): every response and every anchor answer judged under every item,
    then scores, both roles' rewards and their group advantages."""
    cfg = setup.config
    verifier = nnx.merge(setup.verifier_graph, verifier_params)

    def judge(answers, lengths):
        prefix = ver.verifier_prefix(setup.verifier_template, batch["prompt"],
                                     batch["prompt_len"], answers, lengths, pad_id=setup.pad_id)
        out = ver.verify(verifier, setup.readout, prefix.tokens, prefix.lengths, parsed.items,
                         parsed.item_lengths, parsed.valid, pad_id=setup.pad_id,
                         micro_batches=cfg.rollout_micro_batches)
        return out.p_yes if cfg.soft_verdicts else out.verdicts.astype(jnp.float32)

    verdicts = judge(responses.tokens, text_len)  # [B, K, G, M]
    anchor_verdicts = judge(batch["anchors"], batch["anchor_len"])  # [B, n, G, M]

    weights = parsed.weights.astype(jnp.float32)
    scores, _ = dynamic_rubric_score(verdicts, weights[:, None], parsed.valid[:, None])
    anchor_scores, _ = dynamic_rubric_score(anchor_verdicts, weights[:, None],
                                            parsed.valid[:, None])
    gen_reward, parts = dynamic_rubric_rewards(
        verdicts.transpose(0, 2, 1, 3), weights, parsed.valid, anchor_scores.transpose(0, 2, 1),
        lam=cfg.anchor_weight, anchor_mask=batch["anchor_mask"], disc_mode=cfg.disc_mode)
    group_valid = parts["group_valid"] & parsed.complete
    gen_reward = jnp.where(group_valid, gen_reward, cfg.invalid_rubric_reward)

    oracle = (None if setup.oracle_reward is None
              else setup.oracle_reward(responses.tokens, text_len, batch))
    if cfg.policy_reward == "oracle":
        policy_reward = oracle
    elif cfg.policy_score == "best_group":
        best = jnp.argmax(jnp.where(group_valid, gen_reward, -jnp.inf), axis=-1)
        policy_reward = jnp.take_along_axis(scores, best[:, None, None], axis=2)[..., 0]
    else:
        policy_reward = mean_valid_score(scores, group_valid)
    K = cfg.num_responses
    valid = parsed.valid[:, None]
    metrics = {
        "policy/reward": policy_reward.mean(),
        "policy/reward_std_in_group": policy_reward.std(-1).mean(),
        "policy/response_length": responses.lengths.mean(),
        "policy/truncated": 1.0 - responses.finished.mean(),
        "generator/reward": gen_reward.mean(),
        "generator/discriminability": parts["disc"].mean(),
        "generator/anchor": parts["anchor"].mean(),
        "rubric/valid_rate": group_valid.mean(),
        "rubric/items": parsed.valid.sum(-1).mean(),
        "rubric/tokens": rubrics.lengths.mean(),
        "verifier/yes_rate": grpo.safe_ratio((verdicts * valid).sum(), valid.sum() * K),
        "tokens/generated": responses.lengths.sum() + rubrics.lengths.sum(),
    }
    return Judged(verdicts, scores, anchor_scores, group_valid, gen_reward, parts, policy_reward,
                  oracle, grpo.group_advantages(gen_reward, mode=cfg.advantage_mode),
                  grpo.group_advantages(policy_reward, mode=cfg.advantage_mode), metrics)


class Rollout(NamedTuple):
    """What one DynamicRubric round produces before any update (also what evaluation reads)."""

    responses: sampling.SampleResult  # [B, K, Lr]
    text_len: jax.Array  # [B, K] response lengths without the stop token
    gen_input: tpl.Packed  # the generator's prompts [B, Lg], left-padded
    rubrics: sampling.SampleResult  # [B, G, Lrub]
    parsed: grammar_lib.ParsedRubric
    judged: Judged


def dynamic_rubric_rollout(setup: RoundSetup, state: dict, frozen: dict, batch: dict,
                           rng: jax.Array, run: placement.Placement | None = None) -> Rollout:
    """Steps 1-4 of the round: responses, rubrics, verdicts, scores and both roles' rewards."""
    run = run or placement.colocated(setup)
    responses, text_len = run("policy", respond_stage, state["policy"],
                              pick(batch, POLICY_KEYS), rng)
    gen_input, rubrics, parsed = run("generator", rubric_stage, state["generator"],
                                     pick(batch, QUESTION_KEYS), responses, text_len, rng)
    # The whole batch: an oracle may read any of it.
    judged = run("verifier", judge_stage, frozen["verifier"], batch, responses, text_len,
                 rubrics, parsed)
    return Rollout(responses, text_len, gen_input, rubrics, parsed, judged)


def mean_valid_score(scores: jax.Array, group_valid: jax.Array) -> jax.Array:
    """Scores `[B, N, G]` averaged over the valid groups `[B, G]` -> `[B, N]`."""
    weight = group_valid[:, None, :].astype(jnp.float32)
    return grpo.safe_ratio((scores * weight).sum(-1), weight.sum(-1))


def dynamic_rubric_round(setup: RoundSetup, state: dict, frozen: dict, batch: dict,
                         rng: jax.Array, run: placement.Placement | None = None
                         ) -> tuple[dict, dict[str, jax.Array]]:
    """One DynamicRubric co-evolution round (pure; `make_round_step` jits it).

    `batch`: `prompt [B, Lq]` + `prompt_len [B]` (the plain question, spliced into templates);
    `policy_input [B, Lp]` left-padded chat-formatted policy prompt + `policy_mask`,
    `policy_len`; `anchors [B, n, La]` right-padded reference answers ranked best-first +
    `anchor_len [B, n]` and `anchor_mask [B, n]`.
    `frozen`: `verifier` params, and `policy_ref` / `generator_ref` params when their beta > 0.
    `run`: where the stages run (`placement`; default: inline, one program under `jax.jit`).
    """
    run = run or placement.colocated(setup)
    out = dynamic_rubric_rollout(setup, state, frozen, batch, rng, run)
    # 5-6. The generator learns from its rubric tokens (advantages within each prompt's G
    # rubrics), the policy from its responses, rewarded by the rubric scores.
    new_state, update_metrics = update_roles(setup, run, state, frozen, {
        "generator": (out.gen_input.tokens, out.gen_input.mask, out.rubrics,
                      out.judged.generator_advantages),
        "policy": (batch["policy_input"], batch["policy_mask"], out.responses,
                   out.judged.policy_advantages),
    })
    outputs = {"responses": out.responses.tokens, "response_len": out.text_len,
               "rubrics": out.rubrics.tokens, "rubric_len": out.rubrics.lengths,
               "scores": out.judged.scores}
    return new_state, {"scalars": {**out.judged.metrics, **update_metrics}, "outputs": outputs}


def evaluation_stage(setup: RoundSetup, batch: dict, judged: Judged) -> dict[str, jax.Array]:
    """The held-out metrics of a judged rollout (see `dynamic_rubric_evaluation`)."""
    del setup
    anchors = mean_valid_score(judged.anchor_scores, judged.group_valid)  # [B, n]
    n = anchors.shape[1]
    better = jnp.arange(n)[:, None] < jnp.arange(n)[None, :]
    listed = batch["anchor_mask"][:, :, None] & batch["anchor_mask"][:, None, :] & better
    gaps = anchors[:, :, None] - anchors[:, None, :]
    metrics = {
        "delta_gap": grpo.safe_ratio((gaps * listed).sum(), listed.sum()),
        "policy_score": mean_valid_score(judged.scores, judged.group_valid).mean(),
        "rubric_valid_rate": judged.group_valid.mean(),
    }
    if judged.oracle_reward is not None:
        metrics["quality"] = judged.oracle_reward.mean()
    return metrics


def dynamic_rubric_evaluation(setup: RoundSetup, state: dict, frozen: dict, batch: dict,
                              rng: jax.Array, run: placement.Placement | None = None
                              ) -> dict[str, jax.Array]:
    """A round's rollout on a held-out batch, no update: the evaluator's Δgap (mean score
    difference of every better-worse pair of anchor answers under this round's rubrics, the
    signal the evaluator gives), the rubric scores of the policy's responses and, when the
    setup has an oracle, the policy's ground-truth quality."""
    run = run or placement.colocated(setup)
    out = dynamic_rubric_rollout(setup, state, frozen, batch, rng, run)
    return run("verifier", evaluation_stage, pick(batch, ("anchor_mask",)), out.judged)


def make_round_step(setup: RoundSetup, frozen: dict[str, PyTree],
                    round_fn: Callable[..., tuple[dict, dict]] | None = None
                    ) -> Callable[[dict, dict, jax.Array], tuple[dict, dict]]:
    """The jitted round (`round_fn`, default the DynamicRubric round), state donated and its
    shardings kept; frozen weights are arguments, not constants. The program is built at the
    first call, from that state's shardings."""
    round_fn = round_fn or dynamic_rubric_round
    compiled: dict[str, Any] = {}

    def round_step(state, batch, rng):
        if "jitted" not in compiled:
            shardings = jax.tree.map(lambda x: x.sharding, state)
            replicated = NamedSharding(jax.tree.leaves(shardings)[0].mesh, PartitionSpec())
            compiled["jitted"] = jax.jit(
                lambda state, frozen, batch, rng: round_fn(setup, state, frozen, batch, rng),
                donate_argnums=(0,), out_shardings=(shardings, replicated))
            round_step.jitted = compiled["jitted"]  # exposes the compilation cache to tests
        return compiled["jitted"](state, frozen, batch, rng)

    return round_step


def make_submesh_round_step(setup: RoundSetup, frozen: dict[str, PyTree],
                            run: placement.SubMeshes,
                            round_fn: Callable[..., tuple[dict, dict]] | None = None
                            ) -> Callable[[dict, dict, jax.Array], tuple[dict, dict]]:
    """The round with each role on its own sub-mesh: one program per stage (`run`), each
    role's state donated to its update and kept on its mesh. Same signature and results as
    `make_round_step`; its metrics live on the meshes that computed them."""
    round_fn = round_fn or dynamic_rubric_round

    def round_step(state, batch, rng):
        return round_fn(setup, state, frozen, batch, rng, run)

    round_step.placement = run  # exposes the stages' compilation caches to tests
    return round_step


def encode_batch(tokenizer: Any, questions: list[str], anchors: list[list[str]], *,
                 prompt_tokens: int, policy_tokens: int, anchor_tokens: int,
                 num_anchors: int) -> dict[str, Any]:
    """Host side: questions and best-first anchor answers -> the round's fixed-shape batch.

    Anything longer than its budget is an error naming the row, never silently cut.
    """
    import numpy as np

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    b = len(questions)
    out = {
        "prompt": np.full((b, prompt_tokens), pad, np.int32),
        "prompt_len": np.zeros((b,), np.int32),
        "policy_input": np.full((b, policy_tokens), pad, np.int32),
        "policy_mask": np.zeros((b, policy_tokens), bool),
        "policy_len": np.zeros((b,), np.int32),
        "anchors": np.full((b, num_anchors, anchor_tokens), pad, np.int32),
        "anchor_len": np.zeros((b, num_anchors), np.int32),
        "anchor_mask": np.zeros((b, num_anchors), bool),
    }

    def fit(ids, limit, what, row):
        if len(ids) > limit:
            raise ValueError(f"row {row}: {what} has {len(ids)} tokens, the budget is {limit}")
        if not ids:
            raise ValueError(f"row {row}: {what} is empty")
        return ids

    for i, question in enumerate(questions):
        ids = fit(tokenizer(question, add_special_tokens=False)["input_ids"], prompt_tokens,
                  "prompt", i)
        out["prompt"][i, :len(ids)] = ids
        out["prompt_len"][i] = len(ids)
        chat = tokenizer.apply_chat_template([{"role": "user", "content": question}],
                                             add_generation_prompt=True, tokenize=False)
        ids = fit(tokenizer(chat, add_special_tokens=False)["input_ids"], policy_tokens,
                  "chat-formatted prompt", i)
        out["policy_input"][i, policy_tokens - len(ids):] = ids
        out["policy_mask"][i, policy_tokens - len(ids):] = True
        out["policy_len"][i] = len(ids)
        if len(anchors[i]) > num_anchors:
            raise ValueError(f"row {i}: {len(anchors[i])} anchor answers, at most {num_anchors}")
        for j, answer in enumerate(anchors[i]):
            ids = fit(tokenizer(answer, add_special_tokens=False)["input_ids"], anchor_tokens,
                      f"anchor answer {j}", i)
            out["anchors"][i, j, :len(ids)] = ids
            out["anchor_len"][i, j] = len(ids)
            out["anchor_mask"][i, j] = True
    return out
