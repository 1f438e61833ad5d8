"""The DynamicRubric toy world's warm starts by supervised fine-tuning: the policy to
middling quality, with the mistakes the world is built on, and the generators' cold starts
on partly sound teacher rubrics (the verifier's is `toy/verifier_sft.py`, shared)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from jaxrubric import sft
from jaxrubric.rubric import templates as tpl
from jaxrubric.toy import digits_task as task
from jaxrubric.toy import supervised
from jaxrubric.toy.tokens import policy_prompt, template_ids, text_ids
from jaxrubric.toy.verifier_sft import warm_start_verifier
from jaxrubric.toy.world_config import ToyWorldConfig

ROLES = ("verifier", "policy", "generator_cold", "generator_cold_static")


def policy_examples(tokenizer: Any, rng: random.Random, n: int, p_correct: float,
                    mistakes: str, stray: float = 0.0) -> tuple[list, list]:
    """(policy prompt, warm-start answer) pairs (`digits_task.policy_warm_start_answer`)."""
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
    shown_count = 0 if static else cfg.round.num_responses
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


def warm_start(role: str, workdir: Path, tokenizer: Any, mesh: Any, cfg: ToyWorldConfig
               ) -> Path:
    """Trains one role of `ROLES` by SFT and saves it as an HF checkpoint at
    `workdir/models/<role>` (skipped when saved before)."""
    if role == "verifier":
        return warm_start_verifier(workdir, tokenizer, mesh, cfg.verifier_settings())
    out = workdir / "models" / role
    if supervised.saved(out):
        return out
    rng = random.Random(f"{cfg.seed}-{role}")
    if role == "policy":
        model = supervised.new_model(tokenizer, mesh, cfg.seed + 1, cfg.hidden_size,
                                     cfg.num_layers)
        make = lambda r, n: policy_examples(  # noqa: E731
            tokenizer, r, n, cfg.policy_p_correct, cfg.policy_mistakes, cfg.policy_stray)
        steps, lr = cfg.policy_steps, cfg.sft_lr
    else:  # generator_cold, or generator_cold_static for the static baseline
        model = supervised.new_model(tokenizer, mesh, cfg.seed + 2, cfg.hidden_size,
                                     cfg.num_layers)
        static = role.endswith("_static")
        make = lambda r, n: generator_examples(tokenizer, r, n, cfg, static)  # noqa: E731
        steps, lr = cfg.generator_steps, cfg.generator_sft_lr
    print(f"warm start: {role} ({steps} supervised steps)", flush=True)
    _, history = sft.train_sft(model, supervised.sft_optimizer(lr, steps),
                               supervised.sft_batches(tokenizer, make, rng, cfg.sft_batch),
                               steps=steps, log_every=max(1, steps // 10))
    return supervised.save_warm_start(model, out, history)
