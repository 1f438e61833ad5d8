"""GenRubric: the generator writes signed rubric groups from the query alone and self-evolves.

One round (docs/design.md, §1 and §7), stage by stage as `genrubric_round` calls them (each
on its role's devices, `jaxrubric.placement`), its random keys planned in `round_keys`:

1. **write** (generator): G rubric groups per query with signed weights (negative items
   penalise observable errors), grammar-constrained and parsed on device;
2. **induce** (policy): each group induces one response (or `induced_responses` N), the
   policy answering the query while shown that rubric;
3. **judge** (verifier): every induced response under every group in one verifier call, and
   its score under every group;
4. **reward** (verifier): sequence rewards (cross-rubric comprehensiveness + group
   discrimination) and item rewards (discriminative + non-redundant) -> token-level
   advantages (item tokens get item credit on top of the sequence advantage); the policy is
   rewarded on each induced response by the other valid groups' scores;
5. **update** (`methods.update`): GRPO on the generator's rubric tokens (token-level
   advantages), then on the policy's induced responses.

A malformed group gets reward 0 and takes no part in judging; for its advantage it ranks below
every well-formed group of its query (`rl.grpo.rank_invalid_last`).

`evaluate` (held-out, no update): on expert-rubric rows (`jaxrubric.eval.expert_agreement`) the
generator writes R sampled rubrics and a greedy one per query and the verifier judges every
held-out completion under them and under the expert rubric; the host turns the score matrix
into agreement metrics.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from jaxrubric import placement, sampling
from jaxrubric.eval.expert_agreement import ExpertBatch, ExpertRows
from jaxrubric.methods.data import (Frozen, Question, RoundBatch, RoundResult, RoundState,
                                    role_weights)
from jaxrubric.methods.method import Method, verifier_messages
from jaxrubric.methods.round_config import RoundConfig
from jaxrubric.methods.setup import RoundSetup
from jaxrubric.methods.shapes import check_micro_batches
from jaxrubric.methods.keys import SHUFFLE_STREAM, RoundKey, update_keys
from jaxrubric.methods.steps import Rubrics, judge_answers, text_lengths, write_rubrics
from jaxrubric.methods.update import UpdateInputs, update
from jaxrubric.rewards import genrubric as gr
from jaxrubric.rewards import telemetry
from jaxrubric.rl import grpo
from jaxrubric.roles import Role
from jaxrubric.rubric import grammar as grammar_lib
from jaxrubric.rubric import templates as tpl
from jaxrubric.rubric import verifier as ver

# ------------------------------------------------------------------------------ settings
@dataclasses.dataclass(frozen=True)
class GenRubricConfig(RoundConfig):
    """GenRubric's round: the shared settings and its own."""

    # Reward coefficients (`rewards.genrubric.genrubric_rewards`): sequence reward =
    # comprehensiveness + group discrimination; item reward = discriminative + non-redundant.
    # The paper's ablation keeps comprehensiveness alone.
    comprehensiveness_coef: float = 1.0
    discrimination_coef: float = 1.0
    discriminative_coef: float = 0.5
    nonredundant_coef: float = 0.5
    # How group discrimination measures a rubric's spread over the induced responses
    # (`rewards.genrubric.group_discrimination`): "std", "range", or "pairs" (the share of
    # response pairs it scores apart, which a coarser rubric cannot raise).
    discrimination_spread: str = "std"
    # A control, not a method: the generator's rewards are shuffled among each query's groups
    # (and items) before they become advantages (`generator_credit`), so an agreement that
    # rises anyway comes from sharpening the sampled distribution, not from what the rewards
    # say.
    shuffle_generator_credit: bool = False
    # The responses a query's G rubrics induce draw the same sampling noise (common random
    # numbers). Each response keeps its distribution, so every reward keeps its expectation;
    # where two rubrics leave the policy equally unsure (a requirement neither states) their
    # responses make the same choice, so the comparison among the query's groups, which is all
    # GRPO's advantages read, reflects what the rubrics say rather than the policy's coin flips.
    induce_common_noise: bool = False
    # Responses each rubric group induces (the paper: 1). Its rewards are averaged over them, a
    # Monte Carlo average of the same expectation with less of the policy's sampling noise in
    # each group's reward; the policy's advantages span a query's G x N responses.
    induced_responses: int = 1

    CHOICES: ClassVar[Mapping[str, Collection[str]]] = {"discrimination_spread": gr.SPREADS}

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.induced_responses < 1:
            raise ValueError(f"induced_responses must be >= 1, got {self.induced_responses}")


# ------------------------------------------------------------------------------ keys
class Keys(NamedTuple):
    """A round's random keys, one per stage that draws."""

    write: RoundKey
    induce: RoundKey
    shuffle: RoundKey  # the control's (`shuffle_generator_credit`)
    update: dict[Role, RoundKey]  # each trained role's LoRA dropout


def round_keys(rng: jax.Array) -> Keys:
    """The round's key plan: every key its stages draw, from the round's key."""
    key = RoundKey(rng)
    write_key, induce_key = key.split()
    return Keys(write_key, induce_key, key.fold_in(SHUFFLE_STREAM), update_keys(key))


# ------------------------------------------------------------------------------ stages
@placement.stage(Role.GENERATOR)
def write(setup: RoundSetup, generator_params: nnx.State, question: Question, key: RoundKey
          ) -> Rubrics:
    """Stage 1 (generator): G rubric groups per query from the query alone (signed weights),
    parsed at the token level."""
    generator = nnx.merge(setup.graph(Role.GENERATOR), generator_params)
    prompt = tpl.assemble(setup.generator_template, [question.tokens], [question.lengths],
                          pad_id=setup.pad_id, align="right")
    return write_rubrics(setup, generator, prompt, key.draw())


class Induced(NamedTuple):
    """The rubric-induced responses: `induced_responses` per group, after its own prompt."""

    prompt: tpl.Packed  # [B, G, Lind] left-padded: the query shown with rubric g
    responses: sampling.SampleResult  # [B, G N, L]: group g's i-th response at g N + i
    text_len: jax.Array  # [B, G N] without the stop token


@placement.stage(Role.POLICY)
def induce(setup: RoundSetup, policy_params: nnx.State, question: Question,
           rubrics: sampling.SampleResult, key: RoundKey) -> Induced:
    """Stage 2 (policy): rubric g induces `induced_responses` (N) responses, the policy
    answering the query while shown rubric g (its tokens without the end token); with
    `induce_common_noise` the n-th responses of a query's G groups draw the same noise."""
    cfg = setup.config
    policy = nnx.merge(setup.graph(Role.POLICY), policy_params)
    batch_size, G = rubrics.tokens.shape[:2]
    rows, n = batch_size * G, cfg.induced_responses
    slots = {"rubric": (rubrics.tokens, text_lengths(rubrics)),
             "prompt": (question.tokens[:, None], question.lengths[:, None])}
    induced = tpl.assemble(setup.induced_template,
                           [slots[s][0] for s in setup.induced_template.slots],
                           [slots[s][1] for s in setup.induced_template.slots],
                           pad_id=setup.pad_id, align="right")
    sampled = sampling.sample(
        policy, induced.tokens.reshape(rows, -1), induced.mask.reshape(rows, -1),
        induced.lengths.reshape(rows), key.draw(), num_samples=n,
        max_new_tokens=cfg.response_tokens, temperature=cfg.policy.temperature, top_p=cfg.top_p,
        stop_token_ids=setup.stop_token_ids, micro_batches=cfg.rollout_micro_batches,
        noise_rows=common_noise_rows(batch_size, G, n) if cfg.induce_common_noise else None)
    responses = jax.tree.map(lambda x: x.reshape(batch_size, G * n, *x.shape[2:]), sampled)
    return Induced(induced, responses, text_lengths(responses))


def common_noise_rows(batch_size: int, groups: int, n: int) -> jax.Array:
    """The noise stream of each induced response (rows `(b G + g) N + i`): `b N + i`, shared
    by the i-th responses of query b's groups."""
    row = jnp.arange(batch_size * groups * n)
    return row // (groups * n) * n + row % n


def policy_update_inputs(induced: Induced, advantages: jax.Array, n: int) -> UpdateInputs:
    """The policy's update on its induced responses: each group's prompt `[B G, Lind]` as one
    row under its N responses `[B G, N, ...]` (`update.role_update` encodes it once with
    `share_prefix` when N > 1)."""
    b, g = induced.prompt.tokens.shape[:2]

    def under_prompt(x: jax.Array) -> jax.Array:  # [B, G N, ...] -> [B G, N, ...]
        return x.reshape(b * g, n, *x.shape[2:])

    return UpdateInputs(induced.prompt.tokens.reshape(b * g, -1),
                        induced.prompt.mask.reshape(b * g, -1),
                        jax.tree.map(under_prompt, induced.responses), under_prompt(advantages))


def response_sets(x: jax.Array, n: int, axis: int) -> jax.Array:
    """`[..., G N, ...]` at `axis` (group g's i-th response at g N + i) -> `[..., N, G, ...]`:
    N sets of one response per group, each scored as the paper scores its one response."""
    axis %= x.ndim
    groups = x.shape[axis] // n
    x = x.reshape(*x.shape[:axis], groups, n, *x.shape[axis + 1:])
    return jnp.moveaxis(x, axis + 1, axis)


def over_sets(x: jax.Array, n: int, axis: int) -> jax.Array:
    """`[..., G, ...]` with the group axis at `axis` -> `[..., N, G, ...]` (the same for every
    set: a group's rubric, weights and validity)."""
    axis %= x.ndim
    x = jnp.expand_dims(x, axis)
    return jnp.broadcast_to(x, (*x.shape[:axis], n, *x.shape[axis + 1:]))


# ------------------------------------------------------------------------------ credit
class GeneratorCredit(NamedTuple):
    """GenRubric rewards of G groups and their token-level advantages (leading dims `[...]`)."""

    item_valid: jax.Array  # [..., G, M] parsed items of complete rubrics
    group_valid: jax.Array  # [..., G] well-formed groups (they take part in evaluation)
    # [..., G_resp N, G_rub] S_{g_rub}(r), r the responses group g_resp induced (N each), 0
    # under malformed groups
    scores: jax.Array
    sequence_reward: jax.Array  # [..., G]
    item_reward: jax.Array  # [..., G, M]
    token_advantages: jax.Array  # [..., G, L] per rubric token


def generator_credit(parsed: grammar_lib.ParsedRubric, verdicts: jax.Array, *,
                     soft: bool = False, advantage_mode: grpo.AdvantageMode = "group_std",
                     coefficients: Mapping[str, float] | None = None, spread: gr.Spread = "std",
                     shuffle_key: jax.Array | None = None, responses_per_group: int = 1,
                     scores: jax.Array | None = None) -> GeneratorCredit:
    """Rewards and token advantages of parsed rubrics `[..., G, ...]` from verdicts
    `[..., G_resp N, G_rub, M]` (hard 0/1, or p_yes with `soft`) of the N =
    `responses_per_group` responses each group induced; `coefficients` of `genrubric_rewards`
    by name (default: its defaults); `spread`: how group discrimination is measured
    (`gr.group_discrimination`). With N > 1 the rewards are the mean over the N response
    sets (`response_sets`), each rewarded as the paper rewards its one response per group.

    An incomplete rubric (no end token, or a forbidden token) counts as malformed: its items
    are dropped, so `genrubric_rewards` gives it reward 0 and keeps it out of evaluation.

    `shuffle_key` (the control of `GenRubricConfig.shuffle_generator_credit`): each query's
    sequence rewards are permuted among its well-formed groups and its item rewards among its
    valid items before they become advantages, so the update keeps its size and spread but no
    longer says which rubric earned what. The returned rewards are the shuffled ones.

    `scores`: the verdicts' group scores (`gr.group_scores`) when the judge has them.
    """
    n = responses_per_group
    item_valid = parsed.valid & parsed.complete[..., None]
    group_valid = gr.group_validity(parsed.weights, item_valid)
    sequence, item = gr.genrubric_rewards(
        response_sets(verdicts, n, -3), over_sets(parsed.weights, n, -2),
        over_sets(item_valid, n, -2), soft_items=soft, spread=spread, **(coefficients or {}))
    sequence, item = sequence.mean(-2), item.mean(-3)
    item_mask = item_valid & group_valid[..., None]
    if shuffle_key is not None:
        sequence_key, item_key = jax.random.split(shuffle_key)
        sequence = gr.shuffle_among_valid(sequence, group_valid, sequence_key)
        flat = item.shape[:-2] + (-1,)
        item = gr.shuffle_among_valid(item.reshape(flat), item_mask.reshape(flat),
                                      item_key).reshape(item.shape)
    advantages = gr.genrubric_token_advantages(
        sequence, item, item_mask, parsed.token_item, group_valid=group_valid,
        mode=advantage_mode)
    if scores is None:
        scores = gr.group_scores(verdicts, parsed.weights, item_valid)
    return GeneratorCredit(item_valid, group_valid, scores, sequence, item, advantages)


def reward_coefficients(config: GenRubricConfig) -> dict[str, float]:
    """The round config's GenRubric reward coefficients, as `genrubric_rewards` takes them."""
    return {name: getattr(config, name) for name in (
        "comprehensiveness_coef", "discrimination_coef", "discriminative_coef",
        "nonredundant_coef")}


def policy_credit(scores: jax.Array, group_valid: jax.Array, cfg: GenRubricConfig
                  ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The policy's rewards `[..., G N]` (`induced_response_rewards`), which of them count,
    and their advantages over a query's G N responses in the policy's advantage mode."""
    reward, valid = induced_response_rewards(scores, group_valid)
    return reward, valid, grpo.group_advantages(reward, mode=cfg.policy.advantage_mode,
                                                valid=valid)


def induced_response_rewards(scores: jax.Array, group_valid: jax.Array
                             ) -> tuple[jax.Array, jax.Array]:
    """Policy rewards `[..., G N]` of the induced responses (`scores [..., G N, G]`, N per
    group) and which of them have any.

    r, induced by group g, is rewarded by the mean of `S_{g'}(r)` over the valid groups
    g' != g: its own rubric is left out, since the response was written to satisfy it. A
    response with no other valid group to judge it is not rewarded (valid False). Unlike
    `cross_rubric_comprehensiveness`, a response induced by a malformed group still counts: it
    is an answer to the query.
    """
    responses, g = scores.shape[-2:]
    own = jnp.arange(responses)[:, None] // (responses // g) == jnp.arange(g)[None, :]
    judges = group_valid[..., None, :] & ~own
    reward = grpo.masked_mean(scores, judges, axis=-1)
    return reward, judges.any(-1)



def masked_std(x: jax.Array, valid: jax.Array) -> jax.Array:
    """Population std over the valid entries of the last axis (0 where none are)."""
    mean = grpo.masked_mean(x, valid, axis=-1)[..., None]
    return jnp.sqrt(grpo.masked_mean(jnp.square(x - mean), valid, axis=-1))


class Judged(NamedTuple):
    """What the judge stage computes: verdicts and the scores they give."""

    verdicts: jax.Array  # [B, G_resp N, G_rub, M] (p_yes with soft_verdicts)
    item_valid: jax.Array  # [B, G, M] parsed items of complete rubrics
    scores: jax.Array  # [B, G_resp N, G_rub] S_{g_rub}(r), 0 under malformed groups


@placement.stage(Role.VERIFIER)
def judge(setup: RoundSetup, verifier_params: nnx.State, question: Question,
          parsed: grammar_lib.ParsedRubric, induced: Induced) -> Judged:
    """Stage 3 (verifier): every induced response under every group in one verifier call
    `[B, G_resp N, G_rub, M]`, and its score under every group."""
    verifier = nnx.merge(setup.graph(Role.VERIFIER), verifier_params)
    item_valid = parsed.valid & parsed.complete[..., None]
    verdicts = judge_answers(setup, verifier, question, induced.responses.tokens,
                             induced.text_len, parsed, item_valid, "induced responses")
    return Judged(verdicts, item_valid, gr.group_scores(verdicts, parsed.weights, item_valid))


class Rewards(NamedTuple):
    """What the reward stage computes."""

    credit: GeneratorCredit
    policy_reward: jax.Array  # [B, G N] of the induced responses
    policy_advantages: jax.Array  # [B, G N]
    metrics: dict[str, jax.Array]  # the rollout's scalar summaries, telemetry's included
    judgement: telemetry.Judgement  # what the telemetry and the cards read


@placement.stage(Role.VERIFIER)
def reward(setup: RoundSetup, rubrics: sampling.SampleResult, parsed: grammar_lib.ParsedRubric,
           induced: Induced, judged: Judged, shuffle_key: RoundKey) -> Rewards:
    """Stage 4 (verifier): rewards and token-level credit for the generator, cross-rubric
    rewards and advantages (over a query's G N responses) for the policy (`shuffle_key`: the
    control's shuffle only)."""
    cfg = setup.config
    responses, verdicts, item_valid = induced.responses, judged.verdicts, judged.item_valid
    credit = generator_credit(parsed, verdicts, soft=cfg.soft_verdicts,
                              advantage_mode=cfg.generator.advantage_mode,
                              coefficients=reward_coefficients(cfg),
                              spread=cfg.discrimination_spread,
                              shuffle_key=(shuffle_key.draw()
                                           if cfg.shuffle_generator_credit else None),
                              responses_per_group=cfg.induced_responses, scores=judged.scores)
    group_valid = credit.group_valid
    item_mask = item_valid & group_valid[..., None]
    policy_reward, policy_valid, advantages = policy_credit(credit.scores, group_valid, cfg)
    negative = parsed.valid & (parsed.weights < 0)
    # The reward terms per response set (`response_sets`), averaged over the sets.
    n = cfg.induced_responses
    set_scores, set_verdicts = response_sets(credit.scores, n, -2), response_sets(verdicts, n, -3)
    set_groups, set_items = over_sets(group_valid, n, -1), over_sets(item_valid, n, -2)
    set_mask = over_sets(item_mask, n, -2)
    judgement = telemetry.Judgement(
        verdicts, parsed.weights, item_valid, group_valid, parsed.complete, parsed.items,
        parsed.item_lengths, policy_reward, policy_valid, induced.text_len)
    metrics = {
        **telemetry.round_telemetry(judgement, rubrics.lengths, redundancy=True),
        "generator/reward": credit.sequence_reward.mean(),
        "generator/comprehensiveness": grpo.masked_mean(
            gr.cross_rubric_comprehensiveness(set_scores, set_groups), set_groups),
        "generator/discrimination": grpo.masked_mean(gr.group_discrimination(
            set_scores, set_groups, spread=cfg.discrimination_spread), set_groups),
        "generator/item_reward": grpo.masked_mean(credit.item_reward, item_mask),
        "generator/item_discriminative": grpo.masked_mean(gr.item_discriminative(
            set_verdicts, set_items, set_groups, soft=cfg.soft_verdicts), set_mask),
        "generator/item_nonredundant": grpo.masked_mean(gr.item_nonredundant(
            set_verdicts, set_items, set_groups, soft=cfg.soft_verdicts), set_mask),
        "rubric/valid_rate": group_valid.mean(),
        "rubric/complete_rate": parsed.complete.mean(),
        "rubric/items": parsed.valid.sum(-1).mean(),
        "rubric/negative_items": negative.sum(-1).mean(),
        "rubric/tokens": rubrics.lengths.mean(),
        "tokens/generated": rubrics.lengths.sum() + responses.lengths.sum(),
        "policy/reward": grpo.masked_mean(policy_reward, policy_valid),
        "policy/reward_std_in_group": masked_std(policy_reward, policy_valid).mean(),
        "policy/response_length": responses.lengths.mean(),
        "policy/truncated": 1.0 - responses.finished.mean(),
        "verifier/yes_rate": grpo.masked_mean(verdicts, item_valid[:, None]),
    }
    return Rewards(credit, policy_reward, advantages, metrics, judgement)


class Outputs(NamedTuple):
    """A round's outputs beside its scalars (for text samples and inspection)."""

    responses: jax.Array  # [B, G N, L] the induced responses (N = induced_responses per group)
    response_len: jax.Array  # [B, G N]
    rubrics: jax.Array  # [B, G, Lrub]
    rubric_len: jax.Array  # [B, G]
    scores: jax.Array  # [B, G_resp N, G_rub]
    generator_reward: jax.Array  # [B, G]
    policy_reward: jax.Array  # [B, G N]
    # Verdicts, items (weights, validity) and groups' validity, for rubric cards
    # (`methods.cards`).
    judgement: telemetry.Judgement
    policy_advantages: jax.Array  # [B, G N]
    generator_advantages: jax.Array  # [B, G] of the sequence rewards (before item credit)
    item_reward: jax.Array  # [B, G, M]


def genrubric_round(setup: RoundSetup, state: RoundState, frozen: Frozen, batch: RoundBatch,
                    rng: jax.Array) -> tuple[RoundState, RoundResult]:
    """One GenRubric co-evolution round (pure; `programs.make_round_step` jits it, and
    `placement.running` sets where its stages run). Reads the batch's question only (the
    policy answers under the induced-response prompt).

    `frozen`: the verifier, and each trained role's KL reference when its beta > 0.
    """
    keys = round_keys(rng)
    question = batch.question
    rubrics = write(setup, role_weights(state, frozen, Role.GENERATOR), question, keys.write)
    induced = induce(setup, role_weights(state, frozen, Role.POLICY), question, rubrics.samples,
                     keys.induce)
    judged = judge(setup, frozen.verifier, question, rubrics.parsed, induced)
    rewards = reward(setup, rubrics.samples, rubrics.parsed, induced, judged, keys.shuffle)
    # 5. The generator learns from its rubric tokens with token-level advantages; the policy
    # from the induced responses, advantages over the G responses of a query.
    credit = rewards.credit
    new_state, update_metrics = update(setup, state, frozen, {
        Role.GENERATOR: UpdateInputs(rubrics.prompt.tokens, rubrics.prompt.mask,
                                     rubrics.samples, credit.token_advantages),
        Role.POLICY: policy_update_inputs(induced, rewards.policy_advantages,
                                          setup.config.induced_responses),
    }, keys.update)
    outputs = Outputs(induced.responses.tokens, induced.text_len, rubrics.samples.tokens,
                      rubrics.samples.lengths, credit.scores, credit.sequence_reward,
                      rewards.policy_reward, rewards.judgement, rewards.policy_advantages,
                      gr.sequence_advantages(credit.sequence_reward, credit.group_valid,
                                             setup.config.generator.advantage_mode),
                      credit.item_reward)
    return new_state, RoundResult({**rewards.metrics, **update_metrics}, outputs)


# ------------------------------------------------------------------------------ evaluation
@placement.stage(Role.GENERATOR)
def held_out_write(setup: RoundSetup, generator_params: nnx.State, batch: ExpertBatch,
                   key: RoundKey) -> grammar_lib.ParsedRubric:
    """The held-out queries' rubrics, parsed `[B, R + 1, ...]`: `batch.runs` = R sampled at
    the generator's temperature (the paper's runs), then the greedy one (what a deployed
    generator writes)."""
    question = Question(batch.question, batch.question_lengths)

    def rubrics(num_rubrics: int, temperature: float) -> grammar_lib.ParsedRubric:
        config = dataclasses.replace(setup.config, num_rubrics=num_rubrics, generator=(
            dataclasses.replace(setup.config.generator, temperature=temperature)))
        return write(dataclasses.replace(setup, config=config), generator_params, question,
                     key).parsed

    sampled, greedy = rubrics(batch.runs, setup.config.generator.temperature), rubrics(1, 0.0)
    return jax.tree.map(lambda s, g: jnp.concatenate([s, g], axis=1), sampled, greedy)


@placement.stage(Role.VERIFIER)
def held_out_judge(setup: RoundSetup, verifier_params: nnx.State, batch: ExpertBatch,
                   parsed: grammar_lib.ParsedRubric) -> dict[str, jax.Array]:
    """Every held-out completion under the written rubrics and the expert rubric (the last
    group) in one verifier call, judged as the round judges (`steps.judge_answers`: 0/1 verdicts, the
    paper's and HealthBench's, or p_yes with `soft_verdicts`). Returns `scores [B, N, R + 2]`
    and `group_valid [B, R + 2]` (`jaxrubric.eval.expert_agreement` reads them on the host).

    The G = R + 1 generated rubrics' M items and the expert's M_e criteria go to the verifier
    as one list of G M + M_e branches (its tree forward never tells groups apart), so neither
    side is padded to the other's length; the verdicts are split back into groups after."""
    verifier = nnx.merge(setup.graph(Role.VERIFIER), verifier_params)
    b, g, m = parsed.weights.shape
    generated_valid = parsed.valid & parsed.complete[..., None]

    def branches(generated: jax.Array, expert: jax.Array) -> jax.Array:
        """Generated `[B, G, M, ...]` and expert `[B, M_e, ...]` -> `[B, 1, G M + M_e, ...]`."""
        flat = generated.reshape(b, g * m, *generated.shape[3:])
        return jnp.concatenate([flat, expert.astype(generated.dtype)], axis=1)[:, None]

    prefix = ver.verifier_prefix(setup.verifier_template, batch.question, batch.question_lengths,
                                 batch.responses, batch.response_lengths, pad_id=setup.pad_id)
    out = ver.verify(verifier, setup.readout, prefix.tokens, prefix.lengths,
                     branches(parsed.items, batch.items),
                     branches(parsed.item_lengths, batch.item_lengths),
                     branches(generated_valid, batch.valid), pad_id=setup.pad_id,
                     micro_batches=setup.config.rollout_micro_batches)
    verdicts = out.p_yes if setup.config.soft_verdicts else out.verdicts.astype(jnp.float32)
    verdicts = verdicts[:, :, 0]  # [B, N, G M + M_e]
    weights = (parsed.weights, batch.weights[:, None])  # [B, G, M], [B, 1, M_e]
    valid = (generated_valid, batch.valid[:, None])
    scores = (gr.group_scores(verdicts[..., :g * m].reshape(*verdicts.shape[:2], g, m),
                              weights[0], valid[0]),
              gr.group_scores(verdicts[..., None, g * m:], weights[1], valid[1]))
    return {"scores": jnp.concatenate(scores, axis=-1),  # [B, N, G + 1]
            "group_valid": jnp.concatenate([gr.group_validity(w, v) for w, v in
                                            zip(weights, valid)], axis=-1)}  # [B, G + 1]


def genrubric_evaluation(setup: RoundSetup, state: RoundState, frozen: Frozen,
                         batch: ExpertBatch, rng: jax.Array) -> dict[str, jax.Array]:
    """The held-out evaluation's device part, no update (jitted whole, or a stage per role's
    mesh): rubrics written from each held-out query alone, then every completion judged. The
    agreement metrics are the host's (`ExpertRows.scalars`): rank statistics over a few
    hundred numbers are not worth sorts and masks in XLA. Beside the scores, the R + 1 written
    rubrics per query, parsed (`rubric_items [B, R + 1, M, Li]`, `rubric_item_lengths`,
    `rubric_weights`, `rubric_valid` `[B, R + 1, M]`)."""
    parsed = held_out_write(setup, role_weights(state, frozen, Role.GENERATOR), batch,
                            round_keys(rng).write)
    judged = held_out_judge(setup, frozen.verifier, batch, parsed)
    # The written rubrics leave the device too (a few KiB): `eval_scores.jsonl` shows what was
    # judged, and a world with a checker can judge them again without the verifier's errors.
    return {**judged, "rubric_items": parsed.items, "rubric_item_lengths": parsed.item_lengths,
            "rubric_weights": parsed.weights,
            "rubric_valid": parsed.valid & parsed.complete[..., None]}


# ------------------------------------------------------------------------------ the method
class GenRubric(Method):
    """GenRubric (see the module docstring)."""

    name: ClassVar[str] = "genrubric"
    weights: ClassVar[tuple[int, ...]] = grammar_lib.SIGNED_WEIGHTS
    evaluates: ClassVar[bool] = True
    # Its held-out rows: expert rubrics (HealthBench schema), loaded before any model and scored
    # on the host; `evaluate` is the device part. (A method without `held_out` evaluates on
    # anchor lists, as DynamicRubric does.)
    held_out: ClassVar[type[ExpertRows]] = ExpertRows
    rollout_labels: ClassVar[Mapping[str, str]] = {"induce": "induced responses"}
    round_config: ClassVar[type[GenRubricConfig]] = GenRubricConfig

    def check_config(self, config: Any) -> None:
        rc = self.round_config.from_tree(config.round.to_dict())
        # A training round's check, not the type's: evaluation writes one greedy rubric with
        # this config (`held_out_write`).
        if rc.num_rubrics < 2:
            raise ValueError("config.round.num_rubrics must be >= 2 for GenRubric (each group's "
                             "induced response is judged by the other groups), got "
                             f"{rc.num_rubrics}")
        if config.data.gold:
            raise ValueError("config.data.gold: GenRubric's policy answers while shown a rubric, "
                             "so it has no gold evaluation; its held-out agreement with expert "
                             "rubrics (data.eval) is the watch's gold metric (watch.gold)")
        for key, value in (("oracle", config.oracle), ("generator.explorer",
                                                       config.generator.explorer)):
            if value:
                raise ValueError(f"config.{key} is supported by the dynamic_rubric method only")
        eval_prompts = (config.data.eval_batch_size or config.data.batch_size
                        if config.data.eval else None)
        b, g, n = config.data.batch_size, rc.num_rubrics, rc.induced_responses
        check_micro_batches(rc, {Role.GENERATOR: b, Role.POLICY: b * g},
                            {Role.GENERATOR: (b * g, g), Role.POLICY: (b * g * n, n)},
                            eval_prompts)

    def check_round(self, config, oracle_reward):
        """Refuses an oracle: GenRubric always rewards the policy by rubric scores."""
        if oracle_reward is not None:
            raise ValueError("GenRubric rewards the policy by rubric scores: give no oracle")

    def round(self, setup, state, frozen, batch, rng):
        return genrubric_round(setup, state, frozen, batch, rng)

    def evaluate(self, setup, state, frozen, batch, rng):
        return genrubric_evaluation(setup, state, frozen, batch, rng)

    def templates(self, config, tokenizer, *, max_items, chat_template_kwargs=None,
                  style="full"):
        kwargs = dict(chat_template_kwargs) if chat_template_kwargs else None
        return {
            "generator": tpl.genrubric_generator_template(
                tokenizer, max_items=max_items, chat_template_kwargs=kwargs, style=style),
            "verifier": tpl.verifier_template(tokenizer, kwargs, style),
            "induced": tpl.induced_response_template(tokenizer, kwargs, style)}

    def template_messages(self, config, *, max_items, style="full"):
        mark = tpl.slot_marker
        return {
            "generator": (tpl.genrubric_generator_messages(mark("prompt"), max_items=max_items,
                                                           style=style), ("prompt",)),
            "verifier": verifier_messages(style),
            "induced": (tpl.induced_response_messages(mark("prompt"), mark("rubric"),
                                                      style=style), ("rubric", "prompt"))}


GENRUBRIC = GenRubric()
