"""The compared runs' last policies evaluated side by side, their differences paired by question.

Each run's training-time evaluation samples 4 answers per held-out question, and a difference
between two runs read off those summaries is as noisy as two independent evaluations. But the
runs answer the same questions, and with the same sampling draws (row r's step s reads the
uniform `fold_in(fold_in(key, r), s)` whatever the policy, `jaxrubric.sampling`), so where two
policies agree they write the same answer: the per-question qualities of two runs' last
policies correlate, and the standard error of their difference, paired by question, is
several times smaller than the independent one. This module samples every run's last policy on
every held-out question `samples` times with one key (common random numbers) and scores the
answers with the checker.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

import jaxrubric


@dataclasses.dataclass(frozen=True)
class Lead:
    """One run's mean quality minus another's over the same questions, and the standard error
    of that difference paired by question (each question's difference is one observation)."""

    mean: float
    se: float

    @property
    def in_ses(self) -> float:
        """The lead in standard errors (0 for two runs that agree on every question; inf for
        a lead of the same size on every question)."""
        if self.se > 0:
            return self.mean / self.se
        return math.copysign(math.inf, self.mean) if self.mean else 0.0


def paired_lead(a: Sequence[float], b: Sequence[float]) -> Lead:
    """`mean(a - b)` over questions (per-question qualities of two runs, in the same order) and
    its standard error `std(a - b, ddof=1) / sqrt(n)`: a paired t statistic's denominator."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.ndim != 1 or a.shape != b.shape or len(a) < 2:
        raise ValueError(f"paired_lead needs two equal-length lists of >= 2 questions, got "
                         f"shapes {a.shape} and {b.shape}")
    return Lead(*mean_and_se(a - b))


def mean_and_se(values: Sequence[float]) -> tuple[float, float]:
    """The mean and its standard error (`ddof=1`): of a run's per-question qualities, its
    quality clustered by question; of one lead over seeds, its spread across them."""
    values = np.asarray(values, np.float64)
    return float(values.mean()), float(values.std(ddof=1) / math.sqrt(len(values)))


def sample_answers(model_dir: str | Path, tokenizer: Any, prompts: Sequence[Sequence[int]],
                   *, samples: int, seed: int, max_new_tokens: int) -> list[list[str]]:
    """`samples` answers per prompt (token ids) of the HF checkpoint at `model_dir`, sampled
    at temperature 1 as in a round, from `jax.random.key(seed)`: the same key gives two
    checkpoints the same draws."""
    from jaxrubric.sampling import generate

    out = generate(jaxrubric.load_pretrained(model_dir), prompts, max_new_tokens=max_new_tokens,
                   rng=jax.random.key(seed), num_samples=samples, pad_id=tokenizer.pad_token_id)
    return [[tokenizer.decode(ids[:n], skip_special_tokens=True) for ids, n in zip(rows, lengths)]
            for rows, lengths in zip(np.asarray(out.tokens), np.asarray(out.lengths))]


def per_question_quality(model_dir: str | Path, tokenizer: Any, questions: Sequence[str],
                         prompts: Sequence[Sequence[int]], quality: Callable[[str, str], float],
                         *, samples: int, seed: int, max_new_tokens: int) -> list[float]:
    """Each question's mean `quality(answer, question)` over `samples` sampled answers."""
    answers = sample_answers(model_dir, tokenizer, prompts, samples=samples, seed=seed,
                             max_new_tokens=max_new_tokens)
    return [float(np.mean([quality(a, q) for a in row])) for q, row in zip(questions, answers)]


def final_summary(per_question: dict[str, list[float]], pairs: Sequence[tuple[str, str]],
                  samples: int) -> dict[str, Any]:
    """The final evaluation as `summary.json` keeps it: each run's mean quality and standard
    error, and each pair's paired lead (`"a-b": {"mean", "se"}`)."""
    stats = {run: mean_and_se(values) for run, values in per_question.items()}
    return {"samples": samples,
            "questions": len(next(iter(per_question.values()))),
            "quality": {run: mean for run, (mean, _) in stats.items()},
            "quality_se": {run: se for run, (_, se) in stats.items()},
            "leads": {f"{a}-{b}": dataclasses.asdict(paired_lead(per_question[a],
                                                                 per_question[b]))
                      for a, b in pairs if a in per_question and b in per_question}}
