"""A round's stages and their global shapes, as each method describes them (`Method.round_shapes`):
what FLOPs (`jaxrubric.flops`), `jaxrubric plan` and the micro-batch checks read."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from jaxrubric.methods.round_config import RoundConfig
from jaxrubric.methods.setup import RoundSetup
from jaxrubric.roles import TRAINED, Role
from jaxrubric.rubric import grammar as grammar_lib
from jaxrubric.rubric import templates as tpl


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


def config_dims(config: Any, weights: Sequence[int],
                templates: Mapping[str, tpl.TokenTemplate] | None = None) -> RoundDims:
    """The dims of a training config's round (`ml_collections`): its data widths, the grammar
    of a method's rubric `weights` and, when given, the templates' constant lengths (else 0:
    enough for checks that count rows)."""
    d, r = config.data, config.rubric

    def constant(name: str, head: int | None = None) -> int:
        if templates is None or name not in templates:
            return 0
        template = templates[name] if head is None else templates[name].head(head)
        return template.constant_length

    return RoundDims(
        batch=d.batch_size, question=d.prompt_tokens, policy_prompt=d.policy_tokens,
        anchors=d.num_anchors, anchor_len=d.anchor_tokens,
        rubric=grammar_lib.max_rubric_tokens(weights, r.max_items, r.max_item_tokens),
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


def trained_updates(cfg: RoundConfig, rows: Mapping[Role, tuple[int, ...]]
                    ) -> tuple[Update, ...]:
    """The `Update`s the compiled round holds, generator first, from `role -> (rows,
    prompt_len, completion_len[, group])`: the roles this run trains, and with
    `runtime_switches` a frozen role's too (its update is compiled and skipped at run time, so
    it takes memory and fixes micro-batch shapes but does no work: `flops` leaves it out)."""
    return tuple(Update(role, *rows[role]) for role in TRAINED if not cfg.compiled_out(role))

