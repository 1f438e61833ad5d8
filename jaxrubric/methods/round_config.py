"""The round's settings: one frozen dataclass, each distinct value compiled once (the
`round` section of a training config, `jaxrubric.config`)."""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import numpy as np

from jaxrubric.methods.data import RunSwitches
from jaxrubric.rewards.dynamic_rubric import DISC_MODES, GENERATOR_COMBINES
from jaxrubric.rewards.genrubric import SPREADS
from jaxrubric.rl import grpo
from jaxrubric.roles import Role

# RoundConfig.policy_kl / generator_kl: the KL a role's beta weighs.
KL_KINDS = ("sampled", "forward")

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
    # Which KL a role's beta weighs (`KL_KINDS`): "sampled" (`kl_estimator`'s estimate of
    # KL(role || reference) on the tokens it sampled) or "forward" (KL(reference || role) over
    # the whole vocabulary at each sampled position, `grpo.token_logprobs_chunked`): it rises as
    # the role stops writing a token its reference writes, which the sampled estimate never
    # sees; it costs the reference's hidden states, kept for the update's steps.
    policy_kl: str = "sampled"
    generator_kl: str = "sampled"
    # Entropy bonus per role (`grpo.grpo_loss`'s entropy_coef, over the whole vocabulary at
    # each sampled position): keeps probability on what the role has stopped sampling, which
    # GRPO, rewarded only for what is sampled, cannot bring back by itself.
    policy_entropy: float = 0.0
    generator_entropy: float = 0.0
    # DynamicRubric: of the G rubrics per prompt, the last `explorer_rubrics` are written by a
    # fixed explorer (`config.generator.explorer`, e.g. the generator's SFT cold start). They
    # are judged and rewarded with the group, and the generator learns from them as from its
    # own (off-policy: their old log-probs are the generator's own, so the ratio starts at 1,
    # and no KL term), but they never score the policy. Items the generator has stopped
    # writing still reach its rewards this way; GRPO on its own samples never sees them again.
    explorer_rubrics: int = 0
    # DynamicRubric: item-level credit on the generator's item tokens, this coefficient times
    # each item's own advantage (`rewards.dynamic_rubric.item_rewards`: its discriminability
    # and anchor ranking as a one-item rubric, normalised over the prompt's items) added to its
    # rubric's. A rubric's reward cannot say which of its items earned it.
    item_credit: float = 0.0
    eps_low: float = 0.2
    eps_high: float = 0.2
    aggregation: str = "token-mean"
    advantage_mode: str = "group_std"
    # The policy's own advantage mode ("": `advantage_mode`, the one both roles share by
    # default). "no_std" makes the policy's step follow the size of its score gaps, not only
    # their order: an evaluator whose gaps close stops teaching (the toy world's default).
    policy_advantage_mode: str = ""
    num_updates: int = 1  # mu
    logprob_chunk: int = 64
    # Memory: each GRPO update runs its rows through the model in this many micro-batches
    # (gradients summed, one optimiser step: the same step as the whole batch); each rollout
    # stage (sampling, verification) its prompts likewise. 1: all rows at once.
    update_micro_batches: int = 1
    rollout_micro_batches: int = 1
    # The held-out evaluation's rollout micro-batches (0: `rollout_micro_batches`). The same
    # samples and verdicts either way; a held-out batch many times the training batch samples
    # and verifies faster in pieces (the toy world's 256 prompts: 3.3 s in 32 against 4.8 s).
    eval_micro_batches: int = 0
    # Updates whose samples share one prompt (the policy's K answers, a generator's G rubrics)
    # run that prompt through the model once, its samples as branches attending to it
    # (`Decoder.shared_prefix_hidden`): the same log-probs and gradients (within float
    # rounding), without repeating the prompt per sample, so fewer FLOPs and activations (the
    # 8B DynamicRubric generator update: 3.22x fewer FLOPs). Update micro-batches then split
    # prompts, not rows: `update_micro_batches` must divide the batch's prompts, and should
    # leave each micro-batch at least one prompt per chip holding the batch (`jaxrubric plan`
    # notes it where not). False: a row per sample, its prompt repeated.
    share_prefix: bool = True
    # rewards
    anchor_weight: float = 1.0  # lambda
    disc_mode: str = "item_variance"
    soft_verdicts: bool = False  # rewards from p_yes instead of 0/1 verdicts
    # How DynamicRubric's two generator rewards combine: "advantage" (the paper's: each reward
    # normalised over the prompt's G rubrics, then adv(disc) + anchor_weight adv(anchor)), or
    # "reward" (one advantage of disc + anchor_weight anchor). Invalid rubrics rank last in both.
    generator_combine: str = "advantage"
    # GenRubric's reward coefficients (`rewards.genrubric.genrubric_rewards`): sequence reward
    # = comprehensiveness + group discrimination; item reward = discriminative +
    # non-redundant. The paper's ablation keeps comprehensiveness alone.
    comprehensiveness_coef: float = 1.0
    discrimination_coef: float = 1.0
    discriminative_coef: float = 0.5
    nonredundant_coef: float = 0.5
    # How group discrimination measures a rubric's spread over the induced responses
    # (`rewards.genrubric.group_discrimination`): "std", "range", or "pairs" (the share of
    # response pairs it scores apart, which a coarser rubric cannot raise).
    discrimination_spread: str = "std"
    # A control, not a method: GenRubric's generator rewards are shuffled among each query's
    # groups (and items) before they become advantages (`genrubric.generator_credit`), so an
    # agreement that rises anyway comes from sharpening the sampled distribution, not from
    # what the rewards say.
    shuffle_generator_credit: bool = False
    # GenRubric: the responses a query's G rubrics induce draw the same sampling noise (common
    # random numbers). Each response keeps its distribution, so every reward keeps its
    # expectation; where two rubrics leave the policy equally unsure (a requirement neither
    # states) their responses make the same choice, so the comparison among the query's
    # groups, which is all GRPO's advantages read, reflects what the rubrics say rather than
    # the policy's coin flips.
    induce_common_noise: bool = False
    # GenRubric: responses each rubric group induces (the paper: 1). Its rewards are averaged
    # over them, a Monte Carlo average of the same expectation with less of the policy's
    # sampling noise in each group's reward; the policy's advantages span a query's G x N
    # responses.
    induced_responses: int = 1
    # Which rubric scores the policy: the mean over valid groups, or the group the generator's
    # reward ranks best (the sharpest evaluator of this round).
    policy_score: Literal["mean", "best_group"] = "mean"
    freeze_generator: bool = False  # the stale-evaluator ablation
    freeze_policy: bool = False
    # The freeze flags and `policy_reward` as runtime inputs of the compiled round
    # (`Frozen.switches`) instead of its shape: a frozen role keeps its optimiser state and KL
    # reference and its update is skipped by `lax.cond`, so runs that differ only in them
    # (a toy world's compared runs and its generators' own rounds) compile one program and
    # share it through the compilation cache. Costs a frozen role's optimiser state and
    # reference in memory; a skipped update's metrics come back as zeros. Colocated only.
    runtime_switches: bool = False
    # "dynamic": the generator sees the prompt and the K responses (DynamicRubric); "static": the
    # prompt alone, the baseline DynamicRubric claims to beat (same rewards, same updates).
    rubric_source: Literal["dynamic", "static"] = "dynamic"
    # "rubric": the policy is rewarded by rubric scores; "oracle": by the setup's ground-truth
    # reward (a toy world's checker), the ceiling the rubric runs are compared with.
    policy_reward: Literal["rubric", "oracle"] = "rubric"

    def __post_init__(self) -> None:
        if self.eval_micro_batches < 0:
            raise ValueError("round config: eval_micro_batches must be >= 0 (0: "
                             f"rollout_micro_batches), got {self.eval_micro_batches}")
        for name in ("num_responses", "num_rubrics", "response_tokens", "num_updates",
                     "logprob_chunk", "update_micro_batches", "rollout_micro_batches",
                     "induced_responses"):
            if getattr(self, name) < 1:
                raise ValueError(f"round config: {name} must be >= 1, got {getattr(self, name)}")
        if self.num_responses < 2:
            raise ValueError("round config: num_responses must be >= 2 (GRPO needs a group)")
        if not 0 <= self.explorer_rubrics < self.num_rubrics:
            raise ValueError(f"round config: explorer_rubrics must be in [0, num_rubrics) (the "
                             f"generator writes the others), got {self.explorer_rubrics} of "
                             f"{self.num_rubrics}")
        for name in ("policy_entropy", "generator_entropy", "item_credit"):
            if getattr(self, name) < 0:
                raise ValueError(f"round config: {name} must be >= 0, got {getattr(self, name)}")
        for name, allowed in OPTIONS.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"round config: {name} {getattr(self, name)!r} is not one of "
                                 f"{sorted(allowed)}")

    def beta(self, role: Role) -> float:
        """The KL coefficient of a trained role."""
        return self.policy_beta if role == Role.POLICY else self.generator_beta

    def kl(self, role: Role) -> str:
        """Which KL the role's beta weighs (`KL_KINDS`)."""
        return self.policy_kl if role == Role.POLICY else self.generator_kl

    def advantages(self, role: Role) -> str:
        """How a role's rewards become advantages (`grpo.ADVANTAGE_MODES`)."""
        if role == Role.POLICY and self.policy_advantage_mode:
            return self.policy_advantage_mode
        return self.advantage_mode

    def entropy(self, role: Role) -> float:
        """The entropy bonus of a trained role."""
        return self.policy_entropy if role == Role.POLICY else self.generator_entropy

    def for_evaluation(self) -> RoundConfig:
        """This config as the held-out evaluation runs it (`eval_micro_batches`)."""
        return dataclasses.replace(
            self, rollout_micro_batches=self.eval_micro_batches or self.rollout_micro_batches)

    def needs_reference(self, role: Role) -> bool:
        """Whether a role's update has a KL term, so the round needs its frozen reference."""
        return self.beta(role) > 0 and not self.compiled_out(role)

    def frozen(self, role: Role) -> bool:
        """Whether a trained role skips its update this run (the verifier is always frozen)."""
        if role == Role.VERIFIER:
            return True
        return self.freeze_policy if role == Role.POLICY else self.freeze_generator

    def compiled_out(self, role: Role) -> bool:
        """Whether the role's update is left out of the compiled round: it is frozen, and not
        kept in behind a runtime switch (`runtime_switches`)."""
        return self.frozen(role) and (role == Role.VERIFIER or not self.runtime_switches)

    def switches(self) -> RunSwitches:
        """This run's `RunSwitches` (host booleans; `Frozen.switches` holds them on device)."""
        return RunSwitches(np.bool_(not self.freeze_policy), np.bool_(not self.freeze_generator),
                           np.bool_(self.policy_reward == "oracle"))


# The string options of a round and the names each accepts (registries where there is one).
OPTIONS: dict[str, Any] = {
    "kl_estimator": grpo.KL_ESTIMATORS,
    "policy_kl": KL_KINDS,
    "generator_kl": KL_KINDS,
    "aggregation": grpo.LOSS_AGGREGATIONS,
    "advantage_mode": grpo.ADVANTAGE_MODES,
    "policy_advantage_mode": ("", *grpo.ADVANTAGE_MODES),
    "disc_mode": DISC_MODES,
    "generator_combine": GENERATOR_COMBINES,
    "discrimination_spread": SPREADS,
    "policy_score": ("mean", "best_group"),
    "rubric_source": ("dynamic", "static"),
    "policy_reward": ("rubric", "oracle"),
}

