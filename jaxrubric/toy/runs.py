"""What every toy run's training config shares (either world's), and training one run in a
world's workdir."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import ml_collections

from jaxrubric.config import base_config
from jaxrubric.methods.round_config import RoundConfig

# The round settings both worlds share: the toy's short answers and rubrics (a world's round
# config starts from these).
TOY_ROUND = {"response_tokens": 8, "logprob_chunk": 16}


def toy_run_config(workdir: Path, paths: dict[str, Path], generator: Path, round_config:
                   RoundConfig, *, method: str, seed: int, batch_size: int,
                   eval_batch_size: int, max_items: int, max_item_tokens: int,
                   generator_lr: float, rounds: int, eval_every: int
                   ) -> ml_collections.ConfigDict:
    """A run of `method` with `round_config` as its round: the workdir's tokenizer, models and
    data, the toy's short budgets and compact templates, and a schedule that evaluates and
    checkpoints every `eval_every` rounds, keeping the last checkpoint."""
    c = base_config(method)
    c.round = ml_collections.ConfigDict(dataclasses.asdict(round_config))
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
