"""The GenRubric round: one compiled program from queries to two GRPO updates.

GenRubric (DESIGN.md sections 1 and 3): the generator sees the query alone and samples G rubric
groups with signed weights (grammar-constrained) -> token-level parse -> each group induces one
response (the policy answers the query while shown that rubric) -> one verifier call judges
every induced response under every group -> sequence rewards (cross-rubric comprehensiveness +
group discrimination) and item rewards (discriminative + non-redundant) -> token-level
advantages (item tokens get item credit on top of the sequence advantage) -> generator GRPO
update -> the policy, rewarded on each induced response by the other valid groups' scores ->
policy GRPO update.

It shares the DynamicRubric round's config, state layout (`coevolve.init_state`), batch keys and
update code; what differs is the setup (query-only generator prompt, the induced-response
prompt, signed weights) and the rewards.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from jaxrubric import placement, sampling
from jaxrubric.coevolve import (QUESTION_KEYS, RoundConfig, RoundSetup, make_round_step, pick,
                                shared_setup_fields, update_roles, write_rubrics)
from jaxrubric.models.transformer import Decoder
from jaxrubric.rewards import genrubric as gr
from jaxrubric.rl import grpo
from jaxrubric.rubric import grammar as grammar_lib
from jaxrubric.rubric import templates as tpl
from jaxrubric.rubric import verifier as ver

PyTree = Any
GENRUBRIC_WEIGHTS = (-5, -4, -3, -2, -1, 1, 2, 3, 4, 5)


@dataclasses.dataclass(frozen=True, eq=False)
class GenRubricSetup(RoundSetup):
    """A `RoundSetup` whose generator template holds the query only and whose grammar admits
    signed weights, plus the prompt under which the policy writes rubric-induced responses.
    """

    induced_template: tpl.TokenTemplate


def build_genrubric_setup(config: RoundConfig, tokenizer: Any, policy: Decoder,
                          generator: Decoder, verifier: Decoder, *, max_items: int,
                          max_item_tokens: int, policy_optimizer: optax.GradientTransformation,
                          generator_optimizer: optax.GradientTransformation,
                          weights: Iterable[int] = GENRUBRIC_WEIGHTS,
                          chat_template_kwargs: Mapping[str, Any] | None = None,
                          template_style: str = "full") -> GenRubricSetup:
    """Templates, the signed-weight grammar and answer ids from the shared tokenizer.

    Induced responses are `config.response_tokens` long, like DynamicRubric's responses.
    Raises ValueError for fewer than two rubric groups (a group is scored by the others) or
    weights without a positive one (every group would be malformed).
    """
    weights = tuple(int(w) for w in weights)
    if config.num_rubrics < 2:
        raise ValueError("GenRubric needs num_rubrics >= 2: each group's induced response is "
                         f"judged by the other groups, got {config.num_rubrics}")
    if not any(w > 0 for w in weights):
        raise ValueError(f"GenRubric weights need a positive weight, got {weights}")
    if config.rubric_source != "dynamic" or config.policy_reward != "rubric":
        raise ValueError("GenRubric rubrics always come from the query alone and reward the "
                         "policy: rubric_source and policy_reward keep their defaults")
    return GenRubricSetup(
        config=config,
        generator_template=tpl.genrubric_generator_template(
            tokenizer, max_items=max_items, chat_template_kwargs=chat_template_kwargs,
            style=template_style),
        grammar=grammar_lib.build_rubric_grammar(
            tokenizer, weights=weights, max_items=max_items, max_item_tokens=max_item_tokens),
        policy_optimizer=policy_optimizer, generator_optimizer=generator_optimizer,
        **shared_setup_fields(tokenizer, policy, generator, verifier, chat_template_kwargs,
                              template_style),
        induced_template=tpl.induced_response_template(tokenizer, chat_template_kwargs,
                                                       template_style),
    )


class GeneratorCredit(NamedTuple):
    """GenRubric rewards of G groups and their token-level advantages (leading dims `[...]`)."""

    item_valid: jax.Array  # [..., G, M] parsed items of complete rubrics
    group_valid: jax.Array  # [..., G] well-formed groups (they take part in evaluation)
    scores: jax.Array  # [..., G_resp, G_rub] S_{g_rub}(r_{g_resp}), 0 under malformed groups
    sequence_reward: jax.Array  # [..., G]
    item_reward: jax.Array  # [..., G, M]
    token_advantages: jax.Array  # [..., G, L] per rubric token


def generator_credit(parsed: grammar_lib.ParsedRubric, verdicts: jax.Array, *,
                     soft: bool = False, advantage_mode: grpo.AdvantageMode = "group_std"
                     ) -> GeneratorCredit:
    """Rewards and token advantages of parsed rubrics `[..., G, ...]` from verdicts
    `[..., G_resp, G_rub, M]` (hard 0/1, or p_yes with `soft`).

    An incomplete rubric (no end token, or a forbidden token) counts as malformed: its items
    are dropped, so `genrubric_rewards` gives it reward 0 and keeps it out of evaluation.
    """
    item_valid = parsed.valid & parsed.complete[..., None]
    group_valid = gr.group_validity(parsed.weights, item_valid)
    sequence, item = gr.genrubric_rewards(verdicts, parsed.weights, item_valid, soft_items=soft)
    advantages = gr.genrubric_token_advantages(
        sequence, item, item_valid & group_valid[..., None], parsed.token_item,
        mode=advantage_mode)
    scores = gr.group_scores(verdicts, parsed.weights, item_valid)
    return GeneratorCredit(item_valid, group_valid, scores, sequence, item, advantages)


def induced_response_rewards(scores: jax.Array, group_valid: jax.Array
                             ) -> tuple[jax.Array, jax.Array]:
    """Policy rewards `[..., G]` of the induced responses and which of them have any.

    r_g is rewarded by the mean of `S_{g'}(r_g)` over the valid groups g' != g: its own rubric
    is left out, since the response was written to satisfy it. A response with no other valid
    group to judge it is not rewarded (valid False). Unlike `cross_rubric_comprehensiveness`,
    a response induced by a malformed group still counts: it is an answer to the query.
    """
    g = scores.shape[-1]
    judges = group_valid[..., None, :] & ~jnp.eye(g, dtype=bool)
    reward = grpo.safe_ratio((scores * judges).sum(-1), judges.sum(-1))
    return reward, judges.any(-1)


def _valid_mean(x: jax.Array, valid: jax.Array) -> jax.Array:
    """Mean over the valid entries (0 when there are none): metrics skip masked slots."""
    return grpo.safe_ratio(jnp.where(valid, x, 0.0).sum(), valid.sum())


def _valid_std(x: jax.Array, valid: jax.Array) -> jax.Array:
    """Population std over the valid entries of the last axis."""
    n = valid.sum(-1, keepdims=True)
    mean = grpo.safe_ratio(jnp.where(valid, x, 0.0).sum(-1, keepdims=True), n)
    return jnp.sqrt(grpo.safe_ratio(jnp.where(valid, jnp.square(x - mean), 0.0).sum(-1), n[..., 0]))


def genrubric_write_stage(setup: GenRubricSetup, generator_params: PyTree, batch: dict,
                          rng: jax.Array
                          ) -> tuple[tpl.Packed, sampling.SampleResult, grammar_lib.ParsedRubric]:
    """Stages 1-2 (generator): G rubric groups per query from the query alone (signed
    weights), parsed at the token level."""
    generator = nnx.merge(setup.generator_graph, generator_params)
    gen_input = tpl.assemble(setup.generator_template, [batch["prompt"]], [batch["prompt_len"]],
                             pad_id=setup.pad_id, align="right")
    return (gen_input, *write_rubrics(setup, generator, gen_input, jax.random.split(rng)[0]))


class Induced(NamedTuple):
    """The rubric-induced responses: one per group, after its own prompt."""

    prompt: tpl.Packed  # [B, G, Lind] left-padded: the query shown with rubric g
    responses: sampling.SampleResult  # [B, G, N]
    text_len: jax.Array  # [B, G] without the stop token


def induce_stage(setup: GenRubricSetup, policy_params: PyTree, batch: dict,
                 rubrics: sampling.SampleResult, rng: jax.Array) -> Induced:
    """Stage 3 (policy): rubric g induces one response, the policy answering the query while
    shown rubric g (its tokens without the end token)."""
    cfg = setup.config
    policy = nnx.merge(setup.policy_graph, policy_params)
    batch_size, G = rubrics.tokens.shape[:2]
    rows = batch_size * G
    slots = {"rubric": (rubrics.tokens, rubrics.lengths - rubrics.finished.astype(jnp.int32)),
             "prompt": (batch["prompt"][:, None], batch["prompt_len"][:, None])}
    induced = tpl.assemble(setup.induced_template,
                           [slots[s][0] for s in setup.induced_template.slots],
                           [slots[s][1] for s in setup.induced_template.slots],
                           pad_id=setup.pad_id, align="right")
    sampled = sampling.sample(
        policy, induced.tokens.reshape(rows, -1), induced.mask.reshape(rows, -1),
        induced.lengths.reshape(rows), jax.random.split(rng)[1], num_samples=1,
        max_new_tokens=cfg.response_tokens, temperature=cfg.policy_temperature, top_p=cfg.top_p,
        stop_token_ids=setup.stop_token_ids, micro_batches=cfg.rollout_micro_batches)
    responses = jax.tree.map(lambda x: x.reshape(batch_size, G, *x.shape[2:]), sampled)
    return Induced(induced, responses,
                   responses.lengths - responses.finished.astype(jnp.int32))


class GenRubricJudged(NamedTuple):
    """What the verifier stage of a GenRubric round computes."""

    credit: GeneratorCredit
    policy_reward: jax.Array  # [B, G] of the induced responses
    policy_advantages: jax.Array  # [B, G]
    metrics: dict[str, jax.Array]  # the rollout's scalar summaries


def genrubric_judge_stage(setup: GenRubricSetup, verifier_params: PyTree, batch: dict,
                          rubrics: sampling.SampleResult, parsed: grammar_lib.ParsedRubric,
                          induced: Induced) -> GenRubricJudged:
    """Stages 4-5 (verifier): every induced response under every group in one verifier call
    `[B, G_resp, G_rub, M]`; rewards and token-level credit for the generator, cross-rubric
    rewards and advantages for the policy."""
    cfg = setup.config
    verifier = nnx.merge(setup.verifier_graph, verifier_params)
    responses, text_len = induced.responses, induced.text_len
    item_valid = parsed.valid & parsed.complete[..., None]
    prefix = ver.verifier_prefix(setup.verifier_template, batch["prompt"], batch["prompt_len"],
                                 responses.tokens, text_len, pad_id=setup.pad_id)
    judged = ver.verify(verifier, setup.readout, prefix.tokens, prefix.lengths, parsed.items,
                        parsed.item_lengths, item_valid, pad_id=setup.pad_id,
                        micro_batches=cfg.rollout_micro_batches)
    verdicts = judged.p_yes if cfg.soft_verdicts else judged.verdicts.astype(jnp.float32)

    credit = generator_credit(parsed, verdicts, soft=cfg.soft_verdicts,
                              advantage_mode=cfg.advantage_mode)
    group_valid = credit.group_valid
    item_mask = item_valid & group_valid[..., None]
    policy_reward, policy_valid = induced_response_rewards(credit.scores, group_valid)
    negative = parsed.valid & (parsed.weights < 0)
    metrics = {
        "generator/reward": credit.sequence_reward.mean(),
        "generator/comprehensiveness": _valid_mean(
            gr.cross_rubric_comprehensiveness(credit.scores, group_valid), group_valid),
        "generator/discrimination": _valid_mean(
            gr.group_discrimination(credit.scores, group_valid), group_valid),
        "generator/item_reward": _valid_mean(credit.item_reward, item_mask),
        "generator/item_discriminative": _valid_mean(gr.item_discriminative(
            verdicts, item_valid, group_valid, soft=cfg.soft_verdicts), item_mask),
        "generator/item_nonredundant": _valid_mean(gr.item_nonredundant(
            verdicts, item_valid, group_valid, soft=cfg.soft_verdicts), item_mask),
        "rubric/valid_rate": group_valid.mean(),
        "rubric/complete_rate": parsed.complete.mean(),
        "rubric/items": parsed.valid.sum(-1).mean(),
        "rubric/negative_items": negative.sum(-1).mean(),
        "rubric/tokens": rubrics.lengths.mean(),
        "tokens/generated": rubrics.lengths.sum() + responses.lengths.sum(),
        "policy/reward": _valid_mean(policy_reward, policy_valid),
        "policy/reward_std_in_group": _valid_std(policy_reward, policy_valid).mean(),
        "policy/response_length": responses.lengths.mean(),
        "policy/truncated": 1.0 - responses.finished.mean(),
        "verifier/yes_rate": _valid_mean(
            verdicts, jnp.broadcast_to(item_valid[:, None], verdicts.shape)),
    }
    advantages = grpo.group_advantages(policy_reward, mode=cfg.advantage_mode, valid=policy_valid)
    return GenRubricJudged(credit, policy_reward, advantages, metrics)


def genrubric_round(setup: GenRubricSetup, state: dict, frozen: dict, batch: dict,
                    rng: jax.Array, run: placement.Placement | None = None
                    ) -> tuple[dict, dict[str, Any]]:
    """One GenRubric co-evolution round (pure; `make_genrubric_round_step` jits it).

    `batch`: `prompt [B, Lq]` + `prompt_len [B]` (the plain query, spliced into templates);
    `policy_input`, `policy_mask`, `policy_len` as in the DynamicRubric round (unused here: the
    policy answers under the induced-response prompt); anchors, if present, are unused.
    `frozen`: `verifier` params, and `policy_ref` / `generator_ref` params when their beta > 0.
    `run`: where the stages run (`placement`; default: inline, one program under `jax.jit`).
    Malformed groups get reward 0 (DESIGN.md), not `config.invalid_rubric_reward`.
    """
    run = run or placement.colocated(setup)
    question = pick(batch, QUESTION_KEYS)
    gen_input, rubrics, parsed = run("generator", genrubric_write_stage, state["generator"],
                                     question, rng)
    induced = run("policy", induce_stage, state["policy"], question, rubrics, rng)
    judged = run("verifier", genrubric_judge_stage, frozen["verifier"], question, rubrics, parsed,
                 induced)
    # 6-7. The generator learns from its rubric tokens with token-level advantages; the policy
    # from the induced responses, advantages over the G responses of a query.
    new_state, update_metrics = update_roles(setup, run, state, frozen, {
        "generator": (gen_input.tokens, gen_input.mask, rubrics,
                      judged.credit.token_advantages),
        "policy": (induced.prompt.tokens, induced.prompt.mask, induced.responses,
                   judged.policy_advantages),
    })
    credit = judged.credit
    outputs = {"responses": induced.responses.tokens, "response_len": induced.text_len,
               "rubrics": rubrics.tokens, "rubric_len": rubrics.lengths,
               "rubric_weights": parsed.weights, "rubric_valid": credit.item_valid,
               "group_valid": credit.group_valid, "scores": credit.scores,
               "generator_reward": credit.sequence_reward, "policy_reward": judged.policy_reward}
    return new_state, {"scalars": {**judged.metrics, **update_metrics}, "outputs": outputs}


def make_genrubric_round_step(setup: GenRubricSetup, frozen: dict[str, PyTree]
                              ) -> Callable[[dict, dict, jax.Array], tuple[dict, dict]]:
    """The jitted GenRubric round (see `coevolve.make_round_step`)."""
    return make_round_step(setup, frozen, genrubric_round)
