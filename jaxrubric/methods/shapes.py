"""A round's stages and their global shapes, read from the stages themselves: the round traced on
abstract inputs (`jax.eval_shape`, never run) under a placement that notes each stage it calls,
what goes in and what comes out (`traced_shapes`). Its rollouts, verifier passes and updates,
and what each stage reads from another role's devices, are what FLOPs (`jaxrubric.flops`) and
`jaxrubric plan` count: a stage added or changed reaches them with no description beside it."""

from __future__ import annotations

import contextvars
import inspect
import math
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax

from jaxrubric import placement, sampling
from jaxrubric.methods.data import Frozen, PolicyPrompt, RoundBatch, RoundState
from jaxrubric.methods.round_config import RoundConfig
from jaxrubric.roles import TRAINED, Role
from jaxrubric.rubric import templates as tpl


class Sampling(NamedTuple):
    """A sampling stage: `samples` continuations of each of `prompts` prompts."""

    role: Role
    name: str
    prompts: int
    samples: int
    prompt_len: int
    new_tokens: int


class Verification(NamedTuple):
    """A verifier pass: per row a prefix of `prefix_len` tokens and `branches` item branches
    of `branch_len` tokens (the tree forward of `rubric.verifier.verify`), each branch's
    answer position projected onto `readout_tokens` tokens (the readout's yes and no ids)."""

    name: str
    rows: int
    prefix_len: int
    branches: int
    branch_len: int
    readout_tokens: int

    @property
    def length(self) -> int:
        return self.prefix_len + self.branches * self.branch_len


class Update(NamedTuple):
    """A trained role's GRPO update over `rows` sampled sequences after their prompts; `group`
    rows share one prompt (encoded once with `share_prefix`; 1: a prompt per row)."""

    role: Role
    rows: int
    prompt_len: int
    completion_len: int
    group: int = 1

    def shared(self, config: RoundConfig) -> bool:
        """Whether this update encodes each prompt once under its `group` rows."""
        return config.share_prefix and self.group > 1

    def micro_batch_units(self, config: RoundConfig) -> int:
        """What update micro-batches split: prompts when shared, else rows."""
        return self.rows // self.group if self.shared(config) else self.rows


class Read(NamedTuple):
    """What a stage reads from another role's devices, by its parameters' names: bytes per
    prompt of the batch (arrays with a row per prompt) and replicated (the rest)."""

    source: Role
    what: str
    bytes_per_prompt: int
    bytes_replicated: int = 0


class RoundShapes(NamedTuple):
    """The stages of one round in the order they run, with their global shapes."""

    sampling: tuple[Sampling, ...]
    verification: tuple[Verification, ...]
    updates: tuple[Update, ...]  # the roles the compiled round updates, generator first
    reads: Mapping[tuple[Role, int], tuple[Read, ...]]  # stage program (role, keep) -> reads


_PASSES: contextvars.ContextVar[list[Verification] | None] = contextvars.ContextVar(
    "passes", default=None)


def verified(name: str, rows: int, prefix_len: int, branches: int, branch_len: int,
             readout_tokens: int) -> None:
    """Notes a verifier pass while a round is traced for its shapes (else nothing): the passes
    run inside a stage, so its inputs and outputs alone do not show them."""
    passes = _PASSES.get()
    if passes is not None:
        passes.append(Verification(name, rows, prefix_len, branches, branch_len,
                                   readout_tokens))


class _StageCall(NamedTuple):
    role: Role
    stage: str
    keep: int
    args: tuple[Any, ...]
    out: Any


def _prompt(tree: Any) -> tpl.Packed | PolicyPrompt | None:
    """The first prompt (`Packed` or `PolicyPrompt`) in `tree`."""
    found = [x for x in jax.tree.leaves(tree, is_leaf=_is_prompt) if _is_prompt(x)]
    return found[0] if found else None


def _is_prompt(x: Any) -> bool:
    return isinstance(x, (tpl.Packed, PolicyPrompt))


def _rows(x: Any) -> int:
    return math.prod(x.shape[:-1])


def _nbytes(x: Any) -> int:
    return math.prod(x.shape) * x.dtype.itemsize


class _Tracer:
    """A `placement.Placement` that runs each stage inline, notes its call, skips the updates
    (`keep` stages: their inputs are their shapes, their state comes back as it went in) and
    remembers which role's devices each array lives on."""

    def __init__(self) -> None:
        self.calls: list[_StageCall] = []
        self.home: dict[int, Role] = {}
        self.held: list[Any] = []  # what `home` names stays alive, so no id is reused
        self.read: dict[tuple[Role, int], dict[int, tuple[str, Role, Any]]] = {}

    def hold(self, role: Role, *trees: Any) -> None:
        """`trees`' arrays live on `role`'s devices."""
        for leaf in jax.tree.leaves(trees):
            self.home[id(leaf)] = role
            self.held.append(leaf)

    def __call__(self, role: Role, stage: Callable[..., Any], setup: Any, *args: Any,
                 keep: int = 0) -> Any:
        names = list(inspect.signature(stage).parameters)[1:]
        for name, arg in zip(names, args):
            for leaf in jax.tree.leaves(arg):
                # A value computed between stages lives where the batch and the key do.
                source = self.home.get(id(leaf), Role.POLICY)
                if source != role:
                    self.read.setdefault((role, keep), {}).setdefault(
                        id(leaf), (name, source, leaf))
        out = (*args[:keep], {}) if keep else stage(setup, *args)
        self.hold(role, out)
        self.calls.append(_StageCall(role, getattr(stage, "__name__", ""), keep, args, out))
        return out

    def reads(self, prompts: int) -> dict[tuple[Role, int], tuple[Read, ...]]:
        """Per stage program, what it reads from each other role: per prompt and replicated."""
        out = {}
        for program, read in self.read.items():
            by_source: dict[Role, list[tuple[str, Any]]] = {}
            for name, source, leaf in read.values():
                by_source.setdefault(source, []).append((name, leaf))
            out[program] = tuple(_read(source, leaves, prompts)
                                 for source, leaves in by_source.items())
        return out


def _read(source: Role, leaves: list[tuple[str, Any]], prompts: int) -> Read:
    per_prompt = replicated = 0
    for _, leaf in leaves:
        if leaf.ndim and leaf.shape[0] == prompts:
            per_prompt += _nbytes(leaf) // prompts
        else:
            replicated += _nbytes(leaf)
    return Read(source, ", ".join(dict.fromkeys(name for name, _ in leaves)), per_prompt,
                replicated)


def _sampling(call: _StageCall, labels: Mapping[str, str]) -> Sampling | None:
    """The rollout of a stage that samples: its `SampleResult` after its prompt (one it
    returns, else one it is given)."""
    found = [x for x in jax.tree.leaves(call.out, is_leaf=_is_sample) if _is_sample(x)]
    prompt = _prompt(call.out) or _prompt(call.args)
    if not found or prompt is None:
        return None
    samples, prompts = found[0].tokens, _rows(prompt.tokens)
    label = labels.get(call.stage)
    return Sampling(call.role, f"{call.role} rollout" + (f" ({label})" if label else ""),
                    prompts, _rows(samples) // prompts, prompt.tokens.shape[-1],
                    samples.shape[-1])


def _is_sample(x: Any) -> bool:
    return isinstance(x, sampling.SampleResult)


def _update(call: _StageCall) -> Update:
    """A role's update from `methods.update.role_update`'s inputs: a prompt `[B, P]` under
    samples `[B, S, L]`, or a prompt per sample `[B, S, P]`."""
    prompt, samples = call.args[3], call.args[5].tokens
    group = samples.shape[1] if prompt.ndim == 2 else 1
    return Update(call.role, _rows(samples), prompt.shape[-1], samples.shape[-1], group)


def traced_shapes(round_fn: Callable[..., Any], setup: Any, state: RoundState, frozen: Frozen,
                  batch: RoundBatch, rng: Any, labels: Mapping[str, str] | None = None
                  ) -> RoundShapes:
    """The shapes of `round_fn(setup, state, frozen, batch, rng)` (a `Method.round`) on inputs of
    these shapes (arrays or `jax.ShapeDtypeStruct`s), traced, never run. `labels`: stage name
    -> what its rollout samples, when a role has more than one kind (`Method.rollout_labels`).
    Reads are counted as training places the inputs (`train.CoevolveTask`): the batch and the
    key with the policy, each role's weights with it."""
    tracer = _Tracer()
    passes: list[Verification] = []

    def traced(state: RoundState, frozen: Frozen, batch: RoundBatch, rng: Any) -> None:
        tracer.hold(Role.POLICY, batch, rng, state.policy, state.round, frozen.policy_ref,
                    frozen.policy_base, frozen.switches)
        tracer.hold(Role.GENERATOR, state.generator, frozen.generator_ref,
                    frozen.generator_base, frozen.generator_explorer)
        tracer.hold(Role.VERIFIER, frozen.verifier)
        with placement.running(tracer):
            round_fn(setup, state, frozen, batch, rng)

    token = _PASSES.set(passes)
    try:
        jax.eval_shape(traced, state, frozen, batch, rng)
    finally:
        _PASSES.reset(token)
    rollouts = [_sampling(c, labels or {}) for c in tracer.calls if not c.keep]
    updates = {c.role: _update(c) for c in tracer.calls if c.keep}
    return RoundShapes(tuple(s for s in rollouts if s is not None), tuple(passes),
                       tuple(updates[r] for r in TRAINED if r in updates),
                       tracer.reads(batch.question.tokens.shape[0]))


def check_micro_batches(config: RoundConfig, rollout_prompts: Mapping[Role, int],
                        updates: Mapping[Role, tuple[int, int]],
                        eval_prompts: int | None = None) -> None:
    """Micro-batches split rows into equal static shapes: `update_micro_batches` must divide
    every update's rows (`role -> (rows, group)`: prompts with `share_prefix`),
    `rollout_micro_batches` every rollout's prompts (the training batch's and, when there is
    one, the held-out batch's `eval_prompts`: `eval_micro_batches` when set)."""
    checks = []
    for role, (rows, group) in updates.items():
        if config.compiled_out(role):
            continue
        shared = config.share_prefix and group > 1
        checks.append(("update_micro_batches", rows // group if shared else rows,
                       f"the {role} update's {'prompts (share_prefix)' if shared else 'rows'}"))
    checks += [("rollout_micro_batches", prompts, f"the {role}'s rollout prompts")
               for role, prompts in rollout_prompts.items()]
    if eval_prompts is not None:
        checks.append(("eval_micro_batches" if config.eval_micro_batches
                       else "rollout_micro_batches", eval_prompts,
                       "the held-out prompts (data.eval_batch_size)"))
    for key, rows, what in checks:
        count = getattr(config, key)
        if rows % count:
            raise ValueError(f"config.round.{key}={count} must divide {what}, {rows}")
