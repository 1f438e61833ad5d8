"""The GenRubric toy world's warm starts by supervised fine-tuning: the answerer, in stages
until it follows the rubrics it is shown, and the generator's cold start on partly sound
signed rubrics (the verifier is the DynamicRubric world's, `toy/verifier_sft.py`)."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import jax
import numpy as np

import jaxrubric
from jaxrubric import sft
from jaxrubric.rubric import templates as tpl
from jaxrubric.toy import digits_task as task
from jaxrubric.toy import signed_rubrics as sr
from jaxrubric.toy import supervised
from jaxrubric.toy.genrubric_config import GenRubricWorldConfig
from jaxrubric.toy.tokens import template_ids, text_ids
from jaxrubric.toy.verifier_sft import warm_start_verifier

ROLES = ("verifier", "policy", "generator_cold")
# The answerer's rubric following (`follows`) as its warm start last checked it, in a workdir.
FOLLOWING = "rubric_following.json"


def shown_rubric(question: str, rng: random.Random, max_items: int) -> list[sr.Item]:
    """A rubric the answerer is shown in its warm start: anything from fully sound to fully
    random, now and then with an item outside the language (which names no digit)."""
    items = sr.teacher_rubric(question, rng, max_items, informed=rng.random())
    if rng.random() < 0.2:
        items[rng.randrange(len(items))] = (task.malformed_criterion(question, rng),
                                            rng.choice(sr.WEIGHTS))
    return items


def answerer_examples(tokenizer: Any, rng: random.Random, n: int, cfg: GenRubricWorldConfig
                      ) -> tuple[list, list]:
    """(induced-response prompt, the answer the shown rubric asks for) pairs."""
    template = tpl.induced_response_template(tokenizer, style="compact")
    prompts, targets = [], []
    for _ in range(n):
        question, _ = task.make_prompt(rng)
        rubric = shown_rubric(question, rng, cfg.max_items)
        prompts.append(template_ids(template, tokenizer, sr.rubric_text(rubric), question))
        targets.append(text_ids(tokenizer, sr.follow(question, rubric, rng))
                       + [tokenizer.eos_token_id])
    return prompts, targets


def generator_examples(tokenizer: Any, rng: random.Random, n: int, cfg: GenRubricWorldConfig
                       ) -> tuple[list, list]:
    """(query-only generator prompt, a partly sound signed teacher rubric) pairs."""
    template = tpl.genrubric_generator_template(tokenizer, max_items=cfg.max_items,
                                                style="compact")
    prompts, targets = [], []
    for _ in range(n):
        question, _ = task.make_prompt(rng)
        rubric = sr.teacher_rubric(question, rng, cfg.max_items, cfg.teacher_informed)
        prompts.append(template_ids(template, tokenizer, question))
        targets.append(text_ids(tokenizer, sr.rubric_text(rubric)) + [tokenizer.eos_token_id])
    return prompts, targets


def warm_start(role: str, workdir: Path, tokenizer: Any, mesh: Any, cfg: GenRubricWorldConfig
               ) -> Path:
    """One role of `ROLES` by SFT, saved as an HF checkpoint at `workdir/models/<role>`
    (skipped when saved before): the answerer ("policy"), the cold-start generator
    ("generator_cold"), or the DynamicRubric world's verifier."""
    if role == "verifier":
        return warm_start_verifier(workdir, tokenizer, mesh, cfg.verifier_settings())
    out = workdir / "models" / role
    if supervised.saved(out):
        return out
    rng = random.Random(f"{cfg.seed}-genrubric-{role}")
    # Both warm starts train their layers unrolled on rows padded to a multiple of 8 tokens:
    # faster steps than scanned layers on rows padded to 32, for two batch widths compiled
    # instead of one. The saved checkpoint is the same format either way.
    if role == "policy":
        model = supervised.new_model(tokenizer, mesh, cfg.seed + 1, cfg.answerer_hidden_size,
                                     cfg.answerer_layers, scan_layers=False)
        make = lambda r, n: answerer_examples(tokenizer, r, n, cfg)  # noqa: E731
        steps, lr, stages = cfg.answerer_steps, cfg.answerer_lr, cfg.answerer_stages
    else:
        model = supervised.new_model(tokenizer, mesh, cfg.seed + 2, cfg.hidden_size,
                                     cfg.num_layers, scan_layers=False)
        make = lambda r, n: generator_examples(tokenizer, r, n, cfg)  # noqa: E731
        steps, lr, stages = cfg.generator_steps, cfg.sft_lr, 1
    batches = supervised.sft_batches(tokenizer, make, rng, cfg.sft_batch, multiple=8)
    history: list[dict[str, Any]] = []
    for stage in range(stages):
        of = f", stage {stage + 1} of at most {stages}" if stages > 1 else ""
        print(f"warm start: {role} ({steps} supervised steps{of})", flush=True)
        _, logged = sft.train_sft(model, supervised.sft_optimizer(lr, steps), batches,
                                  steps=steps, log_every=max(1, steps // 10))
        history += [{**entry, "step": entry["step"] + stage * steps} for entry in logged]
        if role == "policy":
            following = follows(model, tokenizer, cfg)
            history[-1]["follows_named_digits"] = following["follows_named_digits"]
            print(f"rubric following after stage {stage + 1}: {following}", flush=True)
            if following["follows_named_digits"] >= cfg.answerer_follows:
                break
    supervised.save_warm_start(model, out, history)
    if role == "policy":  # the saved answerer's check: the world's stage need not repeat it
        (workdir / FOLLOWING).write_text(json.dumps(following, indent=1))
    return out


def rubric_following(workdir: Path, cfg: GenRubricWorldConfig) -> dict[str, float]:
    """How well the saved answerer follows fresh rubrics (`follows`), checked before any RL."""
    return follows(jaxrubric.load_pretrained(workdir / "models" / "policy"),
                   jaxrubric.load_tokenizer(workdir / "tokenizer"), cfg)


def follows(answerer: Any, tokenizer: Any, cfg: GenRubricWorldConfig, n: int = 256,
            seed: int = 99) -> dict[str, float]:
    """How well `answerer` follows `n` fresh rubrics: the share of digits a rubric names that
    its sampled answer keeps or drops as told, the share of the others it keeps (a fair coin:
    0.5), and the share of answers that are the prompt's digits in order. Sampled at the
    temperature its induced responses are (`policy_temperature`)."""
    from jaxrubric.sampling import generate

    rng = random.Random(seed)
    template = tpl.induced_response_template(tokenizer, style="compact")
    cases = []
    for _ in range(n):
        question, _ = task.make_prompt(rng)
        rubric = shown_rubric(question, rng, cfg.max_items)
        cases.append((question, rubric, template_ids(template, tokenizer,
                                                           sr.rubric_text(rubric), question)))
    out = generate(answerer, [c[2] for c in cases], max_new_tokens=8, rng=jax.random.key(seed),
                   temperature=cfg.round.policy.temperature, pad_id=tokenizer.pad_token_id)
    told, unnamed, in_order = [], [], []
    for (question, rubric, _), ids, length in zip(cases, np.asarray(out.tokens)[:, 0],
                                                  np.asarray(out.lengths)[:, 0]):
        answer = tokenizer.decode(ids[:length], skip_special_tokens=True)
        digits = task.digits_of(question)
        in_order.append(task.in_order(answer, question))
        for digit in digits:
            votes = sr.keep_votes(rubric, digit)
            if votes:
                told.append((digit in answer) == (votes > 0))
            else:
                unnamed.append(digit in answer)
    return {"follows_named_digits": float(np.mean(told)),
            "keeps_unnamed_digits": float(np.mean(unnamed)),
            "in_order": float(np.mean(in_order))}

