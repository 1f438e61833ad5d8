"""The toy verifier's warm start, one for both worlds: supervised training on the checker's
labels of (question, answer, criterion), through the tree forward a round judges with.

`VerifierSettings` is all it reads, so two worlds whose settings agree train the same
verifier (the GenRubric world uses the DynamicRubric world's; the suite trains it once).
"""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path
from typing import Any

import jax
import numpy as np

from jaxrubric import sharding as shd
from jaxrubric.rubric import templates as tpl
from jaxrubric.toy import digits_task as task
from jaxrubric.toy import supervised
from jaxrubric.toy.tokens import template_ids, text_ids


@dataclasses.dataclass(frozen=True)
class VerifierSettings:
    """What the verifier's warm start reads of a world's config; the `verifier_*` defaults
    are both worlds'."""

    seed: int = 0
    max_item_tokens: int = 7  # the longest item the grammar lets a generator write
    # Long enough that a verifier trained with stray letters judges the items about them as
    # reliably as the digits' (`diagnostics.verifier_accuracy`); shorter, it did not.
    verifier_steps: int = 450
    verifier_items: int = 12  # labelled criteria per (question, answer) in one tree forward
    # Share of those criteria outside the language (`digits_task.malformed_criterion`,
    # labelled "no" as the checker labels them). A verifier that never saw one judges the
    # generator's malformed items arbitrarily, and the generator may learn to write nothing
    # else (one wrote only "] ] ] ]", read as "the answer is short"); with them its items stay
    # mostly in the language.
    verifier_malformed: float = 0.25
    # Share of the verifier's training answers with a stray letter (`digits_task.
    # with_stray_letter`), and of its valid criteria about a letter (`stray_criterion`): so it
    # judges "omits x" as it judges the digits' items (a smaller share left it near chance on
    # them).
    verifier_stray: float = 0.5
    verifier_hidden_size: int = 64
    verifier_layers: int = 3
    sft_batch: int = 64
    sft_lr: float = 1e-3


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
                   cfg: VerifierSettings) -> dict[str, np.ndarray]:
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


def train_verifier(model: Any, tokenizer: Any, mesh: Any, cfg: VerifierSettings,
                   rng: random.Random, steps: int) -> list[dict[str, float]]:
    """Supervised training of the verifier on checker labels through the tree forward
    (`verifier.verdict_loss`): `verifier_items` labelled criteria per (question, answer) per
    forward."""
    from flax import nnx

    from jaxrubric.rl.grpo import grpo_update
    from jaxrubric.rubric import verifier as ver

    readout = ver.verifier_readout(tokenizer, tpl.verifier_template(tokenizer, style="compact"))
    graph, params = nnx.split(model, nnx.Param)
    optimizer = supervised.sft_optimizer(cfg.sft_lr, steps)
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


def warm_start_verifier(workdir: Path, tokenizer: Any, mesh: Any, cfg: VerifierSettings
                        ) -> Path:
    """Trains the verifier and saves it at `workdir/models/verifier` (skipped when saved
    before)."""
    out = workdir / "models" / "verifier"
    if supervised.saved(out):
        return out
    rng = random.Random(f"{cfg.seed}-verifier")
    model = supervised.new_model(tokenizer, mesh, cfg.seed + 3, cfg.verifier_hidden_size,
                                 cfg.verifier_layers)
    print(f"warm start: verifier ({cfg.verifier_steps} supervised steps)", flush=True)
    history = train_verifier(model, tokenizer, mesh, cfg, rng, cfg.verifier_steps)
    return supervised.save_warm_start(model, out, history)
