"""GenRubric's toy world: self-evolution that measurably raises agreement with an expert rubric.

`run_genrubric_world(workdir)` (``jaxrubric train --method genrubric``) builds the big-digits
world with signed rubrics (`jaxrubric.toy.signed_rubrics`) and runs GenRubric on it, every role
a real transformer LM from our own model code:

1. the toy tokenizer, unlabeled training queries, and held-out rows in HealthBench's schema:
   seven-digit queries, each with its expert rubric (from the checker) and eight responses of
   distinct expert scores;
2. warm starts by supervised fine-tuning: the **verifier** of the DynamicRubric world (checker
   labels of (query, answer, criterion), malformed criteria labelled "no"), frozen; the
   **answerer** (the policy) to follow the rubric it is shown (`signed_rubrics.follow`), in
   stages until it follows most of what fresh rubrics name (`answerer_follows`), frozen too,
   as the paper self-evolves the generator against a fixed answering and judging setup; the
   **generator** on signed rubrics written from the query alone, each item sound
   with probability `teacher_informed` and random otherwise;
3. two GenRubric runs of `jaxrubric.train.train` from that cold start: **evolving** (the
   method) and **control** (the same updates with each query's rewards shuffled among its
   groups, `round.shuffle_generator_credit`: what sharpening the sampled distribution does on
   its own). Every `eval_every` rounds the training loop writes R rubrics (and a greedy one)
   per held-out query and the verifier judges the eight responses under them and under the
   expert rubric (`eval/agreement/*`, `eval_scores.jsonl`);
4. `summary.json`: per evaluated round, Spearman, Kendall tau-b, Top-1 and pairwise accuracy
   of each run, and of the evolving run with the checker as the judge (the generator's
   learning without the verifier's errors), the rise from the cold start with a bootstrap
   interval over queries; `agreement.png` and a printed table.

Why the rewards teach agreement here. An answerer that follows its rubric gets right every
digit a sound item names, wrong every digit an unsound item names, and guesses the rest. So a
rubric with more sound items on more of the query's digits induces an answer that the query's
other rubrics (sound on average, since a random item is as often right as wrong) score higher:
cross-rubric comprehensiveness rewards exactly what the expert rubric states.

The warm starts are the same for every config that agrees on what they read
(`START_SETTINGS`): the default seed's ship with the package (`toy/warm_starts.py`), so the
default world trains only the two runs; `from_scratch` trains them here. Every step writes
into `workdir` and is skipped when its output is already there: a rerun resumes.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import ml_collections

from jaxrubric import sharding as shd
from jaxrubric.config import check_config
from jaxrubric.methods.genrubric import GenRubricConfig
from jaxrubric.toy import digits_task as task
from jaxrubric.toy import signed_rubrics as sr
from jaxrubric.toy import stages as stages_lib
from jaxrubric.toy import warm_starts
from jaxrubric.toy.genrubric_config import GenRubricWorldConfig
from jaxrubric.toy.genrubric_report import summarize
from jaxrubric.toy.genrubric_warm_starts import (
    FOLLOWING,
    ROLES,
    rubric_following,
    warm_start,
)
from jaxrubric.toy.runs import toy_run_config, train_toy_run
from jaxrubric.toy.workdir import prepare_workdir, run_world, use_workdir

METHOD = "genrubric"
# What the stages before the runs write in the workdir (`start_stages`).
START_OUTPUTS = ("models", FOLLOWING)


def write_data(workdir: Path, cfg: GenRubricWorldConfig) -> dict[str, Path]:
    """Training queries (the anchor schema the loader reads; GenRubric reads the query only)
    and the held-out expert rows (HealthBench schema), as JSONL from the seed."""
    paths = {"train": workdir / "data" / "train.jsonl", "eval": workdir / "data" / "eval.jsonl"}
    rows = {"train": lambda: task.anchor_rows(2000, cfg.seed, 2, "distinct"),
            "eval": lambda: sr.expert_rows(cfg.eval_queries, cfg.seed + 10_000)}
    for name, path in paths.items():
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("".join(json.dumps(r) + "\n" for r in rows[name]()))
    return paths


def run_round(name: str, cfg: GenRubricWorldConfig) -> GenRubricConfig:
    """The world's round for run `name`: the control's generator credit shuffled among the
    query's well-formed groups."""
    return dataclasses.replace(cfg.round, shuffle_generator_credit=name == "control")


def run_config(name: str, workdir: Path, paths: dict[str, Path], cfg: GenRubricWorldConfig
               ) -> ml_collections.ConfigDict:
    """The training config of one run of `RUNS`."""
    c = toy_run_config(
        workdir, paths, workdir / "models" / "generator_cold", run_round(name, cfg),
        method=METHOD, seed=cfg.seed, batch_size=cfg.batch_size,
        eval_batch_size=cfg.eval_queries, max_items=cfg.max_items,
        max_item_tokens=cfg.max_item_tokens, generator_lr=cfg.generator_lr, rounds=cfg.rounds,
        eval_every=cfg.eval_every)
    c.data.eval_rubric_runs = cfg.eval_rubric_runs
    c.optim.lr_schedule = cfg.generator_lr_schedule  # the generator is the one trained role
    check_config(c)
    return c


def _warm_start_stage(workdir: Path, cfg: GenRubricWorldConfig, role: str) -> None:
    warm_start(role, workdir, use_workdir(workdir), shd.make_mesh({"fsdp": -1}),
               cfg.starts_only())


def _following_stage(workdir: Path, cfg: GenRubricWorldConfig) -> None:
    use_workdir(workdir)
    following = workdir / FOLLOWING
    if not following.exists():  # an answerer saved before its warm start wrote the check
        following.write_text(json.dumps(rubric_following(workdir, cfg.starts_only()), indent=1))
    print(f"rubric following of the answerer: {following.read_text()}", flush=True)


def _run_stage(workdir: Path, cfg: GenRubricWorldConfig, name: str) -> None:
    use_workdir(workdir)
    train_toy_run(name, workdir, run_config(name, workdir, write_data(workdir, cfg), cfg))


def start_stages(workdir: Path, cfg: GenRubricWorldConfig) -> list[stages_lib.Stage]:
    """The stages before the runs, in a serial order: three warm starts and the answerer's
    rubric-following check."""
    Stage = stages_lib.Stage
    graph = [Stage(f"warm start: {role}", _warm_start_stage, (workdir, cfg, role))
             for role in ROLES]
    graph.append(Stage("rubric following", _following_stage, (workdir, cfg),
                       ("warm start: policy",)))
    return graph


def world_stages(workdir: Path, cfg: GenRubricWorldConfig) -> list[stages_lib.Stage]:
    """The world's stages in a serial order, each with what it reads: `start_stages`, then the
    compared runs (each reads all three roles)."""
    return start_stages(workdir, cfg) + [
        stages_lib.Stage(f"run: {name}", _run_stage, (workdir, cfg, name),
                         tuple(f"warm start: {role}" for role in ROLES))
        for name in cfg.runs]


def run_genrubric_world(workdir: str | Path, cfg: GenRubricWorldConfig = GenRubricWorldConfig(),
                        jobs: int = 1, from_scratch: bool = False) -> dict[str, Any]:
    """The whole GenRubric world (see the module docstring), its stages in order in this
    process, or side by side in `jobs` worker processes (`toy/stages.py`); returns the summary.
    The shipped starts are used where they are this config's, unless `from_scratch`
    (`toy/warm_starts.py`). The results depend on neither `jobs` nor where the starts came
    from, only on the starts themselves."""
    workdir, tokenizer = prepare_workdir(workdir, cfg)
    warm_starts.provide(workdir, tokenizer, METHOD, cfg, START_OUTPUTS, from_scratch)
    write_data(workdir, cfg)
    run_world(workdir, world_stages(workdir, cfg), jobs)
    return summarize(workdir, cfg)
