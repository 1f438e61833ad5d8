"""`jaxrubric sft`: the supervised stage before RL, one role at a time (the GenRubric paper's
pipeline is SFT, then RL), written as a checkpoint that `jaxrubric train` starts from.

    jaxrubric sft --config configs/qwen3_8b_genrubric.py --data rubrics.jsonl --workdir W
    jaxrubric train --config configs/qwen3_8b_genrubric.py --workdir R \\
        --config.generator.path=W/generator

Rows (a .jsonl / .json / .parquet file or a hub data set), told apart by the first row:
- ``{prompt, completion, id?}``: ``prompt`` a string or a chat ``[{role, content}]`` (as in
  the training data), ``completion`` the text the role learns to write;
- HealthBench rows (a ``rubrics`` field; `jaxrubric.data.schemas.parse_healthbench_row`),
  generator only: the completion is the physicians' rubric in the rubric grammar
  (`healthbench_rubric`).

The role learns what it writes in the RL round, after the prompt it is shown there, token for
token: the generator the query through the method's generator template (GenRubric: the query
alone), its completion a rubric the round's grammar admits (checked by the grammar's own
parser), then the end token; the policy the query as one user turn through the chat template
(as the round encodes it), its completion then eos. A row that does not fit (a field of the
wrong type, a query over ``data.prompt_tokens`` or ``data.policy_tokens``, a completion over
``round.response_tokens`` or outside the grammar) is an error naming the file, the row and the
field, raised before any model loads; ``--skip-bad-rows`` (``data.skip_bad_rows``) leaves such
rows out and counts them.

Settings come from the config, each from its one home: the model to start from and how it is
held (``<role>.path``, dtypes, remat, on ``mesh``), as `jaxrubric train` loads it; the
tokenizer; AdamW as the RL stage's (`jaxrubric.train.make_optimizer`) at ``optim.<role>_lr``,
which ``--lr`` sets (SFT usually wants a larger rate than RL); ``data.batch_size`` rows per
step (``--batch-size``); the loss read back every ``log_every`` steps. ``--steps`` (default:
one pass over the rows) has no config home. Every weight trains (``<role>.lora`` belongs to
the RL stage, which can start LoRA from the SFT checkpoint).

Writes ``W/<role>/`` (an HF checkpoint with the tokenizer: what ``<role>.path`` takes),
``W/tensorboard/`` (``sft/loss``, ``sft/accuracy``, ``sft/grad_norm``, ``sft/target_tokens``)
and ``W/sft_summary.json`` (the settings, the rows used and skipped, the loss history).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import sys
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import jax
import ml_collections
import numpy as np

import jaxrubric
from jaxrubric import sft
from jaxrubric import sharding as shd
from jaxrubric.config import ConfigFileError, load_config, round_config
from jaxrubric.data import DataError, HealthBenchRecord, prompt_text, read_rows
from jaxrubric.data.schemas import RowChecker, parse_healthbench_row
from jaxrubric.eval.common import fill, pad_id
from jaxrubric.logging_utils import SummaryWriter
from jaxrubric.methods import get_method
from jaxrubric.models.transformer import Decoder
from jaxrubric.roles import Role
from jaxrubric.rubric import grammar as grammar_lib
from jaxrubric.rubric.parse import RubricItem, format_rubric
from jaxrubric.train import role_model, make_optimizer

SFT_ROLES = (Role.GENERATOR.value, Role.POLICY.value)
SUMMARY_FILE = "sft_summary.json"
TENSORBOARD_DIR = "tensorboard"
HEALTHBENCH_MAX_POINTS = 10  # HealthBench criteria carry -10..10 points


@dataclasses.dataclass(frozen=True)
class Example:
    """One row as the role sees it: its prompt tokens and the tokens it learns to write."""

    row: int
    prompt: list[int]
    target: list[int]


@dataclasses.dataclass(frozen=True)
class SFTData:
    """The usable rows of a source, one error message per skipped row, and what rendering
    HealthBench rubrics cut (``rubrics_cut``: rows with more than ``rubric.max_items``
    criteria, of which the largest by |points| were kept; ``criteria_cut``: criteria cut to
    ``rubric.max_item_tokens`` tokens)."""

    source: str
    format: str
    examples: list[Example]
    problems: list[str]
    cuts: dict[str, int]


def healthbench_weight(points: int, max_weight: int) -> int:
    """HealthBench points (-10..10) on the grammar's ``-max_weight..max_weight`` scale: scaled
    and rounded away from zero, so sign and order are kept and no criterion drops to 0
    (for 5: 9 and 10 -> 5, 1 and 2 -> 1); points beyond 10 count as 10."""
    scaled = -(-abs(points) * max_weight // HEALTHBENCH_MAX_POINTS)
    return min(scaled, max_weight) * (1 if points > 0 else -1)


def healthbench_rubric(record: HealthBenchRecord, tokenizer: Any, *, max_weight: int,
                       max_items: int, max_item_tokens: int, cuts: Counter) -> list[RubricItem]:
    """The physicians' rubric as a generator writes it in the rubric grammar (the completion is
    ``format_rubric(items) + "\\n"``, then the end token).

    Weights are `healthbench_weight`s on the grammar's scale; at most ``max_items`` criteria,
    the largest by |points| (earlier first among equals), kept in the row's order; each
    criterion on one line, cut to its first ``max_item_tokens`` tokens as the evaluator cuts
    expert items. Cuts are counted in ``cuts``.
    """
    kept = sorted(sorted(range(len(record.rubric)), key=lambda i: -abs(record.rubric[i].weight)
                         )[:max_items])
    cuts["rubrics_cut"] += len(record.rubric) > max_items
    items = []
    for i in kept:
        criterion = " ".join(record.rubric[i].criterion.split())
        ids = tokenizer.encode(" " + criterion, add_special_tokens=False)
        if len(ids) > max_item_tokens:
            criterion = tokenizer.decode(ids[:max_item_tokens]).strip()
            cuts["criteria_cut"] += 1
        items.append(RubricItem(criterion, healthbench_weight(record.rubric[i].weight,
                                                              max_weight)))
    return items


class _RoleView:
    """How the role sees a row in the RL round: its prompt tokens and budgets, and the
    grammar its completions must follow (the generator's)."""

    def __init__(self, config: ml_collections.ConfigDict, role: str, tokenizer: Any):
        self.role, self.tokenizer = role, tokenizer
        self.eos = tokenizer.eos_token_id
        if self.eos is None:
            raise ConfigFileError(f"the tokenizer of config.tokenizer={config.tokenizer!r} has "
                                  "no eos token to end the completions with")
        self.grammar = self.template = None
        if role == Role.GENERATOR:
            method = get_method(config.method)
            self.template = method.templates(
                round_config(config), tokenizer, max_items=config.rubric.max_items,
                chat_template_kwargs=dict(config.chat_template_kwargs) or None,
                style=config.rubric.template_style)["generator"]
            if self.template.slots != ("prompt",):
                raise ConfigFileError(
                    f"config.method {config.method!r}: its generator is shown "
                    f"{', '.join(self.template.slots)}, and SFT rows hold a prompt and a "
                    "completion only (the GenRubric generator and the static DynamicRubric "
                    "baseline see the prompt alone)")
            self.grammar = grammar_lib.build_rubric_grammar(
                tokenizer, weights=method.weights, max_items=config.rubric.max_items,
                max_item_tokens=config.rubric.max_item_tokens, end_token_id=self.eos)
            self.prompt_budget = ("", "data.prompt_tokens", config.data.prompt_tokens)
            self.target_budget = (self.grammar.max_rubric_tokens, "the grammar's longest rubric "
                                  "(rubric.max_items items of rubric.max_item_tokens tokens)")
        else:
            self.prompt_budget = (" chat-formatted", "data.policy_tokens",
                                  config.data.policy_tokens)
            self.target_budget = (config.round.response_tokens,
                                  f"config.round.response_tokens={config.round.response_tokens}")

    def prompt(self, check: RowChecker, messages: list[dict[str, str]]) -> list[int]:
        """The prompt tokens the role is shown in the round, checked against its budget."""
        text = prompt_text(messages)
        if self.template is None:  # the policy: one user turn, chat-formatted
            text = self.tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                                      add_generation_prompt=True, tokenize=False)
        ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        how, key, budget = self.prompt_budget
        if len(ids) > budget:
            check.fail("prompt", f"has {len(ids)} tokens{how}, more than config.{key}={budget}")
        return ids if self.template is None else fill(self.template, [ids])

    def target(self, check: RowChecker, text: str, field: str) -> list[int]:
        """The completion's tokens and the end token, checked against the target budget."""
        ids = [*self.tokenizer.encode(text, add_special_tokens=False), self.eos]
        budget, what = self.target_budget
        if len(ids) > budget:
            check.fail(field, f"has {len(ids)} tokens with the end token, more than {what}")
        return ids

    def grammar_misses(self, targets: list[list[int]]) -> np.ndarray:
        """Which targets the round's rubric grammar rejects (all parsed in one call)."""
        tokens = np.full((len(targets), self.grammar.max_rubric_tokens), self.eos, np.int32)
        for i, ids in enumerate(targets):
            tokens[i, :len(ids)] = ids
        parse = jax.jit(grammar_lib.parse_rubric_tokens, static_argnums=2)
        return ~np.asarray(parse(tokens, self.grammar, self.eos).complete)

    def grammar_rule(self) -> str:
        g = self.grammar
        return (f"lines '[w] criterion' with w one of {list(g.weights)}, at most "
                f"rubric.max_items={g.max_items} of them, each criterion at most "
                f"rubric.max_item_tokens={g.max_item_tokens} tokens, and nothing else")


def load_examples(source: str | os.PathLike, config: ml_collections.ConfigDict, role: str,
                  tokenizer: Any, *, split: str = "train") -> SFTData:
    """The rows of ``source`` as `Example`s for ``role`` (see the module docstring), bad rows
    raised as a `DataError` naming the source, the row and the field, or (with
    ``config.data.skip_bad_rows``) left out and kept in `SFTData.problems`."""
    name = str(source)
    view = _RoleView(config, role, tokenizer)
    rows = iter(read_rows(source, split=split))
    first = next(rows, None)
    if first is None:
        raise DataError(f"{name}: has no rows")
    form = "healthbench" if isinstance(first, Mapping) and "rubrics" in first else "pairs"
    cuts: Counter = Counter()
    examples: list[Example] = []
    problems: dict[int, str] = {}
    for index, row in enumerate(itertools.chain([first], rows)):
        check = RowChecker(name, index)
        try:
            if not isinstance(row, Mapping):
                raise DataError(f"{name} row {index}: must be an object, got {type(row).__name__}")
            examples.append(_example(check, row, form, view, config, cuts))
        except DataError as e:
            if not config.data.skip_bad_rows:
                raise
            problems[index] = str(e)
    if view.grammar is not None and examples:
        field = "rubrics" if form == "healthbench" else "completion"
        missed = view.grammar_misses([e.target for e in examples])
        for example in itertools.compress(examples, missed):
            message = (f"{name} row {example.row}: field '{field}' is not a rubric the round's "
                       f"grammar admits ({view.grammar_rule()})")
            if not config.data.skip_bad_rows:
                raise DataError(message)
            problems[example.row] = message
        examples = list(itertools.compress(examples, ~missed))
    return SFTData(name, form, examples, [problems[i] for i in sorted(problems)], dict(cuts))


def _example(check: RowChecker, row: Mapping[str, Any], form: str, view: _RoleView,
             config: ml_collections.ConfigDict, cuts: Counter) -> Example:
    if form == "pairs":
        messages = check.messages(check.get(row, "prompt", "prompt"), "prompt")
        completion = check.string(check.get(row, "completion", "completion"), "completion")
        return Example(check.index, view.prompt(check, messages),
                       view.target(check, completion, "completion"))
    if view.grammar is None:
        raise DataError(f"{check.source} row {check.index}: a HealthBench row teaches the "
                        f"generator its expert rubric; --role {view.role} needs "
                        "{prompt, completion} rows")
    record = parse_healthbench_row(check, row)
    row_cuts: Counter = Counter()
    items = healthbench_rubric(record, view.tokenizer, max_weight=max(view.grammar.weights),
                               max_items=config.rubric.max_items,
                               max_item_tokens=config.rubric.max_item_tokens, cuts=row_cuts)
    if not any(item.weight > 0 for item in items):
        check.fail("rubrics", f"keeps only penalties among its rubric.max_items="
                              f"{config.rubric.max_items} criteria of most points (a score "
                              "needs positive points)")
    try:
        text = format_rubric(items) + "\n"
    except ValueError as e:  # e.g. a criterion cut to nothing but whitespace
        check.fail("rubrics", f"cannot be written in the rubric grammar: {e}")
    example = Example(check.index, view.prompt(check, record.messages),
                      view.target(check, text, "rubrics"))
    cuts.update(row_cuts)  # counted only for rows that are used
    return example


def run_sft(config: ml_collections.ConfigDict, data: str | os.PathLike,
            workdir: str | os.PathLike, *, role: str = "generator", steps: int | None = None,
            split: str = "train", progress: bool = True) -> tuple[Decoder, dict[str, Any]]:
    """Fine-tunes ``role`` on ``data`` and writes ``workdir/<role>`` (see the module
    docstring); returns the trained model and the summary written beside it.

    The rows are read and checked before any model loads; each step draws
    ``config.data.batch_size`` rows from a shuffle of them (reshuffled every pass, seeded
    by ``config.seed``), padded to the longest row so one step compiles.
    """
    if role not in SFT_ROLES:
        raise ValueError(f"role must be one of {SFT_ROLES}, got {role!r}")
    workdir = Path(workdir).absolute()
    out = workdir / role
    if (out / "config.json").exists():
        raise FileExistsError(f"{out} already holds a checkpoint; give another --workdir")
    batch_size = config.data.batch_size
    mesh = shd.make_mesh(dict(config.mesh))
    if batch_size % shd.batch_ways(mesh):
        raise ConfigFileError(f"config.data.batch_size={batch_size} must be a multiple of the "
                              f"{shd.batch_ways(mesh)} ways the mesh {dict(mesh.shape)} splits "
                              "the batch")
    tokenizer = jaxrubric.load_tokenizer(config.tokenizer or config.policy.path)
    loaded = load_examples(data, config, role, tokenizer, split=split)
    for problem in loaded.problems:
        print(f"skipped: {problem}", file=sys.stderr)
    if not loaded.examples:
        raise DataError(f"{loaded.source}: no usable rows")
    steps = steps or -(-len(loaded.examples) // batch_size)
    width = -(-max(len(e.prompt) + len(e.target) for e in loaded.examples) // 8) * 8
    model = role_model(config[role], len(tokenizer), tokenizer, mesh)
    writer = SummaryWriter(workdir / TENSORBOARD_DIR)
    first = loaded.examples[0]
    writer.texts(0, {"sft/example": f"prompt:\n```\n{tokenizer.decode(first.prompt)}\n```\n"
                                    f"completion:\n```\n{tokenizer.decode(first.target)}\n```"})
    try:
        _, history = sft.train_sft(
            model, make_optimizer(config, Role(role), steps),
            _batches(loaded.examples, batch_size, width, pad_id(tokenizer), config.seed),
            steps=steps, log_every=config.log_every, progress=progress,
            chunk_size=config.round.logprob_chunk,
            on_log=lambda h: writer.scalars(h["step"], {f"sft/{k}": v for k, v in h.items()
                                                        if k != "step"}))
    finally:
        writer.close()
    jaxrubric.save_pretrained(model, out)
    summary = {"role": role, "checkpoint": str(out), "data": loaded.source,
               "format": loaded.format, "rows": len(loaded.examples),
               "bad_rows_skipped": len(loaded.problems), "bad_rows": loaded.problems,
               "cuts": loaded.cuts, "steps": steps, "batch_size": batch_size,
               "lr": config.optim[f"{role}_lr"], "max_len": width, "history": history}
    if jax.process_index() == 0:
        tokenizer.save_pretrained(str(out))
        (workdir / SUMMARY_FILE).write_text(json.dumps(summary, indent=1) + "\n")
    return model, summary


def _batches(examples: list[Example], batch_size: int, width: int, pad: int, seed: int
             ) -> Iterator[sft.SFTBatch]:
    """Batches of ``batch_size`` rows, endlessly: each pass a fresh shuffle, a batch may span
    two passes, so every batch is full."""
    rng = np.random.default_rng(seed)
    order = itertools.chain.from_iterable(rng.permutation(len(examples))
                                          for _ in itertools.count())
    while True:
        rows = [examples[i] for i in itertools.islice(order, batch_size)]
        yield sft.encode_examples(None, [e.prompt for e in rows], [e.target for e in rows],
                                  max_len=width, pad_id=pad)


def _positive(kind: type) -> Any:
    def parse(text: str) -> Any:
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        return value
    return parse


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Registers the ``sft`` subcommand on an ``add_subparsers()`` object."""
    p = subparsers.add_parser(
        "sft", help="supervised fine-tuning of one role before RL (the GenRubric cold start)",
        description=__doc__.split("\n\n")[0] + " Extra --config.KEY=VALUE arguments override "
                    "the config.")
    p.add_argument("--config", required=True, help="the training config (configs/NAME.py): "
                                                   "the model, tokenizer, templates and budgets")
    p.add_argument("--data", required=True,
                   help="{prompt, completion} rows, or HealthBench rows (generator: the "
                        "expert rubric is the completion); a .jsonl/.json/.parquet file or a "
                        "hub data set")
    p.add_argument("--workdir", required=True,
                   help="writes WORKDIR/ROLE (the checkpoint), tensorboard/ and "
                        f"{SUMMARY_FILE}")
    p.add_argument("--role", choices=SFT_ROLES, default="generator",
                   help="the role to fine-tune: its prompt template, budgets and checkpoint")
    p.add_argument("--steps", type=_positive(int), default=None,
                   help="optimiser steps (default: one pass over the rows)")
    p.add_argument("--lr", type=_positive(float), default=None,
                   help="learning rate (sets config.optim.ROLE_lr; default: the config's)")
    p.add_argument("--batch-size", type=_positive(int), default=None,
                   help="rows per step (sets config.data.batch_size)")
    p.add_argument("--skip-bad-rows", action="store_true",
                   help="leave out rows that do not fit, and say how many (sets "
                        "config.data.skip_bad_rows)")
    p.add_argument("--split", default="train", help="split of a hub data set")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run, takes_overrides=True)
    return p


def run(args: argparse.Namespace, overrides: list[str]) -> int:
    """The ``sft`` command: the flags become config overrides, then `run_sft`."""
    flags = {f"optim.{args.role}_lr": args.lr, "data.batch_size": args.batch_size,
             "data.skip_bad_rows": "true" if args.skip_bad_rows else None}
    config = load_config(args.config, [*overrides, *(f"{key}={value}" for key, value in
                                                     flags.items() if value is not None)])
    try:
        _, summary = run_sft(config, args.data, args.workdir, role=args.role, steps=args.steps,
                             split=args.split, progress=not args.no_progress)
    except FileExistsError as e:
        raise SystemExit(f"jaxrubric sft: error: {e}") from None
    history = summary["history"]
    print(f"{summary['rows']} rows ({summary['bad_rows_skipped']} bad rows skipped), "
          f"{summary['steps']} steps: loss {history[0]['loss']:.4f} at step "
          f"{history[0]['step']} -> {history[-1]['loss']:.4f} at step {history[-1]['step']}")
    print(f"wrote the {args.role} to {summary['checkpoint']}; start RL from it with "
          f"--config.{args.role}.path={summary['checkpoint']}")
    return 0
