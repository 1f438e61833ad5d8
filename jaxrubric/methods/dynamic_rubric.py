"""DynamicRubric: the generator writes rubrics for the policy's own answer set, and both co-evolve.

One round (docs/design.md, §1 and §6), stage by stage as `dynamic_rubric_round` calls them
(each on its role's devices, `jaxrubric.placement`), its random keys planned in `round_keys`:

1. **respond** (policy): K answers per prompt;
2. **write** (generator): shown the prompt and that answer set (or, the static baseline, the
   prompt alone), G weighted rubrics, grammar-constrained and parsed on device;
3. **judge** (verifier): every answer and every anchor answer under every item, one
   tree-masked forward per answer, and their scores `sum(w v) / sum(w)`;
4. **reward** (verifier): the generator's reward (discriminability over the set + anchor
   ranking) and the policy's (the scores), and both roles' advantages;
5. **update** (`methods.update`): GRPO on the generator's rubric tokens, then on the policy's
   answers.

`evaluate` runs stages 1-4 on a held-out batch without updates."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from typing import Any, ClassVar, Literal, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from jaxrubric import placement, sampling
from jaxrubric.methods.data import (Anchors, Frozen, PolicyPrompt, Question, RoundBatch,
                                    RoundResult, RoundState, role_weights)
from jaxrubric.methods.method import Method, verifier_messages
from jaxrubric.methods.round_config import RoundConfig
from jaxrubric.methods.setup import RoundSetup
from jaxrubric.methods.shapes import check_micro_batches
from jaxrubric.methods.gold import GoldBatch
from jaxrubric.methods.keys import EXPLORER_STREAM, RoundKey, update_keys
from jaxrubric.methods.steps import Rubrics, judge_answers, text_lengths, write_rubrics
from jaxrubric.methods.update import UpdateInputs, update
from jaxrubric.rewards import credit, telemetry
from jaxrubric.rewards.dynamic_rubric import (DISC_MODES, GENERATOR_COMBINES,
                                              dynamic_rubric_rewards, generator_advantages,
                                              item_rewards, preference_pairs)
from jaxrubric.rl import grpo
from jaxrubric.roles import Role
from jaxrubric.rubric import grammar as grammar_lib
from jaxrubric.rubric import templates as tpl
from jaxrubric.rubric.scores import dynamic_rubric_score, genrubric_score

# ------------------------------------------------------------------------------ settings
@dataclasses.dataclass(frozen=True)
class DynamicRubricConfig(RoundConfig):
    """DynamicRubric's round: the shared settings and its own."""

    num_responses: int = 8  # K answers per prompt
    anchor_weight: float = 1.0  # lambda
    disc_mode: str = "item_variance"  # `rewards.dynamic_rubric.discriminability`
    # How the generator's two rewards combine: "advantage" (the paper's: each reward
    # normalised over the prompt's G rubrics, then adv(disc) + anchor_weight adv(anchor)), or
    # "reward" (one advantage of disc + anchor_weight anchor). Invalid rubrics rank last in both.
    generator_combine: str = "advantage"
    # Which rubric scores the policy: the mean over valid groups, or the group the generator's
    # reward ranks best (the sharpest evaluator of this round).
    policy_score: Literal["mean", "best_group"] = "mean"
    # "dynamic": the generator sees the prompt and the K responses; "static": the prompt alone,
    # the baseline DynamicRubric claims to beat (same rewards, same updates).
    rubric_source: Literal["dynamic", "static"] = "dynamic"
    # "rubric": the policy is rewarded by rubric scores; "oracle": by the setup's ground-truth
    # reward (a toy world's checker), the ceiling the rubric runs are compared with.
    policy_reward: Literal["rubric", "oracle"] = "rubric"
    # Of the G rubrics per prompt, the last `explorer_rubrics` are written by a fixed explorer
    # (`config.generator.explorer`, e.g. the generator's SFT cold start). They are judged and
    # rewarded with the group, and the generator learns from them as from its own (off-policy:
    # their old log-probs are the generator's own, so the ratio starts at 1, and no KL term),
    # but they never score the policy. Items the generator has stopped writing still reach its
    # rewards this way; GRPO on its own samples never sees them again.
    explorer_rubrics: int = 0
    # Item-level credit on the generator's item tokens, this coefficient times each item's own
    # advantage (`rewards.dynamic_rubric.item_rewards`: its discriminability and anchor ranking
    # as a one-item rubric, normalised over the prompt's items) added to its rubric's. A
    # rubric's reward cannot say which of its items earned it.
    item_credit: float = 0.0

    CHOICES: ClassVar[Mapping[str, Collection[str]]] = {
        "disc_mode": DISC_MODES, "generator_combine": GENERATOR_COMBINES}

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.num_responses < 2:
            raise ValueError(f"num_responses must be >= 2 (GRPO needs a group), got "
                             f"{self.num_responses}")
        if not 0 <= self.explorer_rubrics < self.num_rubrics:
            raise ValueError(f"explorer_rubrics must be in [0, num_rubrics) (the generator "
                             f"writes the others), got {self.explorer_rubrics} of "
                             f"{self.num_rubrics}")
        if self.item_credit < 0:
            raise ValueError(f"item_credit must be >= 0, got {self.item_credit}")

    @property
    def oracle_rewards(self) -> bool:
        return self.policy_reward == "oracle"


def explorer_groups(config: DynamicRubricConfig) -> jax.Array:
    """`[G]`: True for the rubrics the explorer writes (the last `explorer_rubrics`)."""
    return jnp.arange(config.num_rubrics) >= config.num_rubrics - config.explorer_rubrics


def shown_responses(config: DynamicRubricConfig) -> int:
    """How many responses the generator sees: all K, or none for the static baseline."""
    return 0 if config.rubric_source == "static" else config.num_responses


# ------------------------------------------------------------------------------ keys
class Keys(NamedTuple):
    """A round's random keys, one per stage that draws."""

    respond: RoundKey
    write: RoundKey
    explore: RoundKey  # the explorer's rubrics (`explorer_rubrics`)
    update: dict[Role, RoundKey]  # each trained role's LoRA dropout


def round_keys(rng: jax.Array) -> Keys:
    """The round's key plan: every key its stages draw, from the round's key."""
    key = RoundKey(rng)
    respond_key, write_key = key.split()
    return Keys(respond_key, write_key, write_key.fold_in(EXPLORER_STREAM), update_keys(key))


# ------------------------------------------------------------------------------ stages
@placement.stage(Role.POLICY)
def respond(setup: RoundSetup, policy_params: nnx.State, prompt: PolicyPrompt, key: RoundKey
            ) -> tuple[sampling.SampleResult, jax.Array]:
    """Stage 1 (policy): K answers per prompt `[B, K, Lr]` and their lengths without the stop
    token."""
    cfg = setup.config
    responses = sampling.sample(
        nnx.merge(setup.graph(Role.POLICY), policy_params), prompt.tokens, prompt.mask,
        prompt.lengths, key.draw(), num_samples=cfg.num_responses,
        max_new_tokens=cfg.response_tokens, temperature=cfg.policy.temperature, top_p=cfg.top_p,
        stop_token_ids=setup.stop_token_ids, micro_batches=cfg.rollout_micro_batches)
    return responses, text_lengths(responses)


def generator_input(setup: RoundSetup, question: Question, responses: sampling.SampleResult,
                    text_len: jax.Array) -> tpl.Packed:
    """The generator's left-padded prompts: the question and the responses its template shows
    (all K, or none for the static rubric)."""
    shown = len(setup.generator_template.slots) - 1
    return tpl.assemble(
        setup.generator_template,
        [question.tokens, *(responses.tokens[:, k] for k in range(shown))],
        [question.lengths, *(text_len[:, k] for k in range(shown))],
        pad_id=setup.pad_id, align="right")


@placement.stage(Role.GENERATOR)
def write(setup: RoundSetup, generator_params: nnx.State, question: Question,
          responses: sampling.SampleResult, text_len: jax.Array, key: RoundKey,
          explorer: tuple[nnx.State, RoundKey] | None = None) -> Rubrics:
    """Stage 2 (generator): it sees the prompt and the whole response set (or, static, the
    prompt alone) and writes G rubrics, parsed at the token level; with `explorer` (its
    weights and key) the last `explorer_rubrics` of them are the explorer's, shown the same
    input."""
    explored = setup.config.explorer_rubrics
    if explored and explorer is None:
        raise ValueError("round.explorer_rubrics > 0 needs the explorer's weights "
                         "(Frozen.generator_explorer)")
    graph = setup.graph(Role.GENERATOR)
    explore = (None if not explored else
               (nnx.merge(graph, explorer[0]), explored, explorer[1].draw()))
    return write_rubrics(setup, nnx.merge(graph, generator_params),
                         generator_input(setup, question, responses, text_len), key.draw(),
                         explore)


class Judged(NamedTuple):
    """What the judge stage computes: verdicts and the scores they give."""

    verdicts: jax.Array  # [B, K, G, M] (p_yes with soft_verdicts)
    anchor_verdicts: jax.Array  # [B, n, G, M]
    scores: jax.Array  # [B, K, G] rubric scores of the responses
    anchor_scores: jax.Array  # [B, n, G] rubric scores of the anchor answers


@placement.stage(Role.VERIFIER)
def judge(setup: RoundSetup, verifier_params: nnx.State, question: Question, anchors: Anchors,
          responses: sampling.SampleResult, text_len: jax.Array,
          parsed: grammar_lib.ParsedRubric) -> Judged:
    """Stage 3 (verifier): every response and every anchor answer judged under every item,
    one tree-masked forward per answer, and scored by every rubric, `sum(w v) / sum(w)`."""
    verifier = nnx.merge(setup.graph(Role.VERIFIER), verifier_params)
    verdicts = judge_answers(setup, verifier, question, responses.tokens, text_len, parsed,
                             parsed.valid, "responses")  # [B, K, G, M]
    anchor_verdicts = judge_answers(setup, verifier, question, anchors.tokens, anchors.lengths,
                                    parsed, parsed.valid, "anchors")  # [B, n, G, M]
    weights = parsed.weights.astype(jnp.float32)
    scores, _ = dynamic_rubric_score(verdicts, weights[:, None], parsed.valid[:, None])
    anchor_scores, _ = dynamic_rubric_score(anchor_verdicts, weights[:, None],
                                            parsed.valid[:, None])
    return Judged(verdicts, anchor_verdicts, scores, anchor_scores)


class Rewards(NamedTuple):
    """What the reward stage computes."""

    group_valid: jax.Array  # [B, G]
    scoring: jax.Array  # [B, G] the valid groups that score answers: the generator's own
    generator_reward: jax.Array  # [B, G] J_disc + anchor_weight J_anchor
    rubric_reward: jax.Array  # [B, K] the responses' score under this round's evaluator
    policy_reward: jax.Array  # [B, K] rubric_reward, or the oracle's with policy_reward=oracle
    oracle_reward: jax.Array | None  # [B, K] ground truth, when the setup has an oracle
    generator_advantages: jax.Array  # [B, G] the rubrics'
    item_advantages: jax.Array | None  # [B, G, M] with item_credit (times it), else None
    # What the generator's update learns from: `generator_advantages`, or with `item_credit`
    # per token `[B, G, L]`, each item token adding its item's advantage.
    generator_update_advantages: jax.Array
    policy_advantages: jax.Array  # [B, K]
    metrics: dict[str, jax.Array]  # the rollout's scalar summaries, telemetry's included
    judgement: telemetry.Judgement  # what the telemetry and the cards read


def mean_valid_score(scores: jax.Array, group_valid: jax.Array) -> jax.Array:
    """Scores `[B, N, G]` averaged over the valid groups `[B, G]` -> `[B, N]`."""
    return grpo.masked_mean(scores, group_valid[:, None, :], axis=-1)


@placement.stage(Role.VERIFIER)
def reward(setup: RoundSetup, question: Question, anchors: Anchors,
           responses: sampling.SampleResult, text_len: jax.Array,
           rubrics: sampling.SampleResult, parsed: grammar_lib.ParsedRubric, judged: Judged,
           use_oracle: jax.Array | None = None) -> Rewards:
    """Stage 4 (verifier): both roles' rewards and their group advantages from the judged
    rollout: the generator's (discriminability over the set + anchor ranking, with item credit
    per token), the policy's (the scores of this round's evaluator, or the oracle's).
    `use_oracle`: the run's runtime switch (`RunSwitches.oracle_reward`) in place of
    `policy_reward`."""
    cfg = setup.config
    verdicts = judged.verdicts
    gen_reward, parts = dynamic_rubric_rewards(
        verdicts.transpose(0, 2, 1, 3), parsed.weights.astype(jnp.float32), parsed.valid,
        judged.anchor_scores.transpose(0, 2, 1), lam=cfg.anchor_weight,
        anchor_mask=anchors.mask, anchor_ranks=anchors.ranks, disc_mode=cfg.disc_mode)
    group_valid = parts["group_valid"] & parsed.complete
    # Invalid rubrics rank below every valid one in each normalisation (no fixed penalty is
    # below every reward: a valid rubric that reverses the anchors scores J_anchor ~ -1.06).
    gen_advantages = generator_advantages(
        parts["disc"], parts["anchor"], group_valid, lam=cfg.anchor_weight,
        combine=cfg.generator_combine, mode=cfg.generator.advantage_mode)

    item_adv, item_metrics, update_advantages = None, {}, gen_advantages
    if cfg.item_credit:
        item_mask = parsed.valid & group_valid[..., None]
        item_disc, item_anchor = item_rewards(
            verdicts.transpose(0, 2, 1, 3), judged.anchor_verdicts.transpose(0, 2, 1, 3),
            item_mask, anchor_mask=anchors.mask, anchor_ranks=anchors.ranks)
        item_adv = cfg.item_credit * (
            credit.item_advantages(item_disc, item_mask, mode=cfg.generator.advantage_mode)
            + cfg.anchor_weight * credit.item_advantages(
                item_anchor, item_mask, mode=cfg.generator.advantage_mode))
        item_metrics = {"generator/item_discriminability": grpo.masked_mean(item_disc, item_mask),
                        "generator/item_anchor": grpo.masked_mean(item_anchor, item_mask)}
        update_advantages = credit.token_level_advantages(gen_advantages, item_adv,
                                                          parsed.token_item)
    # The explorer's rubrics only teach the generator: the evaluator is the generator's own.
    explored = explorer_groups(cfg)
    scoring = group_valid & ~explored
    if cfg.policy_score == "best_group":  # the rubric the generator's advantage ranks first
        best = jnp.argmax(jnp.where(scoring, gen_advantages, -jnp.inf), axis=-1)
        rubric_reward = jnp.take_along_axis(judged.scores, best[:, None, None], axis=2)[..., 0]
    else:
        rubric_reward = mean_valid_score(judged.scores, scoring)
    oracle = (None if setup.oracle_reward is None
              else setup.oracle_reward(responses.tokens, text_len, question))
    if use_oracle is not None and oracle is not None:
        policy_reward = jnp.where(use_oracle, oracle, rubric_reward)
    else:
        policy_reward = oracle if cfg.policy_reward == "oracle" else rubric_reward
    judgement = telemetry.Judgement(
        verdicts, parsed.weights, parsed.valid, group_valid, parsed.complete, parsed.items,
        parsed.item_lengths, policy_reward, jnp.ones(policy_reward.shape, bool), text_len,
        oracle, rubric_reward)
    metrics = {
        **telemetry.round_telemetry(judgement, rubrics.lengths),
        "policy/reward": policy_reward.mean(),
        "policy/reward_std_in_group": policy_reward.std(-1).mean(),
        "policy/response_length": responses.lengths.mean(),
        "policy/truncated": 1.0 - responses.finished.mean(),
        "generator/reward": grpo.masked_mean(gen_reward, group_valid),
        "generator/discriminability": grpo.masked_mean(parts["disc"], group_valid),
        "generator/anchor": grpo.masked_mean(parts["anchor"], group_valid),
        "rubric/valid_rate": group_valid.mean(),
        "rubric/items": parsed.valid.sum(-1).mean(),
        "rubric/tokens": rubrics.lengths.mean(),
        "verifier/yes_rate": grpo.masked_mean(verdicts, parsed.valid[:, None]),
        "tokens/generated": responses.lengths.sum() + rubrics.lengths.sum(),
        **item_metrics,
    }
    if cfg.explorer_rubrics:  # > 0: the explorer's rubrics beat the generator's own
        metrics["generator/explorer_advantage"] = grpo.masked_mean(
            gen_advantages, group_valid & explored)
        metrics["rubric/explorer_valid_rate"] = grpo.masked_mean(
            group_valid.astype(jnp.float32), jnp.broadcast_to(explored, group_valid.shape))
    return Rewards(group_valid, scoring, gen_reward, rubric_reward, policy_reward, oracle,
                   gen_advantages, item_adv, update_advantages,
                   grpo.group_advantages(policy_reward, mode=cfg.policy.advantage_mode), metrics,
                   judgement)


class Rollout(NamedTuple):
    """What one round produces before any update (also what evaluation reads)."""

    responses: sampling.SampleResult  # [B, K, Lr]
    text_len: jax.Array  # [B, K] response lengths without the stop token
    rubrics: Rubrics  # [B, G, Lrub], written after the generator's prompts [B, Lg]
    judged: Judged
    rewards: Rewards


def rollout(setup: RoundSetup, state: RoundState, frozen: Frozen, batch: RoundBatch,
            keys: Keys) -> Rollout:
    """Stages 1-4: responses, rubrics, verdicts and scores, both roles' rewards."""
    responses, text_len = respond(setup, role_weights(state, frozen, Role.POLICY), batch.policy,
                                  keys.respond)
    explorer = (None if frozen.generator_explorer is None
                else (frozen.generator_explorer, keys.explore))
    rubrics = write(setup, role_weights(state, frozen, Role.GENERATOR), batch.question,
                    responses, text_len, keys.write, explorer)
    judged = judge(setup, frozen.verifier, batch.question, batch.anchors, responses, text_len,
                   rubrics.parsed)
    use_oracle = None if frozen.switches is None else frozen.switches.oracle_reward
    rewards = reward(setup, batch.question, batch.anchors, responses, text_len, rubrics.samples,
                     rubrics.parsed, judged, use_oracle)
    return Rollout(responses, text_len, rubrics, judged, rewards)


class Outputs(NamedTuple):
    """A round's outputs beside its scalars (for text samples and rubric cards,
    `methods.cards`; fetched only on the rounds that write them)."""

    responses: jax.Array  # [B, K, Lr]
    response_len: jax.Array  # [B, K]
    rubrics: jax.Array  # [B, G, Lrub]
    rubric_len: jax.Array  # [B, G]
    scores: jax.Array  # [B, K, G]
    judgement: telemetry.Judgement
    policy_advantages: jax.Array  # [B, K]
    generator_reward: jax.Array  # [B, G]
    generator_advantages: jax.Array  # [B, G]
    item_reward: jax.Array | None = None  # items' own rewards: GenRubric's outputs have them


def dynamic_rubric_round(setup: RoundSetup, state: RoundState, frozen: Frozen,
                         batch: RoundBatch, rng: jax.Array) -> tuple[RoundState, RoundResult]:
    """One DynamicRubric co-evolution round (pure; `programs.make_round_step` jits it, and
    `placement.running` sets where its stages run).

    `frozen`: the verifier, and each trained role's KL reference when its beta > 0.
    """
    keys = round_keys(rng)
    out = rollout(setup, state, frozen, batch, keys)
    # 5. The generator learns from its rubric tokens (advantages within each prompt's G
    # rubrics), the policy from its responses, rewarded by the rubric scores.
    rubrics = out.rubrics
    new_state, update_metrics = update(setup, state, frozen, {
        Role.GENERATOR: UpdateInputs(
            rubrics.prompt.tokens, rubrics.prompt.mask, rubrics.samples,
            out.rewards.generator_update_advantages,
            jnp.broadcast_to(explorer_groups(setup.config), rubrics.samples.lengths.shape)
            if setup.config.explorer_rubrics else None),
        Role.POLICY: UpdateInputs(batch.policy.tokens, batch.policy.mask, out.responses,
                                  out.rewards.policy_advantages),
    }, keys.update)
    rewards = out.rewards
    outputs = Outputs(out.responses.tokens, out.text_len, rubrics.samples.tokens,
                      rubrics.samples.lengths, out.judged.scores, rewards.judgement,
                      rewards.policy_advantages, rewards.generator_reward,
                      rewards.generator_advantages)
    return new_state, RoundResult({**out.rewards.metrics, **update_metrics}, outputs)


# ------------------------------------------------------------------------------ evaluation
def pair_gaps(scores: jax.Array, better: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Over the pairs `better [B, N, N]` (i preferred to j), the mean score gap `s_i - s_j`
    (Δgap) and the share of pairs the scores `[B, N]` order the same way (ties count half)."""
    gap = scores[:, :, None] - scores[:, None, :]
    agree = jnp.where(gap > 0, 1.0, jnp.where(gap == 0, 0.5, 0.0))
    return grpo.masked_mean(gap, better), grpo.masked_mean(agree, better)


def clustered_gap_se(scores: jax.Array, better: jax.Array) -> jax.Array:
    """The standard error of `pair_gaps`' Δgap, clustered by question (a question's pairs
    share its answers): Δgap = sum_b g_b / sum_b n_b (g_b the b-th question's summed gaps, n_b
    its pairs), a ratio whose linearised variance is sum_b (g_b - Δgap n_b)^2 / (sum_b n_b)^2."""
    gap = scores[:, :, None] - scores[:, None, :]
    weight = better.astype(gap.dtype)
    g, n = jnp.sum(gap * weight, (1, 2)), jnp.sum(weight, (1, 2))
    total = jnp.maximum(n.sum(), 1.0)
    return jnp.sqrt(jnp.sum((g - g.sum() / total * n) ** 2)) / total


@placement.stage(Role.VERIFIER)
def held_out_metrics(setup: RoundSetup, anchors: Anchors, judged: Judged, rewards: Rewards
                     ) -> dict[str, jax.Array]:
    """The held-out metrics of a judged rollout (see `dynamic_rubric_evaluation`)."""
    del setup
    scores = mean_valid_score(judged.anchor_scores, rewards.scoring)  # [B, n]
    anchor_gap, anchor_accuracy = pair_gaps(scores, preference_pairs(anchors.ranks, anchors.mask))
    metrics = {
        "anchor_delta_gap": anchor_gap,
        "anchor_pair_accuracy": anchor_accuracy,
        "policy_score": mean_valid_score(judged.scores, rewards.scoring).mean(),
        "rubric_valid_rate": rewards.group_valid.mean(),
    }
    if rewards.oracle_reward is not None:
        # The paper's Δgap (its Eq. 2): on the current policy's own answers, pairs ordered by
        # the ground truth, scored by this round's evaluator (what the policy is rewarded by).
        quality = rewards.oracle_reward
        better = quality[:, :, None] > quality[:, None, :]
        metrics["delta_gap"], metrics["pair_accuracy"] = pair_gaps(rewards.rubric_reward, better)
        metrics["delta_gap_se"] = clustered_gap_se(rewards.rubric_reward, better)
        per_question = quality.mean(-1)
        metrics["quality"] = per_question.mean()
        # Clustered by question: the K answers to one question are not independent samples.
        metrics["quality_se"] = per_question.std() / jnp.sqrt(per_question.shape[0])
    return metrics


def dynamic_rubric_evaluation(setup: RoundSetup, state: RoundState, frozen: Frozen,
                              batch: RoundBatch, rng: jax.Array) -> dict[str, jax.Array]:
    """A round's rollout on a held-out batch, no update: `anchor_delta_gap` (the mean score
    difference of every better-worse pair of anchor answers under this round's rubrics, the
    signal the evaluator gives; ties make no pair) and `anchor_pair_accuracy`, the rubric
    scores of the policy's responses and, when the setup has an oracle, the policy's
    ground-truth `quality` (with its standard error over questions) and `delta_gap` (with
    `delta_gap_se`) / `pair_accuracy` on the policy's own answers ordered by that ground truth."""
    out = rollout(setup, state, frozen, batch, round_keys(rng))
    return held_out_metrics(setup, batch.anchors, out.judged, out.rewards)


@placement.stage(Role.VERIFIER)
def gold_scores(setup: RoundSetup, verifier_params: nnx.State, gold: GoldBatch,
                responses: sampling.SampleResult, text_len: jax.Array) -> jax.Array:
    """HealthBench's score `[B, K]` of each answer under its prompt's expert rubric (points of
    the criteria met over the positive points), the verifier judging every criterion as it
    judges a generated one."""
    verifier = nnx.merge(setup.graph(Role.VERIFIER), verifier_params)
    b = gold.items.shape[0]
    expert = grammar_lib.ParsedRubric(  # one rubric per prompt, always complete
        gold.items[:, None], gold.item_lengths[:, None], gold.weights[:, None],
        gold.valid[:, None], jnp.full((b, 1, 1), -1, jnp.int32), jnp.ones((b, 1), bool))
    verdicts = judge_answers(setup, verifier, gold.question, responses.tokens, text_len, expert,
                             expert.valid, "gold answers")  # [B, K, 1, M]
    scores, _ = genrubric_score(verdicts, gold.weights[:, None, None], gold.valid[:, None, None])
    return scores[..., 0]


def gold_evaluation(setup: RoundSetup, state: RoundState, frozen: Frozen, gold: GoldBatch,
                    rng: jax.Array) -> dict[str, jax.Array]:
    """The gold metric (`methods.gold`): the policy answers the gold prompts as in a round,
    each answer is scored under its prompt's expert rubric; `gold_score` is HealthBench's
    overall score (the mean over prompts of their answers' mean, clipped to [0, 1]) and
    `gold_score_se` its standard error over prompts."""
    responses, text_len = respond(setup, role_weights(state, frozen, Role.POLICY), gold.policy,
                                  round_keys(rng).respond)
    per_prompt = gold_scores(setup, frozen.verifier, gold, responses, text_len).mean(-1)
    return {"gold_score": jnp.clip(per_prompt.mean(), 0.0, 1.0),
            "gold_score_se": per_prompt.std() / jnp.sqrt(per_prompt.shape[0])}


# ------------------------------------------------------------------------------ the method
class DynamicRubric(Method):
    """DynamicRubric (see the module docstring)."""

    name: ClassVar[str] = "dynamic_rubric"
    weights: ClassVar[tuple[int, ...]] = grammar_lib.POSITIVE_WEIGHTS
    evaluates: ClassVar[bool] = True
    round_config: ClassVar[type[DynamicRubricConfig]] = DynamicRubricConfig

    def check_config(self, config: Any) -> None:
        if config.round.policy_reward == "oracle" and not config.oracle:
            raise ValueError("config.round.policy_reward='oracle' needs config.oracle")
        if bool(config.round.explorer_rubrics) != bool(config.generator.explorer):
            raise ValueError(
                "config.round.explorer_rubrics and config.generator.explorer go together: the "
                "explorer's checkpoint writes that many of each prompt's rubrics (got "
                f"{config.round.explorer_rubrics} and {config.generator.explorer!r})")
        if config.generator.explorer and config.generator.lora.rank:
            raise ValueError("config.generator.explorer: the explorer shares the generator's "
                             "model graph, so it needs a fully fine-tuned generator "
                             "(generator.lora.rank 0)")
        rc = self.round_config.from_tree(config.round.to_dict())
        eval_prompts = (config.data.eval_batch_size or config.data.batch_size
                        if config.data.eval or config.data.gold else None)
        b, k, g = config.data.batch_size, rc.num_responses, rc.num_rubrics
        check_micro_batches(rc, {Role.POLICY: b, Role.GENERATOR: b},
                            {Role.GENERATOR: (b * g, g), Role.POLICY: (b * k, k)}, eval_prompts)

    def check_round(self, config, oracle_reward):
        if config.policy_reward == "oracle" and oracle_reward is None:
            raise ValueError("policy_reward='oracle' needs an oracle_reward function")

    def round(self, setup, state, frozen, batch, rng):
        return dynamic_rubric_round(setup, state, frozen, batch, rng)

    def evaluate(self, setup, state, frozen, batch, rng):
        return dynamic_rubric_evaluation(setup, state, frozen, batch, rng)

    def gold_evaluate(self, setup, state, frozen, gold, rng):
        return gold_evaluation(setup, state, frozen, gold, rng)

    def templates(self, config, tokenizer, *, max_items, chat_template_kwargs=None,
                  style="full"):
        kwargs = dict(chat_template_kwargs) if chat_template_kwargs else None
        return {
            "generator": tpl.dynamic_rubric_generator_template(
                tokenizer, shown_responses(config), max_items=max_items,
                chat_template_kwargs=kwargs, style=style),
            "verifier": tpl.verifier_template(tokenizer, kwargs, style)}

    def template_messages(self, config, *, max_items, style="full"):
        mark = tpl.slot_marker
        responses = [f"response_{i}" for i in range(1, shown_responses(config) + 1)]
        return {
            "generator": (tpl.dynamic_rubric_generator_messages(
                mark("prompt"), [mark(r) for r in responses], max_items=max_items,
                style=style), ("prompt", *responses)),
            "verifier": verifier_messages(style)}


DYNAMIC_RUBRIC = DynamicRubric()
