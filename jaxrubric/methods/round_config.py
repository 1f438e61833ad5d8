"""The round's settings, one typed record per concern: what every round shares (`RoundConfig`),
one `RoleConfig` per trained role (`RoundConfig.policy`, `.generator`), and each method's own
settings, which the method declares as a subclass (`DynamicRubricConfig`, `GenRubricConfig`).
A training config's `round` section is one of these as nested `ml_collections`
(`jaxrubric.config`): a key is what the dataclass declares, no more, and each distinct value
compiles once."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Collection, Mapping
from typing import Any, ClassVar

import numpy as np

from jaxrubric.methods.data import RunSwitches
from jaxrubric.rl import grpo
from jaxrubric.roles import Role

# RoleConfig.kl: the KL a role's beta weighs.
KL_KINDS = ("sampled", "forward")


@dataclasses.dataclass(frozen=True)
class RoleConfig:
    """What the round knows of a trained role beyond its weights (its LoRA and checkpoints are
    the model's: `config.<role>`)."""

    temperature: float = 1.0  # of its samples
    beta: float = 0.01  # the weight of its KL to its reference
    # Which KL `beta` weighs (`KL_KINDS`): "sampled" (`RoundConfig.kl_estimator`'s estimate of
    # KL(role || reference) on the tokens it sampled) or "forward" (KL(reference || role) over
    # the whole vocabulary at each sampled position, `grpo.token_logprobs_chunked`): it rises as
    # the role stops writing a token its reference writes, which the sampled estimate never
    # sees; it costs the reference's hidden states, kept for the update's steps.
    kl: str = "sampled"
    # Entropy bonus (`grpo.grpo_loss`'s entropy_coef, over the whole vocabulary at each sampled
    # position): keeps probability on what the role has stopped sampling, which GRPO, rewarded
    # only for what is sampled, cannot bring back by itself.
    entropy: float = 0.0
    # How its rewards become advantages (`grpo.ADVANTAGE_MODES`). "no_std" makes the policy's
    # step follow the size of its score gaps, not only their order: an evaluator whose gaps
    # close stops teaching (the toy world's policy).
    advantage_mode: str = "group_std"
    freeze: bool = False  # skip its update this run (the stale-evaluator ablation)

    CHOICES: ClassVar[Mapping[str, Collection[str]]] = {
        "kl": KL_KINDS, "advantage_mode": grpo.ADVANTAGE_MODES}

    def __post_init__(self) -> None:
        if self.entropy < 0:
            raise ValueError(f"entropy must be >= 0, got {self.entropy}")


@dataclasses.dataclass(frozen=True)
class RoundConfig:
    """The settings every round has; a method's config subclasses it with its own."""

    num_rubrics: int = 4  # G
    response_tokens: int = 64  # policy max_new_tokens (static output length)
    top_p: float | None = None
    policy: RoleConfig = dataclasses.field(default_factory=RoleConfig)
    generator: RoleConfig = dataclasses.field(default_factory=RoleConfig)
    # GRPO, both roles
    kl_estimator: str = "k3"
    eps_low: float = 0.2
    eps_high: float = 0.2
    aggregation: str = "token-mean"
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
    soft_verdicts: bool = False  # rewards from p_yes instead of 0/1 verdicts
    # The roles' `freeze` (and DynamicRubric's `policy_reward`) as runtime inputs of the
    # compiled round (`Frozen.switches`) instead of its shape: a frozen role keeps its optimiser
    # state and KL reference and its update is skipped by `lax.cond`, so runs that differ only
    # in them (a toy world's compared runs and its generators' own rounds) compile one program
    # and share it through the compilation cache. Costs a frozen role's optimiser state and
    # reference in memory; a skipped update's metrics come back as zeros. Colocated only.
    runtime_switches: bool = False

    CHOICES: ClassVar[Mapping[str, Collection[str]]] = {
        "kl_estimator": grpo.KL_ESTIMATORS, "aggregation": grpo.LOSS_AGGREGATIONS}

    def __post_init__(self) -> None:
        if self.eval_micro_batches < 0:
            raise ValueError("eval_micro_batches must be >= 0 (0: rollout_micro_batches), "
                             f"got {self.eval_micro_batches}")
        for name in ("num_rubrics", "response_tokens", "num_updates", "logprob_chunk",
                     "update_micro_batches", "rollout_micro_batches"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name, allowed in self.choices().items():
            value = self._leaf(name)
            if value not in allowed:
                raise ValueError(f"{name} {value!r} is not one of {sorted(allowed)}")

    @property
    def roles(self) -> dict[Role, RoleConfig]:
        """The trained roles' records by role."""
        return {Role.POLICY: self.policy, Role.GENERATOR: self.generator}

    @property
    def oracle_rewards(self) -> bool:
        """Whether a ground truth rewards the policy (DynamicRubric's `policy_reward`)."""
        return False

    def for_evaluation(self) -> RoundConfig:
        """This config as the held-out evaluation runs it (`eval_micro_batches`)."""
        return dataclasses.replace(
            self, rollout_micro_batches=self.eval_micro_batches or self.rollout_micro_batches)

    def frozen(self, role: Role) -> bool:
        """Whether a role skips its update this run (the verifier is always frozen)."""
        return role == Role.VERIFIER or self.roles[role].freeze

    def compiled_out(self, role: Role) -> bool:
        """Whether the role's update is left out of the compiled round: it is frozen, and not
        kept in behind a runtime switch (`runtime_switches`)."""
        return self.frozen(role) and (role == Role.VERIFIER or not self.runtime_switches)

    def needs_reference(self, role: Role) -> bool:
        """Whether a role's update has a KL term, so the round needs its frozen reference."""
        return self.roles[role].beta > 0 and not self.compiled_out(role)

    def switches(self) -> RunSwitches:
        """This run's `RunSwitches` (host booleans; `Frozen.switches` holds them on device)."""
        return RunSwitches(np.bool_(not self.policy.freeze), np.bool_(not self.generator.freeze),
                           np.bool_(self.oracle_rewards))

    @classmethod
    def choices(cls) -> dict[str, Collection[str]]:
        """Every string setting, dotted (`policy.kl`), and the names it accepts."""
        out: dict[str, Collection[str]] = {}
        for klass in reversed(cls.__mro__):
            out.update(vars(klass).get("CHOICES", {}))
        for name, hint in _hints(cls).items():
            if hint is RoleConfig:
                out.update({f"{name}.{key}": allowed
                            for key, allowed in RoleConfig.CHOICES.items()})
            elif typing.get_origin(hint) is typing.Literal:
                out[name] = typing.get_args(hint)
        return out

    @classmethod
    def declared(cls) -> dict[str, Any]:
        """Every setting, dotted (`policy.beta`), and its declared type."""
        out = {}
        for name, hint in _hints(cls).items():
            if hint is RoleConfig:
                out.update({f"{name}.{key}": sub for key, sub in _hints(RoleConfig).items()})
            else:
                out[name] = hint
        return out

    @classmethod
    def from_tree(cls, tree: Mapping[str, Any]) -> RoundConfig:
        """The config of a nested mapping (a `round` section's `to_dict()`)."""
        values = dict(tree)
        for name, value in tree.items():
            if isinstance(value, Mapping):
                try:
                    values[name] = RoleConfig(**value)
                except ValueError as err:  # named by its role: `policy.entropy must be ...`
                    raise ValueError(f"{name}.{err}") from None
        return cls(**values)

    def _leaf(self, dotted: str) -> Any:
        value = self
        for part in dotted.split("."):
            value = getattr(value, part)
        return value


def _hints(cls: type) -> dict[str, Any]:
    """A dataclass's fields and their types (ClassVars left out)."""
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in typing.get_type_hints(cls).items() if k in names}
