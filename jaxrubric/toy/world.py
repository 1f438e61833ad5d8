"""The embedded default: co-evolution that measurably learns, offline, on a laptop CPU.

`run_toy_world(workdir)` builds the big-digits world of `jaxrubric.toy.digits_task` and runs
the whole stack on it, every role a real transformer LM from our own model code:

1. a character-level tokenizer and generated data (train and held-out anchor lists: the
   correct answer, one with a big digit dropped, one with a small digit kept);
2. warm starts by supervised fine-tuning (`jaxrubric.sft`): the **verifier** on the checker's
   labels of (prompt, answer, criterion) triples, then frozen; the **policy** to middling
   quality; the **generator** on valid rubric lines, only partly sound, about the digits the
   answers it is shown differ on (a prompt-only generator on any of the prompt's digits);
3. each generator's own rounds against the warm-started policy (policy frozen), a few: the
   evaluator the "coevolve" run goes on training; the same rounds continued as long as the
   compared runs last give the **stale** evaluator the "frozen" run keeps, trained as long as
   the co-evolving one but on the warm start's answers alone;
4. four runs of `jaxrubric.train.train` from the same policy, held-out ground-truth quality
   of the policy every few rounds: **coevolve** (both roles train), **frozen** (the stale
   evaluator of step 3), **static** (a generator that sees the prompt alone, co-trained on
   the same rewards), **oracle** (the policy rewarded by ground truth itself: the ceiling);
5. a final evaluation: every run's last policy answers each held-out question
   `final_samples` (16) times, all runs with the same sampling draws (`toy/final_eval.py`),
   so two runs' quality difference is paired by question;
6. `summary.json` = the quality curves, their standard errors and Δgap on each run's own
   answers, the final evaluation with its paired leads, `quality.png` plotting the curves,
   and a table.

Why a frozen evaluator should go stale here. The warm-started policy copies too much: its
mistakes are small digits kept, never a big digit dropped, so the items that tell its answers
apart are "omits <small digit>", and that is what the generator's own rounds sharpen ("has <big
digit>" items pass every answer: no discriminability reward). Rewarded for dropping digits,
the policy can start dropping big ones too. The frozen generator keeps writing the items of
the old mistakes; a co-evolving generator should find the items that now separate the answers
(discriminability) in the direction the anchor lists rank (anchor reward). The same holds for
the stray letters (below): the generator's own rounds wear its letter items down (of its
rubrics for answers holding a letter, 55% name it at its cold start, 4% after 100 rounds; seed
1), and once the policy stops keeping small digits the letters are what its answers differ
on, which the co-evolving generator names again (48% at round 90). Why a static one
should fall behind: the policy also writes stray letters, and which letter only its answers
show; a generator that sees the prompt alone cannot write "omits <that letter>".

What the defaults are measured to do (issue 12; the README's toy section has the tables): over
seeds 0-4, from round 0 to 90, the co-evolving evaluator's Δgap (the gap between its scores of
its policy's better and worse answers) widens by +0.190 ± 0.014 (standard error across seeds;
on all five) while the stale one's narrows by 0.149 ± 0.044 and the static one's by 0.139 ±
0.024; at round 90 it is above the stale one's by +0.291 ± 0.041 and the static one's by
+0.486 ± 0.016, on all five. In the final evaluation the co-evolving run's policy is above
the static run's by +0.066 ± 0.009 (13.7 to 25.2 standard errors of the paired difference
on every seed: the prompt-only generator cannot name the stray letter a policy writes) and
above the frozen run's by +0.017 ± 0.008 (9.2, 9.2, 2.2, 6.6 and 7.2 standard errors; on
seed 2 the ground truth itself leads the frozen run by only 0.5 of them). What made that
measurable: a mistake the prompt does not foretell (stray letters, `policy_stray`; without
one the static run was level with the ceiling) written with letters no template holds
(`digits_task.STRAY_LETTERS`), a policy warm start that writes in the task's format
(`policy_steps`), runs long enough for the stale evaluator to fall behind (`rounds`),
generator warm starts long enough to aim and to read the letter off the answers
(`generator_steps`), policy advantages that follow the size of the score gaps, not only
their order (`policy_advantage_mode`), and a final evaluation that compares the runs paired
by question (`final_samples`). Co-evolution starts after 10 generator rounds: 40
wore down the items the co-evolving generator later needs (`has <big digit>`, the check on
the mistake the policy makes next).

Every step writes into `workdir` and is skipped when its output is already there, so a rerun
resumes (warm starts and finished runs are cached; an interrupted run resumes from its
checkpoint).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import ml_collections
import numpy as np
import optax

import jaxrubric
from jaxrubric import sft
from jaxrubric import sharding as shd
from jaxrubric.config import base_config, check_config
from jaxrubric.methods.round_config import KL_KINDS
from jaxrubric.rl import grpo
from jaxrubric.rubric import templates as tpl
from jaxrubric.toy import digits_task as task
from jaxrubric.toy import final_eval
from jaxrubric.toy import stages as stages_lib
from jaxrubric.train_loop import ConfigMismatchError, read_eval_history

RUNS = ("coevolve", "frozen", "static", "oracle")
# The leads the final evaluation reports: each learned evaluator's and the ceiling's over the
# two baselines.
LEADS = (("coevolve", "frozen"), ("coevolve", "static"), ("oracle", "frozen"),
         ("oracle", "static"))
POLICY_TOKENS = 16  # the longest answer a policy writes, in rounds and in the final evaluation
FINAL_FILE = "final_eval.json"
FINAL_KEY_OFFSET = 20_000  # the final evaluation's sampling key: seed + this (held-out data's: 10k)
# Settings a workdir's cache does not depend on: which runs a world compares, and how its final
# evaluation samples (redone whenever the world runs). Any other difference is refused.
REUSABLE_SETTINGS = ("runs", "final_samples")
TEACHER_FOCUS = ("contested", "prompt")
GENERATOR_REFERENCES = ("run_start", "cold_start")  # ToyWorldConfig.generator_reference
# The runs whose generator sees only the prompt (DynamicRubric's static baseline).
STATIC_RUNS = ("static",)


@dataclasses.dataclass(frozen=True)
class ToyWorldConfig:
    """Sizes and budgets of the toy world (the defaults took 13 min 18 s from scratch on an
    idle 2-core box, stop 43, in two worker processes, `jaxrubric train`'s default there; the
    world's `timings.json` splits its time by stage: the generators' warm starts are half)."""

    seed: int = 0
    # Co-evolution rounds of each compared run. Staleness takes time to show: in stop 39's
    # world (no stray letters) the frozen run's policy fell after round 30 on four seeds of
    # five; with stop 38's policy warm start the stale evaluator's gaps were level with the
    # co-evolving one's at round 60 on three seeds of five and below them on all five by
    # round 90 (docs/toy_world_history.md).
    rounds: int = 90
    # The generators' rounds against the warm-started policy before the compared runs start.
    generator_rounds: int = 10
    # The stale evaluator's further rounds against the warm-started policy: the frozen run's
    # generator is the same generator-only run continued this long, so it has trained as long
    # as the co-evolving generator will (generator_rounds + rounds), on the start's answers
    # alone. 0: the frozen run keeps the generator the co-evolving run starts from.
    stale_rounds: int = 90
    eval_every: int = 30  # held-out evaluations at rounds 0, 30, 60 and 90 (each ~3.3 s)
    batch_size: int = 8  # prompts per round
    # Held-out prompts per evaluation, K answers each (`eval/quality_se`: the standard error of
    # a run's quality, clustered by question; 0.002-0.014 at 256 x 4).
    eval_batch_size: int = 256
    # The final evaluation (`toy/final_eval.py`): every run's last policy answers each of those
    # questions this many times, every run with the same sampling draws, so two runs' quality
    # difference is paired by question. The training-time evaluations' 4 answers per question
    # left a 95% interval of about ±0.013 on the difference of two runs near 0.95 (stop 42).
    final_samples: int = 16
    num_responses: int = 4  # K
    num_rubrics: int = 8  # G: a large group gives the generator's GRPO a usable baseline
    max_items: int = 4
    max_item_tokens: int = 7
    num_anchors: int = 3
    # The anchor lists' answers (`digits_task.anchor_answers`): "covering" (one of each kind of
    # single mistake), "distinct" (random noisy answers of distinct quality) or "every_digit"
    # (every single mistake; num_anchors 8: the correct answer and one per digit).
    anchors: str = "covering"
    policy_p_correct: float = 0.3  # warm start: share of correct answers in its targets
    teacher_informed: float = 0.5  # generator cold start: share of sound rubric items
    # Of its items about the contested digits (teacher_focus "contested"): the share with the
    # sound sign (the previous defaults: 0.5). At 1 the cold start reads its answers both ways:
    # "has <big digit>" where one of them drops it, "omits <small digit>" where one keeps it.
    teacher_focus_informed: float = 1.0
    # 450: at 300 (stop 39's) a verifier trained with stray letters judged items about them
    # at 0.73 accuracy (seed 0, answers all holding a letter; `diagnostics.
    # verifier_accuracy`); at 450, 0.99 (and 0.998 on the digits' items).
    verifier_steps: int = 450
    verifier_items: int = 12  # labelled criteria per (question, answer) in one tree forward
    # Share of those criteria outside the language (`digits_task.malformed_criterion`,
    # labelled "no" as the checker labels them). A verifier that never saw one judges the
    # generator's malformed items arbitrarily, and the generator may learn to write nothing
    # else (seed 1's wrote only "] ] ] ]", read as "the answer is short"; with the inverse-CDF
    # sampler seed 0's wrote 0% of its items in the language). At 0.25 its items stay 80-92%
    # in the language.
    verifier_malformed: float = 0.25
    # Share of the verifier's training answers with a stray letter (`digits_task.
    # with_stray_letter`), and of its valid criteria about a letter (`stray_criterion`): so it
    # judges "omits x" as it judges the digits' items. At 0.25 (an item about a letter the
    # answer holds: 3% of its items) it judged them at 0.55 accuracy after 300 steps.
    verifier_stray: float = 0.5
    # The policy's warm start: long enough that it writes answers in the task's format. At
    # 300 steps (its loss still falling, 0.81) 65% of its sampled answers were out of order or
    # held a character that is not a digit (`diagnostics.mistake_profile`, seed 0), a mistake
    # no `has`/`omits` item can see, which then drifted under every learned evaluator and
    # dominated the runs' differences; at 1000 (loss flat from ~800 at 0.41) 11%, and it makes
    # the mistake the world is built on: it keeps small digits (69%), seldom drops a big one
    # (1.6%).
    policy_steps: int = 1000
    # Share of the policy's warm-start targets (and of the answers the answer-seeing
    # generator's cold start is shown) with a stray letter: a mistake of 9 kinds that the
    # prompt does not foretell and the answers show. Without one (stop 39) every mistake of
    # the world could be listed from the prompt, and the prompt-only evaluator's run was level
    # with the ground truth's (seed 2: 0.981 against 0.984, README).
    policy_stray: float = 0.25
    # The generators' warm starts: long enough, at a high enough rate, that the answer-seeing
    # one writes in the criterion language and aims its items at what its shown answers differ
    # on (`diagnostics.generator_aim`, seed 0: 180 steps at 1e-3, stop 37's, wrote 51% of its
    # items in the language and aimed below chance, 0.38 of them on a contested digit against
    # 0.57; 500 at 3e-3 writes 97.5% and 0.65; 800 at 1e-3 95% and 0.70; 500 at 3e-3 with
    # batches of 32, 0.55). Aim is the last thing its SFT learns, and reading a stray letter
    # off the answers last of all: of the rubrics it writes for answers holding one
    # (`generator_aim(w, stray=0.25)`'s `names_the_letter`), 0.48 name it after 500 steps
    # (seed 0), 0.55-0.66 after 1000 (seeds 0-2); its teacher's, 0.73.
    generator_steps: int = 1000
    generator_sft_lr: float = 3e-3
    sft_batch: int = 64
    sft_lr: float = 1e-3  # the verifier's and the policy's warm starts
    policy_lr: float = 1e-4
    generator_lr: float = 5e-4
    # The stale-evaluator setting: the warm-started policy copies too much (it keeps small
    # digits, never drops a big one). The generator's cold start knows both kinds of sound
    # item ("omits" a small digit, "has" a big one): with "omits" alone the co-evolving
    # generator never wrote "has <big digit>" again. See the module docstring.
    policy_mistakes: str = "keeps_small"  # digits_task.policy_warm_start_answer
    teacher_sound: str = "both"  # digits_task.sound_criterion kinds of the cold start
    # Where the answer-seeing generator's cold-start items look: "contested" (first the digits
    # its shown answers differ on, `digits_task.contested_symbols`) or "prompt" (any digit).
    teacher_focus: str = "contested"
    # The mistakes of the answers the cold start shows it (`digits_task.POLICY_MISTAKES`):
    # those of the warm-started policy ("keeps_small"), or "flips" (any digit, so the
    # contested digits are big as often as small: the cold start sees both kinds of mistake).
    teacher_mistakes: str = "flips"
    # RoundConfig.policy_score: "mean" over the valid groups, as the 8B recipes. "best_group"
    # (the group the generator's advantage ranks first) picks it on the current answers, which
    # lets a prompt-only or frozen generator adapt through the selection.
    policy_score: str = "mean"
    anchor_weight: float = 1.0  # lambda of the generator's reward
    # KL of the generator to its reference (RoundConfig.generator_beta; the 8B recipes use
    # 0.01). The reference is the role's weights at the start of each run: the cold start
    # for the generator's own rounds, their result for the compared runs. Without one the
    # character-level generator drifts out of the criterion language.
    generator_beta: float = 0.04
    # KL of the policy to its warm start (RoundConfig.policy_beta), the recipes' 0.01. Without
    # one the policy's reward kept rising after round 20 while its held-out quality fell under
    # most learned evaluators (it finds what the rubrics miss).
    policy_beta: float = 0.01
    # How the policy's rubric scores become advantages (RoundConfig.policy_advantage_mode;
    # the generators' stay "group_std"). "no_std" centres each prompt's scores without
    # dividing by their spread (Dr. GRPO's form), so the policy's step follows the size of
    # the score gaps, not only their order: the regime in which DynamicRubric's claim that
    # closing gaps starve the policy can show in its quality. With "group_std" (the 8B
    # recipes', stop 41) every evaluator's gaps became full-size advantages as long as their
    # order was right, and the stale run reached the ceiling (the ground truth led it by
    # less than two standard errors on four seeds of five; docs/toy_world_history.md). Adam
    # keeps the step's overall scale, so the first rounds train about as before.
    policy_advantage_mode: str = "no_std"
    # The compared runs' generator KL reference: "run_start" (the generator they start from,
    # after its own rounds) or "cold_start" (its SFT cold start, as RLHF keeps its SFT model:
    # the only start that still writes every kind of sound item).
    generator_reference: str = "run_start"
    # Which KL generator_beta weighs (RoundConfig.generator_kl): "sampled" (k3 on the tokens
    # it writes) or "forward" (KL(reference || generator) over the whole vocabulary).
    generator_kl: str = "sampled"
    # The generators' sampling temperature in every run (RoundConfig.generator_temperature).
    generator_temperature: float = 1.0
    # The generators' entropy bonus in every run, their own rounds included
    # (RoundConfig.generator_entropy): against the exploration failure in the README.
    generator_entropy: float = 0.0
    # Of the G rubrics per prompt, how many the generator's SFT cold start writes in every run
    # and in the generators' own rounds (RoundConfig.explorer_rubrics): judged and rewarded
    # with the group, learned from, never scoring the policy (frozen and oracle runs sample
    # them too, unused, so every run compiles the same program).
    explorer_rubrics: int = 0
    # Item-level credit on the generators' item tokens in every run (RoundConfig.item_credit).
    item_credit: float = 0.0
    hidden_size: int = 64
    num_layers: int = 2
    verifier_hidden_size: int = 64
    verifier_layers: int = 3
    runs: tuple[str, ...] = RUNS

    def __post_init__(self) -> None:
        unknown = set(self.runs) - set(RUNS)
        if unknown:
            raise ValueError(f"unknown toy runs {sorted(unknown)}; choose from {RUNS}")
        if self.final_samples < 1:
            raise ValueError("ToyWorldConfig.final_samples must be >= 1 (answers per question "
                             f"in the final evaluation), got {self.final_samples}")
        if self.generator_rounds < 1 or self.stale_rounds < 0:
            raise ValueError("ToyWorldConfig.generator_rounds must be >= 1 and stale_rounds "
                             f">= 0, got {self.generator_rounds} and {self.stale_rounds}")
        for name, allowed in (("policy_mistakes", task.POLICY_MISTAKES),
                              ("teacher_sound", task.SOUND_KINDS),
                              ("teacher_mistakes", task.POLICY_MISTAKES),
                              ("teacher_focus", TEACHER_FOCUS),
                              ("generator_reference", GENERATOR_REFERENCES),
                              ("generator_kl", KL_KINDS),
                              ("policy_advantage_mode", grpo.ADVANTAGE_MODES),
                              ("anchors", task.ANCHOR_KINDS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"ToyWorldConfig.{name} {getattr(self, name)!r} is not one of "
                                 f"{allowed}")


class StageTimer:
    """Wall-clock seconds of a world's stages, printed and kept in a JSON file (a rerun that
    finds a stage cached records its few seconds of loading instead): where a run's time goes."""

    def __init__(self, path: Path):
        self.path = path
        self.seconds: dict[str, float] = (json.loads(path.read_text()) if path.exists() else {})

    def record(self, name: str, seconds: float) -> None:
        self.seconds[name] = round(seconds, 1)
        self.path.write_text(json.dumps(self.seconds, indent=1))
        print(f"time: {name} {self.seconds[name]:.1f} s", flush=True)


# --------------------------------------------------------------------------------- data
def write_data(workdir: Path, cfg: ToyWorldConfig) -> dict[str, Path]:
    """Train and held-out anchor lists as JSONL (the loaders' schema), from the seed."""
    paths = {}
    for name, rows, seed in (("train", 2000, cfg.seed), ("eval", cfg.eval_batch_size,
                                                         cfg.seed + 10_000)):
        path = workdir / "data" / f"{name}.jsonl"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            lines = [json.dumps(r) for r in task.anchor_rows(rows, seed, cfg.num_anchors,
                                                                  cfg.anchors)]
            path.write_text("\n".join(lines) + "\n")
        paths[name] = path
    return paths


def text_ids(tokenizer: Any, text: str) -> list[int]:
    return list(_encoded(tokenizer, text))


# The toy's criteria and short answers repeat, and a call through the tokenizer's Python
# wrapper costs ~100 µs: with this cache the verifier's warm-start batches cost 3.5x less host
# time, the generator's 2x.
@functools.lru_cache(maxsize=1 << 16)
def _encoded(tokenizer: Any, text: str) -> tuple[int, ...]:
    return tuple(tokenizer.encode(text, add_special_tokens=False))


def template_ids(template: tpl.TokenTemplate, tokenizer: Any, *texts: str) -> list[int]:
    """The template's token ids with ``texts`` in its slots, spliced as the round splices."""
    ids = list(template.segments[0])
    for text, segment in zip(texts, template.segments[1:]):
        ids += text_ids(tokenizer, text) + list(segment)
    return ids


def policy_prompt(tokenizer: Any, question: str) -> list[int]:
    chat = tokenizer.apply_chat_template([{"role": "user", "content": question}],
                                         add_generation_prompt=True, tokenize=False)
    return text_ids(tokenizer, chat)


def verifier_examples(tokenizer: Any, rng: random.Random, n: int, malformed: bool = False,
                      stray: float = 0.0) -> tuple[list, list]:
    """(prompt ids, [yes or no id]) pairs labelled by the checker, half of each label
    (`malformed`: criteria outside the language instead, every one "no"; `stray`: the share
    of answers with a stray letter and of criteria about a letter)."""
    template = tpl.verifier_template(tokenizer, style="compact")
    yes, no = text_ids(tokenizer, "yes"), text_ids(tokenizer, "no")
    prompts, targets, wanted = [], [], not malformed
    while len(prompts) < n:
        question, _ = task.make_prompt(rng)
        answer = _verifier_answer(question, rng, stray)
        criterion = (task.malformed_criterion(question, rng) if malformed
                     else _verifier_criterion(question, answer, rng, stray))
        if task.check(criterion, answer) != wanted:
            continue
        prompts.append(template_ids(template, tokenizer, question, answer, criterion))
        targets.append(yes if wanted else no)
        wanted = not wanted and not malformed
    return prompts, targets


def _verifier_answer(question: str, rng: random.Random, stray: float) -> str:
    answer = task.noisy_answer(question, rng)
    return task.with_stray_letter(answer, rng) if stray and rng.random() < stray else answer


def _verifier_criterion(question: str, answer: str, rng: random.Random, stray: float) -> str:
    if stray and rng.random() < stray:
        return task.stray_criterion(answer, rng)
    return task.random_criterion(question, rng)


def verifier_batch(tokenizer: Any, rng: random.Random, rows: int, items: int,
                   cfg: ToyWorldConfig) -> dict[str, np.ndarray]:
    """Tree-verification inputs (`jaxrubric.rubric.verifier.verify`'s layout, one response and
    one group per row) with `items` checker-labelled criteria per (question, answer), a share
    `cfg.verifier_malformed` of them outside the language (at most `max_item_tokens` long, as
    the grammar lets the generator write them)."""
    head = tpl.verifier_template(tokenizer, style="compact").head(2)
    width = head.constant_length + 12 + 8
    out = {"prefix": np.full((rows, 1, width), tokenizer.pad_token_id, np.int32),
           "prefix_len": np.zeros((rows, 1), np.int32),
           "items": np.full((rows, 1, items, cfg.max_item_tokens), tokenizer.pad_token_id,
                            np.int32),
           "item_len": np.zeros((rows, 1, items), np.int32),
           "labels": np.zeros((rows, 1, 1, items), np.float32)}
    for r in range(rows):
        question, _ = task.make_prompt(rng)
        answer = _verifier_answer(question, rng, cfg.verifier_stray)
        prefix = template_ids(head, tokenizer, question, answer)
        out["prefix"][r, 0, :len(prefix)] = prefix
        out["prefix_len"][r, 0] = len(prefix)
        for m in range(items):
            while True:
                malformed = cfg.verifier_malformed and rng.random() < cfg.verifier_malformed
                criterion = (task.malformed_criterion(question, rng) if malformed
                             else _verifier_criterion(question, answer, rng, cfg.verifier_stray))
                ids = text_ids(tokenizer, criterion)
                if len(ids) <= cfg.max_item_tokens:
                    break
            out["items"][r, 0, m, :len(ids)] = ids
            out["item_len"][r, 0, m] = len(ids)
            out["labels"][r, 0, 0, m] = task.check(criterion, answer)
    return out


def train_verifier(model, tokenizer: Any, mesh, cfg: ToyWorldConfig, rng: random.Random,
                   steps: int) -> list[dict[str, float]]:
    """Supervised training of the verifier on checker labels through the tree forward
    (`verifier.verdict_loss`): `verifier_items` labelled criteria per (question, answer) per
    forward."""
    from flax import nnx

    from jaxrubric.rl.grpo import grpo_update
    from jaxrubric.rubric import verifier as ver

    readout = ver.verifier_readout(tokenizer, tpl.verifier_template(tokenizer, style="compact"))
    graph, params = nnx.split(model, nnx.Param)
    optimizer = sft_optimizer(cfg.sft_lr, steps)
    pad = tokenizer.pad_token_id

    def loss_fn(p, batch):
        return ver.verdict_loss(nnx.merge(graph, p), readout, batch["prefix"],
                                batch["prefix_len"], batch["items"], batch["item_len"],
                                batch["items"][..., 0] >= 0, batch["labels"], pad_id=pad)

    @jax.jit
    def step(p, opt_state, batch):
        p, opt_state, metrics = grpo_update(p, opt_state, batch, loss_fn, optimizer)
        return p, opt_state, {k: v[0] for k, v in metrics.items()}

    opt_state = optimizer.init(params)
    rows = cfg.sft_batch // 2
    history = []
    for i in range(1, steps + 1):
        host = verifier_batch(tokenizer, rng, rows, cfg.verifier_items, cfg)
        batch = {k: shd.global_batch(mesh, {k: v}, range(rows), rows)[k] for k, v in host.items()}
        params, opt_state, metrics = step(params, opt_state, batch)
        if i % max(1, steps // 10) == 0 or i == steps:
            history.append({"step": i, **{k: float(v) for k, v in metrics.items()}})
            print(f"  verifier step {i}: loss {history[-1]['loss']:.3f} "
                  f"accuracy {history[-1]['accuracy']:.3f}", flush=True)
    nnx.update(model, params)
    return history


def policy_examples(tokenizer: Any, rng: random.Random, n: int, p_correct: float,
                    mistakes: str, stray: float = 0.0) -> tuple[list, list]:
    prompts, targets = [], []
    for _ in range(n):
        question, _ = task.make_prompt(rng)
        prompts.append(policy_prompt(tokenizer, question))
        answer = task.policy_warm_start_answer(question, rng, p_correct, mistakes, stray)
        targets.append(text_ids(tokenizer, answer) + [tokenizer.eos_token_id])
    return prompts, targets


def generator_examples(tokenizer: Any, rng: random.Random, n: int, cfg: ToyWorldConfig,
                       static: bool = False) -> tuple[list, list]:
    """The generator's cold-start pairs: its prompt (the question and K warm-start answers, or
    the question alone for the static baseline) and a partly sound teacher rubric."""
    shown_count = 0 if static else cfg.num_responses
    template = tpl.dynamic_rubric_generator_template(
        tokenizer, shown_count, max_items=cfg.max_items, style="compact")
    prompts, targets = [], []
    for _ in range(n):
        question, _ = task.make_prompt(rng)
        shown = [task.policy_warm_start_answer(question, rng, cfg.policy_p_correct,
                                               cfg.teacher_mistakes, cfg.policy_stray)
                 for _ in range(shown_count)]
        prompts.append(template_ids(template, tokenizer, question, *shown))
        focus = task.contested_symbols(question, shown) if cfg.teacher_focus == "contested" else ()
        rubric = task.teacher_rubric(question, rng, cfg.max_items, cfg.teacher_informed,
                                     cfg.teacher_sound, focus, cfg.teacher_focus_informed)
        targets.append(text_ids(tokenizer, rubric) + [tokenizer.eos_token_id])
    return prompts, targets


# ----------------------------------------------------------------------------- warm starts
def new_model(tokenizer: Any, mesh, seed: int, hidden: int, layers: int, *,
              scan_layers: bool = True):
    config = jaxrubric.tiny_config(
        "qwen3", vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden,
        num_layers=layers, num_heads=4, num_kv_heads=2, head_dim=hidden // 4,
        eos_token_ids=(tokenizer.eos_token_id,), pad_token_id=tokenizer.pad_token_id,
        vocab_multiple=shd.vocab_multiple(mesh), scan_layers=scan_layers)
    return shd.shard_model(jaxrubric.init_model(config, seed=seed), mesh)


def sft_batches(tokenizer: Any, make, rng: random.Random, size: int, multiple: int = 8
                ) -> Iterator[sft.SFTBatch]:
    """Endless SFT batches of `make(rng, size)` pairs, each padded to a multiple of `multiple`
    tokens (few distinct widths: few compilations)."""
    while True:
        prompts, targets = make(rng, size)
        width = max(len(p) + len(t) for p, t in zip(prompts, targets))
        width = -(-width // multiple) * multiple
        yield sft.encode_examples(None, prompts, targets, max_len=width,
                                  pad_id=tokenizer.pad_token_id)


def sft_optimizer(lr: float, steps: int) -> optax.GradientTransformation:
    """AdamW with a short warm-up and a cosine decay to a tenth of `lr`: every warm start's."""
    return optax.adamw(optax.warmup_cosine_decay_schedule(
        0.0, lr, min(50, steps // 5), steps, end_value=lr / 10))


# All that the verifier's warm start reads of a world's config: two configs that agree on these
# train the same verifier (the GenRubric world trains the DynamicRubric world's; the toy-world
# tests train it once for both).
VERIFIER_SETTINGS = ("seed", "max_item_tokens", "verifier_steps", "verifier_items",
                     "verifier_malformed", "verifier_stray", "verifier_hidden_size",
                     "verifier_layers", "sft_batch", "sft_lr")


def verifier_settings(cfg: ToyWorldConfig) -> ToyWorldConfig:
    """`cfg` with everything but `VERIFIER_SETTINGS` at its default."""
    return ToyWorldConfig(**{key: getattr(cfg, key) for key in VERIFIER_SETTINGS})


def warm_start(role: str, workdir: Path, tokenizer: Any, mesh, cfg: ToyWorldConfig) -> Path:
    """Trains one role by SFT and saves it as an HF checkpoint (skipped when saved before)."""
    out = workdir / "models" / role
    if (out / "config.json").exists():
        return out
    rng = random.Random(f"{cfg.seed}-{role}")
    if role == "verifier":
        cfg = verifier_settings(cfg)  # so that it can read nothing else
        model = new_model(tokenizer, mesh, cfg.seed + 3, cfg.verifier_hidden_size,
                           cfg.verifier_layers)
        make = None
        steps = cfg.verifier_steps
    elif role == "policy":
        model = new_model(tokenizer, mesh, cfg.seed + 1, cfg.hidden_size, cfg.num_layers)
        make = lambda r, n: policy_examples(  # noqa: E731
            tokenizer, r, n, cfg.policy_p_correct, cfg.policy_mistakes, cfg.policy_stray)
        steps, lr = cfg.policy_steps, cfg.sft_lr
    else:  # generator_cold, or generator_cold_static for the static baseline
        model = new_model(tokenizer, mesh, cfg.seed + 2, cfg.hidden_size, cfg.num_layers)
        static = role.endswith("_static")
        make = lambda r, n: generator_examples(tokenizer, r, n, cfg, static)  # noqa: E731
        steps, lr = cfg.generator_steps, cfg.generator_sft_lr
    print(f"warm start: {role} ({steps} supervised steps)", flush=True)
    if role == "verifier":
        history = train_verifier(model, tokenizer, mesh, cfg, rng, steps)
    else:
        _, history = sft.train_sft(model, sft_optimizer(lr, steps),
                                   sft_batches(tokenizer, make, rng, cfg.sft_batch),
                                   steps=steps, log_every=max(1, steps // 10))
    jaxrubric.save_pretrained(model, out)
    (out / "sft_history.json").write_text(json.dumps(history, indent=1))
    return out


# ---------------------------------------------------------------------------- co-evolution
def toy_run_config(workdir: Path, paths: dict[str, Path], generator: Path, *, seed: int,
                   batch_size: int, eval_batch_size: int, num_rubrics: int, max_items: int,
                   max_item_tokens: int, generator_beta: float, generator_lr: float,
                   rounds: int, eval_every: int) -> ml_collections.ConfigDict:
    """What every toy run's training config shares (either world's): the workdir's tokenizer,
    models and data, the toy's short budgets and compact templates, and a schedule that
    evaluates and checkpoints every `eval_every` rounds, keeping the last checkpoint."""
    c = base_config()
    c.seed = seed
    c.tokenizer = str(workdir / "tokenizer")
    c.policy.path = str(workdir / "models" / "policy")
    c.generator.path = str(generator)
    c.verifier.path = str(workdir / "models" / "verifier")
    c.data.train = str(paths["train"])
    c.data.eval = str(paths["eval"])
    c.data.batch_size = batch_size
    c.data.eval_batch_size = eval_batch_size
    c.data.prompt_tokens = 12
    c.data.anchor_tokens = 8  # the held-out answers' budget
    c.rubric.max_items = max_items
    c.rubric.max_item_tokens = max_item_tokens
    c.rubric.template_style = "compact"
    c.round.num_rubrics = num_rubrics
    c.round.response_tokens = 8
    c.round.logprob_chunk = 16
    c.round.generator.beta = generator_beta
    c.optim.generator_lr = generator_lr
    c.rounds = rounds
    c.eval_every = eval_every
    c.checkpoint_every = eval_every
    c.keep_checkpoints = 1
    c.log_every = 1
    return c


def train_toy_run(name: str, workdir: Path, config: ml_collections.ConfigDict,
                  oracle: Any = None) -> Path:
    """Trains one toy run in `workdir/runs/name` (resuming it if it was interrupted); a SIGTERM
    stops the whole world, not just the run."""
    from jaxrubric.train import train

    run_dir = workdir / "runs" / name
    print(f"run: {name}", flush=True)
    if train(config, run_dir, oracle=oracle)["preempted"]:
        raise SystemExit(f"stopped by SIGTERM in the {name} run; rerun to resume")
    return run_dir


def run_config(name: str, workdir: Path, paths: dict[str, Path], cfg: ToyWorldConfig,
               generator: Path) -> ml_collections.ConfigDict:
    """The training config of one toy run; `name` is a run of `RUNS`, or "generator" /
    "generator_static" (the generator's rounds against the frozen warm-started policy)."""
    c = toy_run_config(workdir, paths, generator, seed=cfg.seed, batch_size=cfg.batch_size,
                       eval_batch_size=cfg.eval_batch_size, num_rubrics=cfg.num_rubrics,
                       max_items=cfg.max_items, max_item_tokens=cfg.max_item_tokens,
                       generator_beta=cfg.generator_beta, generator_lr=cfg.generator_lr,
                       rounds=cfg.rounds, eval_every=cfg.eval_every)
    c.oracle = "toy_digits"
    c.data.policy_tokens = POLICY_TOKENS
    c.data.num_anchors = cfg.num_anchors
    c.round.num_responses = cfg.num_responses
    c.round.policy_score = cfg.policy_score
    c.round.anchor_weight = cfg.anchor_weight
    c.round.policy.beta = cfg.policy_beta
    c.round.policy.advantage_mode = cfg.policy_advantage_mode or c.round.generator.advantage_mode
    c.round.generator.kl = cfg.generator_kl
    c.round.generator.temperature = cfg.generator_temperature
    c.round.generator.entropy = cfg.generator_entropy
    c.round.item_credit = cfg.item_credit
    c.optim.policy_lr = cfg.policy_lr
    # Which roles train and what rewards the policy are inputs of the compiled round, so the
    # generators' rounds and the compared runs share two programs (dynamic and static rubrics)
    # through the compilation cache instead of compiling one each.
    c.round.runtime_switches = True
    # The held-out batch is sampled and verified in pieces the size of a round's batch.
    c.round.eval_micro_batches = max(
        m for m in range(1, max(1, cfg.eval_batch_size // cfg.batch_size) + 1)
        if cfg.eval_batch_size % m == 0)
    static = name in STATIC_RUNS or name == "generator_static"
    if static:
        c.round.rubric_source = "static"
    if cfg.explorer_rubrics:
        c.round.explorer_rubrics = cfg.explorer_rubrics
        c.generator.explorer = str(
            workdir / "models" / ("generator_cold_static" if static else "generator_cold"))
    if name.startswith("generator"):
        c.rounds = cfg.generator_rounds
        c.round.policy.freeze = True
        # No held-out evaluation: nothing reads it (the compared runs evaluate this generator
        # at their round 0); without its two evaluations and their compile the stage took 26 s
        # instead of 44 s, with the same weights.
        c.data.eval = ""
        c.eval_every = 0
    elif cfg.generator_reference == "cold_start" and name in ("coevolve", *STATIC_RUNS):
        cold = "generator_cold_static" if name in STATIC_RUNS else "generator_cold"
        c.generator.reference = str(workdir / "models" / cold)
    elif name == "frozen":
        c.round.generator.freeze = True
    elif name == "oracle":
        c.round.policy_reward = "oracle"
        c.round.generator.freeze = True
    check_config(c)
    return c


def _train_run(name: str, workdir: Path, paths: dict[str, Path], cfg: ToyWorldConfig,
               generator: Path) -> Path:
    return train_toy_run(name, workdir, run_config(name, workdir, paths, cfg, generator),
                         oracle=task.oracle_reward)


def trained_generator(workdir: Path, paths: dict[str, Path], cfg: ToyWorldConfig,
                      static: bool = False) -> Path:
    """The generator after its rounds against the warm-started (frozen) policy: the evaluator
    every run starts from (`static`: the prompt-only generator of the static baseline, trained
    the same way from its own cold start)."""
    from jaxrubric.train import export

    suffix = "_static" if static else ""
    out = workdir / "models" / f"generator{suffix}"
    if not (out / "config.json").exists():
        run_dir = _train_run(f"generator{suffix}", workdir, paths, cfg,
                             workdir / "models" / f"generator_cold{suffix}")
        export(run_dir, "generator", out, oracle=task.oracle_reward)
    return out


def stale_generator(workdir: Path, paths: dict[str, Path], cfg: ToyWorldConfig) -> Path:
    """The frozen run's evaluator: the answer-seeing generator's own run (after
    `trained_generator` exported its start) resumed for `cfg.stale_rounds` more rounds against
    the warm-started policy, so it ends as trained as the co-evolving generator will be."""
    from jaxrubric.train import export

    out = workdir / "models" / "generator_stale"
    if not (out / "config.json").exists():
        trained_generator(workdir, paths, cfg)
        config = run_config("generator", workdir, paths, cfg,
                            workdir / "models" / "generator_cold")
        config.rounds = cfg.generator_rounds + cfg.stale_rounds
        run_dir = train_toy_run("generator", workdir, config, oracle=task.oracle_reward)
        export(run_dir, "generator", out, oracle=task.oracle_reward)
    return out


def run_generator(workdir: Path, cfg: ToyWorldConfig, name: str) -> Path:
    """The generator checkpoint run `name` starts from."""
    if name in STATIC_RUNS:
        return workdir / "models" / "generator_static"
    if name == "frozen" and cfg.stale_rounds:
        return workdir / "models" / "generator_stale"
    return workdir / "models" / "generator"


def held_out_rows(workdir: Path) -> list[dict[str, Any]]:
    """The held-out anchor lists `write_data` wrote, in order."""
    return [json.loads(line) for line in
            (workdir / "data" / "eval.jsonl").read_text().splitlines()]


def final_evaluation(workdir: Path, cfg: ToyWorldConfig) -> dict[str, list[float]]:
    """Every run's last policy on every held-out question, `cfg.final_samples` answers each,
    all runs from one sampling key (`toy/final_eval.py`): per run, each question's mean
    quality, written to `final_eval.json`. Redone whenever the world runs (about 8 s), so it
    always reads the runs' current checkpoints."""
    from jaxrubric.train import export

    seed = cfg.seed + FINAL_KEY_OFFSET
    tokenizer = use_workdir(workdir)
    questions = [row["prompt"] for row in held_out_rows(workdir)]
    prompts = [policy_prompt(tokenizer, q) for q in questions]
    per_question = {}
    for name in cfg.runs:
        model_dir = export(workdir / "runs" / name, "policy", workdir / "exported" / name,
                           oracle=task.oracle_reward)
        per_question[name] = final_eval.per_question_quality(
            model_dir, tokenizer, questions, prompts, task.quality, samples=cfg.final_samples,
            seed=seed, max_new_tokens=POLICY_TOKENS)
    path = workdir / FINAL_FILE
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps({"samples": cfg.final_samples, "seed": seed,
                                   "per_question": per_question}))
    partial.replace(path)  # a crash leaves the last complete file
    return per_question


# ---------------------------------------------------------------------------------- result
CURVES = ("quality", "quality_se", "delta_gap", "delta_gap_se", "pair_accuracy",
          "anchor_delta_gap")


def quality_curves(workdir: Path, runs: tuple[str, ...]) -> dict[str, list[dict[str, float]]]:
    """Per run, every evaluated round's held-out quality (with its standard error), Δgap and
    pair accuracy on the policy's own answers, and Δgap on the held-out anchor lists."""
    curves = {}
    for name in runs:
        history = read_eval_history(workdir / "runs" / name)
        curves[name] = [{"round": h["round"], **{k: h.get(f"eval/{k}") for k in CURVES}}
                        for h in history]
    return curves


def summarize(workdir: Path, cfg: ToyWorldConfig) -> dict[str, Any]:
    """Writes `summary.json` and `quality.png`, prints the table, returns the summary."""
    curves = quality_curves(workdir, cfg.runs)
    summary = {name: [p["quality"] for p in curve] for name, curve in curves.items()}
    summary["rounds"] = [p["round"] for p in next(iter(curves.values()))]
    for key in CURVES[1:]:
        summary[key] = {name: [p[key] for p in c] for name, c in curves.items()}
    if (workdir / FINAL_FILE).exists():  # the world's last stage
        final = json.loads((workdir / FINAL_FILE).read_text())
        summary["final"] = final_eval.final_summary(final["per_question"], LEADS,
                                                    final["samples"])
    summary["config"] = dataclasses.asdict(cfg)
    (workdir / "summary.json").write_text(json.dumps(summary, indent=1))
    plot(summary, workdir / "quality.png", cfg.runs)
    print(table(summary, cfg.runs))
    return summary


def table(summary: dict[str, Any], runs: tuple[str, ...]) -> str:
    lines = ["round  " + "  ".join(f"{r:>8}" for r in runs)]
    for i, round_ in enumerate(summary["rounds"]):
        lines.append(f"{round_:5d}  " + "  ".join(f"{summary[r][i]:8.3f}" for r in runs))
    se = max(max(v) for v in summary["quality_se"].values())
    gaps = "  ".join(f"{r} {summary['delta_gap'][r][-1]:.3f}" for r in runs)
    text = ("held-out quality of the policy (1 = exactly the big digits; standard error "
            f"<= {se:.3f})\n" + "\n".join(lines)
            + f"\nΔgap on each run's own answers at the last evaluation: {gaps}")
    final = summary.get("final")
    if final:
        quality = "  ".join(f"{r} {final['quality'][r]:.3f} ± {final['quality_se'][r]:.3f}"
                            for r in runs)
        leads = "  ".join(f"{pair} {v['mean']:+.3f} ± {1.96 * v['se']:.3f}"
                          for pair, v in final["leads"].items())
        text += (f"\nfinal evaluation ({final['samples']} answers per question, the same "
                 f"draws for every run): {quality}\nleads, paired by question (95%): {leads}")
    return text


def plot(summary: dict[str, Any], path: Path, runs: tuple[str, ...]) -> None:
    """Two panels: the policy's held-out quality, and the evaluator's Δgap (how far its rubric
    scores separate better from worse reference answers) per evaluated round."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = {"coevolve": "co-evolving generator", "frozen": "frozen generator (stale)",
              "static": "static rubric (prompt only)", "oracle": "ground-truth reward (ceiling)"}
    fig, (quality, gap) = plt.subplots(1, 2, figsize=(10, 3.6), dpi=110)
    for name in runs:
        quality.errorbar(summary["rounds"], summary[name], yerr=summary["quality_se"][name],
                         marker="o", ms=3, capsize=2, label=labels[name])
        gap.plot(summary["rounds"], summary["delta_gap"][name], marker="o", ms=3,
                 label=labels[name])
    quality.set(xlabel="co-evolution round", ylabel="held-out quality",
                title="Policy: keep the big digits")
    gap.set(xlabel="co-evolution round", ylabel="Δgap on the policy's own answers",
            title="Evaluator: better minus worse answer's score")
    for ax in (quality, gap):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def prepare_workdir(workdir: str | Path, cfg: Any) -> tuple[Path, Any]:
    """A world's workdir made (absolute), its config (a dataclass) saved, and the toy tokenizer
    built there once; then `use_workdir`: returns the workdir and the tokenizer.

    A workdir that a world with another config (other than its `REUSABLE_SETTINGS`) was saved
    in is refused before anything loads: its cached warm starts and runs would be reused as if
    they were this config's (a default changed since, or another setting)."""
    workdir = Path(workdir).absolute()
    workdir.mkdir(parents=True, exist_ok=True)
    saved, config = workdir / "toy_config.json", json.loads(json.dumps(dataclasses.asdict(cfg)))
    if saved.exists():
        before = json.loads(saved.read_text())
        unset = "(not set)"
        differ = [f"{key}: {before.get(key, unset)!r} there, {config.get(key, unset)!r} now"
                  for key in sorted((before.keys() | config.keys()) - set(REUSABLE_SETTINGS))
                  if before.get(key, unset) != config.get(key, unset)]
        if differ:
            raise ConfigMismatchError(
                f"{workdir} holds a toy world built with another config ({'; '.join(differ)}): "
                "its cached warm starts and runs would be reused. Use a new workdir, or delete "
                "this one.")
    saved.write_text(json.dumps(config, indent=1))
    if not (workdir / "tokenizer" / "tokenizer.json").exists():
        task.build_tokenizer(workdir / "tokenizer")
    return workdir, use_workdir(workdir)


def use_workdir(workdir: Path) -> Any:
    """This process's JAX compilation cache turned on in the workdir (shared by the world's
    processes: a program compiled by one stage is read by the next), and the toy tokenizer.
    Every program is cached, the sub-second ones too: a run stage compiles ~40 of those
    (eager operations, initialisation), and reading them back halves their time."""
    jax.config.update("jax_compilation_cache_dir", str(workdir / "jax_cache"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    return jaxrubric.load_tokenizer(workdir / "tokenizer")


def _warm_start_stage(workdir: Path, cfg: ToyWorldConfig, role: str) -> None:
    warm_start(role, workdir, use_workdir(workdir), shd.make_mesh({"fsdp": -1}), cfg)


def _generator_stage(workdir: Path, cfg: ToyWorldConfig, static: bool) -> None:
    use_workdir(workdir)
    trained_generator(workdir, write_data(workdir, cfg), cfg, static=static)


def _stale_stage(workdir: Path, cfg: ToyWorldConfig) -> None:
    use_workdir(workdir)
    stale_generator(workdir, write_data(workdir, cfg), cfg)


def _run_stage(workdir: Path, cfg: ToyWorldConfig, name: str) -> None:
    use_workdir(workdir)
    _train_run(name, workdir, write_data(workdir, cfg), cfg, run_generator(workdir, cfg, name))


def world_stages(workdir: Path, cfg: ToyWorldConfig) -> list[stages_lib.Stage]:
    """The world's stages in a serial order, each with what it reads: the warm starts, the
    generators' own rounds (each against the warm-started policy, judged by the verifier),
    the stale evaluator's further rounds, then the compared runs, each from its generator."""
    Stage = stages_lib.Stage
    static = any(name in STATIC_RUNS for name in cfg.runs)
    colds = ("generator_cold", *(("generator_cold_static",) if static else ()))
    graph = [Stage(f"warm start: {role}", _warm_start_stage, (workdir, cfg, role))
             for role in ("verifier", "policy", *colds)]
    judged = ("warm start: verifier", "warm start: policy")
    graph.append(Stage("generator rounds", _generator_stage, (workdir, cfg, False),
                       (*judged, "warm start: generator_cold")))
    if static:
        graph.append(Stage("generator rounds: static", _generator_stage, (workdir, cfg, True),
                           (*judged, "warm start: generator_cold_static")))
    stale = "frozen" in cfg.runs and cfg.stale_rounds > 0
    if stale:
        graph.append(Stage("generator rounds: stale", _stale_stage, (workdir, cfg),
                           ("generator rounds",)))

    def start(name: str) -> str:
        if name in STATIC_RUNS:
            return "generator rounds: static"
        return "generator rounds: stale" if name == "frozen" and stale else "generator rounds"

    graph += [Stage(f"run: {name}", _run_stage, (workdir, cfg, name), (start(name),))
              for name in cfg.runs]
    graph.append(Stage("final evaluation", final_evaluation, (workdir, cfg),
                       tuple(f"run: {name}" for name in cfg.runs)))
    return graph


def run_toy_world(workdir: str | Path, cfg: ToyWorldConfig = ToyWorldConfig(),
                  jobs: int = 1) -> dict[str, Any]:
    """The whole toy world (see the module docstring), its stages in order in this process, or
    side by side in `jobs` worker processes (`toy/stages.py`); returns the summary. The results
    do not depend on `jobs`."""
    workdir, _ = prepare_workdir(workdir, cfg)
    write_data(workdir, cfg)
    run_world(workdir, world_stages(workdir, cfg), jobs)
    return summarize(workdir, cfg)


def run_world(workdir: Path, graph: list[stages_lib.Stage], jobs: int) -> None:
    """Runs either world's stage graph (`toy/stages.py`), each stage's seconds and the whole
    world's wall clock ("world") kept in `workdir/timings.json`."""
    timings = StageTimer(workdir / "timings.json")
    start = time.perf_counter()
    stages_lib.run_stages(graph, timings, jobs, workdir / "logs")
    timings.record("world", time.perf_counter() - start)
