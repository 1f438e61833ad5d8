"""The round's typed data: the batch it reads, the state it trains, the weights it only reads and
what it returns. Every one a pytree of arrays, so a round is a pure function of them
(docs/design.md, section 1)."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from jaxrubric.models.transformer import Decoder
from jaxrubric.roles import Role

PyTree = Any


class Question(NamedTuple):
    """The plain question, spliced into the templates."""

    tokens: jax.Array  # [B, Lq] right-padded
    lengths: jax.Array  # [B]


class PolicyPrompt(NamedTuple):
    """The chat-formatted prompt the policy answers (DynamicRubric)."""

    tokens: jax.Array  # [B, Lp] left-padded
    mask: jax.Array  # [B, Lp] real tokens
    lengths: jax.Array  # [B]


class Anchors(NamedTuple):
    """Reference answers sorted best-first with their ranks (DynamicRubric's anchor reward and
    evaluation); equal ranks tie and make no preference pair."""

    tokens: jax.Array  # [B, n, La] right-padded
    lengths: jax.Array  # [B, n]
    mask: jax.Array  # [B, n] listed answers
    ranks: jax.Array  # [B, n] int32, 1 = best


class RoundBatch(NamedTuple):
    """One round's fixed-shape batch (`encode_batch`); GenRubric reads the question only."""

    question: Question
    policy: PolicyPrompt
    anchors: Anchors


class RoleState(NamedTuple):
    """A trained role's trainable parameters (all of them, or its LoRA adapters only) and
    optimiser state (None while the run freezes it)."""

    params: nnx.State
    opt_state: PyTree | None


class RoundState(NamedTuple):
    """The trainable state of a run: what a checkpoint holds besides the data position."""

    policy: RoleState
    generator: RoleState
    round: jax.Array  # int32 scalar, rounds completed

    def role(self, role: Role) -> RoleState:
        return self.policy if role == Role.POLICY else self.generator


class RunSwitches(NamedTuple):
    """What a run of `round.runtime_switches` decides at runtime, boolean scalars: whether each
    trained role steps, and whether the policy is rewarded by the oracle."""

    train_policy: jax.Array
    train_generator: jax.Array
    oracle_reward: jax.Array

    def trains(self, role: Role) -> jax.Array:
        return self.train_policy if role == Role.POLICY else self.train_generator


class Frozen(NamedTuple):
    """Weights a round reads and never updates: arguments of the program, not constants (and,
    with `round.runtime_switches`, the run's `RunSwitches`)."""

    verifier: nnx.State
    policy_ref: nnx.State | None = None  # the KL reference, when its beta > 0 (full FT)
    generator_ref: nnx.State | None = None  # likewise for the generator
    # A LoRA role's base weights (in its compute dtype): the adapters' frozen part, and its KL
    # reference too (the base with the adapters off), so no second copy is held.
    policy_base: nnx.State | None = None
    generator_base: nnx.State | None = None
    switches: RunSwitches | None = None
    # The weights that write `RoundConfig.explorer_rubrics` of each prompt's rubrics (the
    # generator's architecture, full weights).
    generator_explorer: nnx.State | None = None

    def reference(self, role: Role) -> nnx.State | None:
        return self.policy_ref if role == Role.POLICY else self.generator_ref

    def base(self, role: Role) -> nnx.State | None:
        return self.policy_base if role == Role.POLICY else self.generator_base


def trainable(model: Decoder) -> type[nnx.Variable]:
    """What a trained role learns: its LoRA adapters when it has them, else every weight."""
    return nnx.LoRAParam if model.config.lora is not None else nnx.Param


def base_weights(model: Decoder) -> nnx.State | None:
    """A LoRA role's frozen base weights, in its compute dtype (the forward casts to it
    anyway, so the outputs are the same; bf16 compute halves an fp32 base); None without
    LoRA."""
    if model.config.lora is None:
        return None
    compute = jnp.dtype(model.config.dtype)
    return jax.tree.map(lambda x: x.astype(compute) if compute.itemsize < x.dtype.itemsize
                        else x, nnx.state(model, nnx.All(nnx.Param, nnx.Not(nnx.LoRAParam))))


def role_weights(state: RoundState, frozen: Frozen, role: Role) -> nnx.State:
    """Every weight of a trained role as the round runs it: base and adapters together for a
    LoRA role (`nnx.merge(graph, ...)` builds the adapted model), else its parameters."""
    params = state.role(role).params
    base = frozen.base(role)
    return params if base is None else nnx.merge_state(base, params)


class RoundResult(NamedTuple):
    """What a round returns beside the new state: scalar metrics (replicated, logged every
    round) and the method's outputs (left where they were computed; fetched only to write a
    text sample)."""

    scalars: dict[str, jax.Array]
    outputs: Any  # the method's outputs NamedTuple: responses, response_len, rubrics, ...

