"""The DynamicRubric toy world's runs: the generators' own rounds against the warm-started
policy, the stale evaluator, and the compared runs, each a `jaxrubric.train.train` run in the
workdir."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import ml_collections

from jaxrubric.config import check_config
from jaxrubric.methods.dynamic_rubric import DynamicRubricConfig
from jaxrubric.toy import config_tree, supervised
from jaxrubric.toy import digits_task as task
from jaxrubric.toy.runs import toy_run_config, train_toy_run
from jaxrubric.toy.world_config import POLICY_TOKENS, STATIC_RUNS, ToyWorldConfig


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


def held_out_rows(workdir: Path) -> list[dict[str, Any]]:
    """The held-out anchor lists `write_data` wrote, in order."""
    return [json.loads(line) for line in
            (workdir / "data" / "eval.jsonl").read_text().splitlines()]


def run_round(name: str, cfg: ToyWorldConfig) -> DynamicRubricConfig:
    """The world's round (`cfg.round`) with run `name`'s switches: the prompt-only generator
    for the static runs, the frozen role or the ground truth as the policy's reward; the held-out
    batch sampled and verified in pieces the size of a round's batch unless the round says."""
    settings: dict[str, object] = {}
    if not cfg.round.eval_micro_batches:
        settings["eval_micro_batches"] = max(
            m for m in range(1, max(1, cfg.eval_batch_size // cfg.batch_size) + 1)
            if cfg.eval_batch_size % m == 0)
    if name in STATIC_RUNS or name == "generator_static":
        settings["rubric_source"] = "static"
    if name.startswith("generator"):
        settings["policy.freeze"] = True
    elif name == "frozen" or name == "oracle":
        settings["generator.freeze"] = True
        if name == "oracle":
            settings["policy_reward"] = "oracle"
    return config_tree.replace(cfg.round, settings)


def run_config(name: str, workdir: Path, paths: dict[str, Path], cfg: ToyWorldConfig,
               generator: Path) -> ml_collections.ConfigDict:
    """The training config of one toy run; `name` is a run of `RUNS`, or "generator" /
    "generator_static" (the generator's rounds against the frozen warm-started policy)."""
    round_config = run_round(name, cfg)
    c = toy_run_config(workdir, paths, generator, round_config, method="dynamic_rubric",
                       seed=cfg.seed, batch_size=cfg.batch_size,
                       eval_batch_size=cfg.eval_batch_size, max_items=cfg.max_items,
                       max_item_tokens=cfg.max_item_tokens, generator_lr=cfg.generator_lr,
                       rounds=cfg.rounds, eval_every=cfg.eval_every)
    c.oracle = "toy_digits"
    c.data.policy_tokens = POLICY_TOKENS
    c.data.num_anchors = cfg.num_anchors
    c.optim.policy_lr = cfg.policy_lr
    static = round_config.rubric_source == "static"
    if cfg.round.explorer_rubrics:
        c.generator.explorer = str(
            workdir / "models" / ("generator_cold_static" if static else "generator_cold"))
    if name.startswith("generator"):
        c.rounds = cfg.generator_rounds
        # No held-out evaluation: nothing reads it (the compared runs evaluate this generator
        # at their round 0), and without it the stage skips two evaluations and their compile,
        # with the same weights.
        c.data.eval = ""
        c.eval_every = 0
    elif cfg.generator_reference == "cold_start" and name in ("coevolve", *STATIC_RUNS):
        cold = "generator_cold_static" if name in STATIC_RUNS else "generator_cold"
        c.generator.reference = str(workdir / "models" / cold)
    check_config(c)
    return c


def train_run(name: str, workdir: Path, paths: dict[str, Path], cfg: ToyWorldConfig,
              generator: Path) -> Path:
    """Trains run `name` (`run_config`) from `generator`, with the task's ground truth."""
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
    if not supervised.saved(out):
        run_dir = train_run(f"generator{suffix}", workdir, paths, cfg,
                            workdir / "models" / f"generator_cold{suffix}")
        export(run_dir, "generator", out, oracle=task.oracle_reward)
    return out


def stale_generator(workdir: Path, paths: dict[str, Path], cfg: ToyWorldConfig) -> Path:
    """The frozen run's evaluator: the answer-seeing generator's own run (after
    `trained_generator` exported its start) resumed for `cfg.stale_rounds` more rounds against
    the warm-started policy, so it ends as trained as the co-evolving generator will be."""
    from jaxrubric.train import export

    out = workdir / "models" / "generator_stale"
    if not supervised.saved(out):
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
