"""What both methods' rounds share: their config, data types, setup, rubric writing,
verification, the jitted round builders, batch encoding and the stages' shapes (the GRPO role
updates, which build on these types, are `update.py`).

A round (docs/design.md, §1) is a pure function `round(setup, state, frozen, batch, rng, run)`
of typed pytrees, written as stages `run(role, stage, *args)` (`jaxrubric.placement`): jitted
whole it is one program, on sub-meshes one program per stage. `RoundSetup` holds what is
static (graph definitions, token templates, the grammar, optimisers); `make_round_step` returns
the jitted `round_step(state, batch, rng) -> (state, RoundResult)` with the state donated.
Policy, generator and verifier share one tokenizer: responses are spliced into the generator's
and the verifier's prompts as token ids.

Each method (`dynamic_rubric.py`, `genrubric.py`) is a `Method`: its checks, its setup, its
round in data-flow order, its held-out evaluation and a description of its stages' shapes
(`RoundShapes`), which FLOPs, `jaxrubric plan` and the micro-batch checks read.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Literal, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from jaxrubric import placement, sampling
from jaxrubric import sharding as shd
from jaxrubric.models.transformer import Decoder
from jaxrubric.rewards.dynamic_rubric import DISC_MODES, GENERATOR_COMBINES
from jaxrubric.rewards.genrubric import SPREADS
from jaxrubric.rl import grpo
from jaxrubric.roles import TRAINED, Role
from jaxrubric.rubric import grammar as grammar_lib
from jaxrubric.rubric import templates as tpl
from jaxrubric.rubric import verifier as ver

PyTree = Any

# RoundConfig.policy_kl / generator_kl: the KL a role's beta weighs.
KL_KINDS = ("sampled", "forward")


# ------------------------------------------------------------------------------ config
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


# ------------------------------------------------------------------------------ data
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
    policy_ref: nnx.State | None = None  # the KL reference, when policy_beta > 0 (full FT)
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


# ------------------------------------------------------------------------------ setup
@dataclasses.dataclass(frozen=True, eq=False)
class RoleSpec:
    """What a round knows of a role: its graph definition and, when trained, its optimiser,
    KL coefficient and whether its update is left out of the round (`compiled_out`)."""

    graph: Any
    optimizer: optax.GradientTransformation | None = None
    beta: float = 0.0
    compiled_out: bool = True
    kl: str = "sampled"  # RoundConfig.kl
    entropy: float = 0.0  # RoundConfig.entropy: the entropy bonus


@dataclasses.dataclass(frozen=True, eq=False)
class RoundSetup:
    """Everything static about a round: built once on the host from the tokenizer."""

    config: RoundConfig
    graphs: Mapping[Role, Any]  # every role's graph definition
    optimizers: Mapping[Role, optax.GradientTransformation]  # the trained roles'
    generator_template: tpl.TokenTemplate
    verifier_template: tpl.TokenTemplate
    readout: ver.VerifierReadout
    grammar: grammar_lib.RubricGrammar
    stop_token_ids: tuple[int, ...]
    pad_id: int
    # GenRubric: the prompt under which the policy answers while shown a rubric.
    induced_template: tpl.TokenTemplate | None = None
    # `oracle_reward(response_tokens [B, K, L], response_len [B, K], question) -> [B, K]`: the
    # ground-truth reward of `policy_reward="oracle"` (a toy world provides one); jittable.
    oracle_reward: Callable[..., jax.Array] | None = None

    @property
    def roles(self) -> dict[Role, RoleSpec]:
        """Each role's spec, its KL coefficient and frozen flag read from `config` (so a setup
        with another config, `dataclasses.replace(setup, config=...)`, is consistent)."""
        return {role: RoleSpec(self.graphs[role], self.optimizers.get(role),
                               self.config.beta(role) if role in TRAINED else 0.0,
                               self.config.compiled_out(role), self.config.kl(role),
                               self.config.entropy(role) if role in TRAINED else 0.0)
                for role in Role}

    def graph(self, role: Role) -> Any:
        return self.graphs[role]


Models = Mapping[Role, Decoder]
Optimizers = Mapping[Role, optax.GradientTransformation]


def setup_fields(config: RoundConfig, tokenizer: Any, models: Models, optimizers: Optimizers,
                 chat_template_kwargs: Mapping[str, Any] | None = None,
                 template_style: str = "full") -> dict[str, Any]:
    """What every method's setup takes from the shared tokenizer and the three models."""
    sizes = [models[r].config.vocab_size for r in Role]
    if len(set(sizes)) != 1 or sizes[0] < len(tokenizer):
        raise ValueError(f"policy, generator and verifier must share the tokenizer's vocabulary "
                         f"({len(tokenizer)} tokens); their vocab sizes are {sizes}")
    kwargs = dict(chat_template_kwargs) if chat_template_kwargs else None
    verifier_template = tpl.verifier_template(tokenizer, kwargs, template_style)
    stops = set(models[Role.POLICY].config.eos_token_ids)
    if tokenizer.eos_token_id is not None:
        stops.add(tokenizer.eos_token_id)
    return dict(
        config=config, graphs={role: nnx.graphdef(models[role]) for role in Role},
        optimizers={role: optimizers[role] for role in TRAINED},
        verifier_template=verifier_template,
        readout=ver.verifier_readout(tokenizer, verifier_template),
        stop_token_ids=tuple(sorted(stops)),
        pad_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0,
    )


def init_state(setup: RoundSetup, models: Models) -> RoundState:
    """The trainable state: both trained models' parameters and optimiser states (None for a
    role whose update the round leaves out: it never steps), round 0."""
    # Scalars (optimiser counts, the round counter) go on their role's mesh, replicated, so the
    # state that comes out of a round has the shardings of the one that went in: no recompiles.
    roles = {}
    replicated = {}
    for role in TRAINED:
        params = nnx.state(models[role], trainable(models[role]))
        replicated[role] = NamedSharding(jax.tree.leaves(params)[0].sharding.mesh,
                                         PartitionSpec())
        opt_state = None if setup.roles[role].compiled_out else jax.tree.map(
            lambda x, r=replicated[role]: x if isinstance(x.sharding, NamedSharding)
            else jax.device_put(x, r), setup.roles[role].optimizer.init(params))
        roles[role] = RoleState(params, opt_state)
    return RoundState(roles[Role.POLICY], roles[Role.GENERATOR],
                      jax.device_put(jnp.zeros((), jnp.int32), replicated[Role.POLICY]))


# ------------------------------------------------------------------------------ rollouts
def write_rubrics(setup: RoundSetup, generator: Decoder, gen_input: tpl.Packed,
                  rng: jax.Array, explorer: Decoder | None = None
                  ) -> tuple[sampling.SampleResult, grammar_lib.ParsedRubric]:
    """The generator samples G grammar-constrained rubrics per (left-padded) prompt, parsed;
    with `RoundConfig.explorer_rubrics` m > 0 it samples G - m and `explorer` the last m."""
    cfg = setup.config
    explored = cfg.explorer_rubrics

    def write(model: Decoder, count: int, key: jax.Array) -> sampling.SampleResult:
        return sampling.sample(
            model, gen_input.tokens, gen_input.mask, gen_input.lengths, key,
            num_samples=count, max_new_tokens=setup.grammar.max_rubric_tokens,
            temperature=cfg.generator_temperature, grammar=setup.grammar,
            micro_batches=cfg.rollout_micro_batches)

    rubrics = write(generator, cfg.num_rubrics - explored, rng)
    if explored:
        if explorer is None:
            raise ValueError("round.explorer_rubrics > 0 needs the explorer's weights "
                             "(Frozen.generator_explorer)")
        extra = write(explorer, explored, jax.random.fold_in(rng, _EXPLORER_STREAM))
        rubrics = jax.tree.map(lambda a, b: jnp.concatenate([a, b], axis=1), rubrics, extra)
    return rubrics, grammar_lib.parse_rubric_tokens(rubrics.tokens, setup.grammar, setup.pad_id)


# The explorer's sampling stream, apart from the generator's.
_EXPLORER_STREAM = 0xE4B1


def explorer_groups(config: RoundConfig) -> jax.Array:
    """`[G]`: True for the rubrics the explorer writes (the last `explorer_rubrics`)."""
    return jnp.arange(config.num_rubrics) >= config.num_rubrics - config.explorer_rubrics


def text_lengths(samples: sampling.SampleResult) -> jax.Array:
    """Sampled lengths without the stop token (what a template splices in)."""
    return samples.lengths - samples.finished.astype(jnp.int32)


def judge(setup: RoundSetup, verifier: Decoder, question: Question, answers: jax.Array,
          answer_len: jax.Array, parsed: grammar_lib.ParsedRubric, item_valid: jax.Array
          ) -> jax.Array:
    """Verdicts `[B, N, G, M]` of answers `[B, N, L]` under every valid item: one tree forward
    per (question, answer); 0/1, or p_yes with `soft_verdicts`."""
    prefix = ver.verifier_prefix(setup.verifier_template, question.tokens, question.lengths,
                                 answers, answer_len, pad_id=setup.pad_id)
    out = ver.verify(verifier, setup.readout, prefix.tokens, prefix.lengths, parsed.items,
                     parsed.item_lengths, item_valid, pad_id=setup.pad_id,
                     micro_batches=setup.config.rollout_micro_batches)
    return out.p_yes if setup.config.soft_verdicts else out.verdicts.astype(jnp.float32)


# ------------------------------------------------------------------------------ programs
RoundFn = Callable[..., tuple[RoundState, RoundResult]]


def round_program(setup: RoundSetup, round_fn: RoundFn, state_shardings: PyTree
                  ) -> Callable[[RoundState, Frozen, RoundBatch, jax.Array],
                                tuple[RoundState, RoundResult]]:
    """The jitted round `(state, frozen, batch, rng) -> (state, result)` for a state with these
    shardings (concrete or abstract: `jaxrubric plan` compiles the same program): the state
    donated and its shardings kept, frozen weights arguments (not constants), scalars
    replicated, outputs where the program leaves them."""
    mesh = jax.tree.leaves(state_shardings)[0].mesh
    replicated = NamedSharding(mesh, PartitionSpec())
    return jax.jit(
        shd.traced_in(lambda state, frozen, batch, rng: round_fn(setup, state, frozen, batch,
                                                                 rng), mesh),
        donate_argnums=(0,),
        out_shardings=(state_shardings, RoundResult(scalars=replicated, outputs=None)))


def make_round_step(setup: RoundSetup, frozen: Frozen, round_fn: RoundFn
                    ) -> Callable[[RoundState, RoundBatch, jax.Array],
                                  tuple[RoundState, RoundResult]]:
    """`round_program` with the frozen weights bound, built at the first call from that
    state's shardings."""
    compiled: dict[str, Any] = {}

    def round_step(state, batch, rng):
        if "jitted" not in compiled:
            compiled["jitted"] = round_program(setup, round_fn,
                                               jax.tree.map(lambda x: x.sharding, state))
            round_step.jitted = compiled["jitted"]  # exposes the compilation cache to tests
        return compiled["jitted"](state, frozen, batch, rng)

    return round_step


def make_submesh_round_step(setup: RoundSetup, frozen: Frozen, run: placement.SubMeshes,
                            round_fn: RoundFn
                            ) -> Callable[[RoundState, RoundBatch, jax.Array],
                                          tuple[RoundState, RoundResult]]:
    """The round with each role on its own sub-mesh: one program per stage (`run`), each
    role's state donated to its update and kept on its mesh. Same signature and results as
    `make_round_step`; its metrics live on the meshes that computed them."""

    def round_step(state, batch, rng):
        return round_fn(setup, state, frozen, batch, rng, run)

    round_step.placement = run  # exposes the stages' compilation caches to tests
    return round_step


# ------------------------------------------------------------------------------ batches
def encode_batch(tokenizer: Any, questions: list[str], anchors: list[list[str]], *,
                 prompt_tokens: int, policy_tokens: int, anchor_tokens: int,
                 num_anchors: int, anchor_ranks: list[list[int]] | None = None) -> RoundBatch:
    """Host side: questions and best-first anchor answers (with their reference ranks, ties
    allowed; None: strictly ordered) -> the round's fixed-shape batch (NumPy arrays).
    Anything longer than its budget is an error naming the row, never cut."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    b = len(questions)
    question = Question(np.full((b, prompt_tokens), pad, np.int32), np.zeros((b,), np.int32))
    policy = PolicyPrompt(np.full((b, policy_tokens), pad, np.int32),
                          np.zeros((b, policy_tokens), bool), np.zeros((b,), np.int32))
    anchor = Anchors(np.full((b, num_anchors, anchor_tokens), pad, np.int32),
                     np.zeros((b, num_anchors), np.int32), np.zeros((b, num_anchors), bool),
                     np.zeros((b, num_anchors), np.int32))

    def fit(ids, limit, what, row):
        if len(ids) > limit:
            raise ValueError(f"row {row}: {what} has {len(ids)} tokens, the budget is {limit}")
        if not ids:
            raise ValueError(f"row {row}: {what} is empty")
        return ids

    for i, text in enumerate(questions):
        ids = fit(tokenizer(text, add_special_tokens=False)["input_ids"], prompt_tokens,
                  "prompt", i)
        question.tokens[i, :len(ids)] = ids
        question.lengths[i] = len(ids)
        chat = tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                             add_generation_prompt=True, tokenize=False)
        ids = fit(tokenizer(chat, add_special_tokens=False)["input_ids"], policy_tokens,
                  "chat-formatted prompt", i)
        policy.tokens[i, policy_tokens - len(ids):] = ids
        policy.mask[i, policy_tokens - len(ids):] = True
        policy.lengths[i] = len(ids)
        if len(anchors[i]) > num_anchors:
            raise ValueError(f"row {i}: {len(anchors[i])} anchor answers, at most {num_anchors}")
        ranks = list(range(1, len(anchors[i]) + 1)) if anchor_ranks is None else anchor_ranks[i]
        if list(ranks) != sorted(ranks) or len(ranks) != len(anchors[i]):
            raise ValueError(f"row {i}: anchor ranks {list(ranks)} must be one per answer, "
                             "best-first (sorted)")
        for j, answer in enumerate(anchors[i]):
            ids = fit(tokenizer(answer, add_special_tokens=False)["input_ids"], anchor_tokens,
                      f"anchor answer {j}", i)
            anchor.tokens[i, j, :len(ids)] = ids
            anchor.lengths[i, j] = len(ids)
            anchor.mask[i, j] = True
            anchor.ranks[i, j] = ranks[j]
    return RoundBatch(question, policy, anchor)


# ------------------------------------------------------------------------------ shapes
class RoundDims(NamedTuple):
    """The static lengths a round's shapes follow from, besides its `RoundConfig`: the batch's
    array widths, the grammar's and the templates' constant lengths."""

    batch: int  # B prompts
    question: int  # Lq
    policy_prompt: int  # Lp, the chat-formatted policy prompt (DynamicRubric)
    anchors: int  # n anchor answers per prompt
    anchor_len: int  # La
    rubric: int  # the grammar's longest rubric (sampled rubric tokens)
    items: int  # M item slots per rubric
    item_tokens: int  # Li
    generator_constant: int  # the generator template's constant tokens
    verifier_head: int  # the verifier template's constant tokens before the response slot
    readout_suffix: int  # the verifier's answer suffix after each item
    induced_constant: int = 0  # GenRubric's induced-response template's constant tokens


def round_dims(setup: RoundSetup, batch_shapes: Mapping[str, tuple[int, ...]]) -> RoundDims:
    """The dims of `setup`'s round on a batch whose arrays have these shapes (`question`
    `[B, Lq]`, `policy` `[B, Lp]`, `anchors` `[B, n, La]`)."""
    batch, question = batch_shapes["question"]
    _, anchors, anchor_len = batch_shapes["anchors"]
    grammar = setup.grammar
    return RoundDims(
        batch=batch, question=question, policy_prompt=batch_shapes["policy"][1],
        anchors=anchors, anchor_len=anchor_len, rubric=grammar.max_rubric_tokens,
        items=grammar.max_items, item_tokens=grammar.max_item_tokens,
        generator_constant=setup.generator_template.constant_length,
        verifier_head=setup.verifier_template.head(2).constant_length,
        readout_suffix=len(setup.readout.suffix),
        induced_constant=(0 if setup.induced_template is None
                          else setup.induced_template.constant_length))


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
    of `branch_len` tokens (the tree forward of `rubric.verifier.verify`)."""

    name: str
    rows: int
    prefix_len: int
    branches: int
    branch_len: int

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
    """What a stage reads from another role's mesh: per prompt, and replicated (bytes)."""

    source: Role
    what: str
    bytes_per_prompt: int
    bytes_replicated: int = 0


class RoundShapes(NamedTuple):
    """The stages of one round in the order they run, with their global shapes: the one
    description FLOPs (`plan.flops`), memory plans and micro-batch checks read."""

    sampling: tuple[Sampling, ...]
    verification: tuple[Verification, ...]
    updates: tuple[Update, ...]  # the roles this run trains, generator first
    reads: Mapping[str, tuple[Read, ...]]  # stage key (`plan` names) -> inputs it reads


def sample_row_bytes(length: int) -> int:
    """One sample of `sampling.SampleResult`: int32 tokens, float32 log-probs and sampling
    log-probs, an int32 length and a bool `finished`."""
    return 12 * length + 5


def parsed_row_bytes(dims: RoundDims) -> int:
    """One rubric of `grammar.ParsedRubric`: int32 item tokens, lengths and weights, bool
    validity per item, an int32 item per rubric token and a bool `complete`."""
    m, li = dims.items, dims.item_tokens
    return 4 * m * li + 9 * m + 4 * dims.rubric + 1


def batch_row_bytes(dims: RoundDims) -> int:
    """One row of `encode_batch`'s arrays: int32 tokens and lengths, bool masks."""
    return (4 * (dims.question + 1) + 5 * dims.policy_prompt + 4
            + anchor_row_bytes(dims))


def question_row_bytes(dims: RoundDims) -> int:
    """One row of a `Question`: int32 tokens and length."""
    return 4 * (dims.question + 1)


def anchor_row_bytes(dims: RoundDims) -> int:
    """One row of `Anchors`: int32 tokens, lengths and ranks, a bool mask per answer."""
    return dims.anchors * (4 * dims.anchor_len + 4 + 1 + 4)


def config_dims(config: Any, method: Method,
                templates: Mapping[str, tpl.TokenTemplate] | None = None) -> RoundDims:
    """The dims of a training config's round (`ml_collections`): its data widths, the grammar
    of `method`'s weights and, when given, the templates' constant lengths (else 0: enough for
    checks that count rows)."""
    d, r = config.data, config.rubric

    def constant(name: str, head: int | None = None) -> int:
        if templates is None or name not in templates:
            return 0
        template = templates[name] if head is None else templates[name].head(head)
        return template.constant_length

    return RoundDims(
        batch=d.batch_size, question=d.prompt_tokens, policy_prompt=d.policy_tokens,
        anchors=d.num_anchors, anchor_len=d.anchor_tokens,
        rubric=grammar_lib.max_rubric_tokens(method.weights, r.max_items, r.max_item_tokens),
        items=r.max_items, item_tokens=r.max_item_tokens,
        generator_constant=constant("generator"), verifier_head=constant("verifier", 2),
        readout_suffix=0 if templates is None else len(templates["verifier"].segments[-1]),
        induced_constant=constant("induced"))


def check_micro_batches(config: RoundConfig, shapes: RoundShapes,
                        eval_prompts: int | None = None) -> None:
    """Micro-batches split rows into equal static shapes: `update_micro_batches` must divide
    every update's rows, `rollout_micro_batches` every rollout's prompts (the training batch's
    and, when there is one, the held-out batch's `eval_prompts`: `eval_micro_batches` when
    set)."""
    checks = [("update_micro_batches", u.micro_batch_units(config),
               f"the {u.role} update's {'prompts (share_prefix)' if u.shared(config) else 'rows'}")
              for u in shapes.updates]
    checks += [("rollout_micro_batches", s.prompts, f"the {s.role}'s rollout prompts")
               for s in shapes.sampling]
    if eval_prompts is not None:
        checks.append(("eval_micro_batches" if config.eval_micro_batches
                       else "rollout_micro_batches", eval_prompts,
                       "the held-out prompts (data.eval_batch_size)"))
    for key, rows, what in checks:
        count = getattr(config, key)
        if rows % count:
            raise ValueError(f"config.round.{key}={count} must divide {what}, {rows}")


def verifier_messages(style: str) -> tuple[list[dict[str, str]], tuple[str, ...]]:
    """The verifier template as messages with slot markers, and its slots (both methods')."""
    mark = tpl.slot_marker
    return (tpl.verifier_messages(mark("prompt"), mark("response"), mark("criterion"),
                                  style=style), ("prompt", "response", "criterion"))


def trained_updates(cfg: RoundConfig, rows: Mapping[Role, tuple[int, ...]]
                    ) -> tuple[Update, ...]:
    """The `Update`s the compiled round holds, generator first, from `role -> (rows,
    prompt_len, completion_len[, group])`: the roles this run trains, and with
    `runtime_switches` a frozen role's too (its update is compiled and skipped at run time, so
    it takes memory and fixes micro-batch shapes but does no work: `flops` leaves it out)."""
    return tuple(Update(role, *rows[role]) for role in TRAINED if not cfg.compiled_out(role))


# ------------------------------------------------------------------------------ methods
class Method(abc.ABC):
    """A co-evolution method: everything that differs between DynamicRubric and GenRubric.

    The registry (`jaxrubric.methods`) maps `config.method` to one instance; training, FLOPs,
    plans and the toy world ask it, and nothing else reads `config.method`.
    """

    name: ClassVar[str]
    weights: ClassVar[tuple[int, ...]]  # the rubric grammar's item weights
    evaluates: ClassVar[bool]  # whether the method has a held-out evaluation
    # Its held-out data when it is not anchor lists (GenRubric: expert-rubric rows): a type
    # with `from_config(config, tokenizer)` (`jaxrubric.eval.expert_agreement.ExpertRows`).
    held_out: ClassVar[Any] = None

    def check_config(self, config: Any) -> None:
        """The method's own checks of a training config (`ml_collections`), before any model
        loads; raises ValueError naming the key. Default: none."""

    def check_round(self, config: RoundConfig,
                    oracle_reward: Callable[..., jax.Array] | None) -> None:
        """The method's checks of a round config (and of the oracle it is given), when its
        setup is built; raises ValueError. Default: none."""

    def build_setup(self, config: RoundConfig, tokenizer: Any, models: Models, *,
                    optimizers: Optimizers, max_items: int, max_item_tokens: int,
                    chat_template_kwargs: Mapping[str, Any] | None = None,
                    template_style: str = "full",
                    oracle_reward: Callable[..., jax.Array] | None = None) -> RoundSetup:
        """Templates, the grammar of the method's weights and answer ids from the shared
        tokenizer; graphs from the models."""
        self.check_round(config, oracle_reward)
        templates = self.templates(config, tokenizer, max_items=max_items,
                                   chat_template_kwargs=chat_template_kwargs,
                                   style=template_style)
        return RoundSetup(
            generator_template=templates["generator"],
            grammar=grammar_lib.build_rubric_grammar(
                tokenizer, weights=self.weights, max_items=max_items,
                max_item_tokens=max_item_tokens),
            induced_template=templates.get("induced"), oracle_reward=oracle_reward,
            **setup_fields(config, tokenizer, models, optimizers, chat_template_kwargs,
                           template_style))

    @abc.abstractmethod
    def round(self, setup: RoundSetup, state: RoundState, frozen: Frozen, batch: RoundBatch,
              rng: jax.Array, run: placement.Placement | None = None
              ) -> tuple[RoundState, RoundResult]:
        """One round (pure; `make_round_step` jits it)."""

    def evaluate(self, setup: RoundSetup, state: RoundState, frozen: Frozen,
                 batch: RoundBatch, rng: jax.Array, run: placement.Placement | None = None
                 ) -> dict[str, jax.Array]:
        """Held-out metrics of the current models, no update."""
        raise NotImplementedError(f"{self.name} has no held-out evaluation")

    @abc.abstractmethod
    def templates(self, config: RoundConfig, tokenizer: Any, *, max_items: int,
                  chat_template_kwargs: Mapping[str, Any] | None = None,
                  style: str = "full") -> dict[str, tpl.TokenTemplate]:
        """The round's templates by name (`generator`, `verifier`, and `induced` where the
        method has one), tokenised as its setup builds them."""

    @abc.abstractmethod
    def template_messages(self, config: RoundConfig, *, max_items: int, style: str = "full"
                          ) -> dict[str, tuple[list[dict[str, str]], tuple[str, ...]]]:
        """The same templates as chat messages with slot markers, and their slots in order:
        for estimating their lengths without a tokenizer (`jaxrubric plan`)."""

    @abc.abstractmethod
    def round_shapes(self, config: RoundConfig, dims: RoundDims) -> RoundShapes:
        """Every stage of the round with its global shapes, in the order the round runs."""
