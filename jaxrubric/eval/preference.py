"""DynamicRubric evaluation, as the paper evaluates its generator: on preference benchmarks.

For every candidate set (`jaxrubric.data.preference`: A/B pairs, Nectar-like ranked lists,
Prometheus MT-Bench rows) the generator is shown the prompt and the K candidates, as in
training (`dynamic_rubric_generator_template` built for the data set's K), and writes G
rubrics with positive weights 1..5, constrained to the rubric grammar. The verifier judges every
candidate under every item of every rubric in one tree forward per candidate. A rubric scores a
candidate ``sum(w v) / sum(w)`` (`dynamic_rubric_score`); it counts when it parsed completely
and has an item, and a candidate's score is the mean over the set's counting rubrics, as the
policy's reward is with ``policy_score="mean"``. A set with no counting rubric is left out of
the metrics and counted.

Candidates are shown to the generator in a seeded random order (``position`` in
``scores.jsonl``): ranked data is often stored best-first, and the order must not tell.

Metrics (against the reference ranks; lower is better, equal ranks tie):
- pairwise preference accuracy over every pair the reference orders, pooled over sets; a
  score tie counts half (`pairwise_preference_accuracy`: the accuracy of breaking it at
  random); for A/B rows that is one pair per row;
- for ranked lists (``ranked``, ``prometheus``), per set and averaged over sets: Spearman,
  Kendall tau-b and top-1 (every top-scored candidate is a top-ranked one), each against the
  negated ranks. A set whose scores are all equal has no Spearman or Kendall and is counted
  as skipped.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from jaxrubric.data import CandidateSet, prompt_text
from jaxrubric.eval import common
from jaxrubric.eval.common import CommonConfig, EvalResult, Query, fmt, mean
from jaxrubric.eval.metrics import (DEFAULT_TOL, aggregate, kendall_tau_b,
                                    pairwise_preference_accuracy, preference_pairs, spearman,
                                    top1_consistency)
from jaxrubric.rubric.grammar import POSITIVE_WEIGHTS
from jaxrubric.rubric.scores import dynamic_rubric_score
from jaxrubric.rubric.templates import dynamic_rubric_generator_template

LISTWISE_FORMATS = ("ranked", "prometheus")


@dataclasses.dataclass(frozen=True)
class PreferenceConfig(CommonConfig):
    """`CommonConfig` and the rubrics written per set (G, ``--num-rubrics``)."""

    num_rubrics: int = 4

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.num_rubrics < 1:
            raise ValueError(f"num_rubrics must be >= 1, got {self.num_rubrics}")


def shown_order(seed: int, index: int, size: int) -> list[int]:
    """The candidates of set ``index`` in the order the generator sees them."""
    return [int(k) for k in np.random.default_rng([seed, index]).permutation(size)]


def set_size(sets: Sequence[CandidateSet]) -> int:
    """The one candidate count of ``sets`` (the generator's template is built for it)."""
    size = len(sets[0].candidates)
    for s in sets:
        if len(s.candidates) != size:
            raise ValueError(f"set {s.id!r} has {len(s.candidates)} candidates, set "
                             f"{sets[0].id!r} {size}: every set needs the same number")
    if size < 2:
        raise ValueError(f"the sets have {size} candidate; ranking needs 2 or more")
    return size


def evaluate_preferences(sets: Sequence[CandidateSet], generator: Any, generator_tokenizer: Any,
                         verifier: Any, verifier_tokenizer: Any, config: PreferenceConfig, *,
                         format: str, progress: bool = True) -> EvalResult:
    """Writes G rubrics per set, judges every candidate and scores the generator's rubrics
    against the reference order (see the module docstring). ``format`` is the data's
    (`jaxrubric.data.FORMATS`): listwise metrics are reported for ranked lists."""
    if not sets:
        raise ValueError("no candidate set to evaluate")
    size, counts = set_size(sets), Counter()
    template = dynamic_rubric_generator_template(
        generator_tokenizer, size, max_items=config.max_items,
        chat_template_kwargs=config.chat_template_kwargs)
    writer = common.RubricWriter(generator, generator_tokenizer, config, weights=POSITIVE_WEIGHTS,
                                 num_rubrics=config.num_rubrics)
    queries = {s.id: _query(verifier_tokenizer, config, s, counts) for s in sets}
    judge = common.Judge(
        verifier, verifier_tokenizer, config, score=dynamic_rubric_score,
        prompt_len=max(len(p) for q in queries.values() for p in q.prompts),
        response_len=max(len(r) for q in queries.values() for r in q.responses),
        num_responses=size, num_groups=config.num_rubrics, num_items=config.max_items)
    orders = [shown_order(config.seed, i, size) for i in range(len(sets))]
    result = EvalResult([], [], [], {})
    set_scores: list[np.ndarray | None] = []
    key = jax.random.key(config.seed)
    for step, batch in common.batches(sets, config.batch_size, progress=progress, unit="set"):
        first = step * config.batch_size
        prompts = [_generator_prompt(generator_tokenizer, template, config, s, orders[first + b],
                                     counts) for b, s in enumerate(batch)]
        written = writer(prompts, jax.random.fold_in(key, step))
        batch_queries = []
        for s, rubrics in zip(batch, written):
            groups = common.generated_groups(verifier_tokenizer, rubrics,
                                             config.max_item_tokens, counts)
            batch_queries.append(dataclasses.replace(queries[s.id], groups=groups))
        out = judge(batch_queries)
        for b, (s, query, rubrics) in enumerate(zip(batch, batch_queries, written)):
            set_scores.append(_set_rows(result, s, orders[first + b], query, rubrics, out, b))
    result.metrics = preference_metrics(sets, set_scores, format=format)
    result.metrics.update(
        candidates_per_set=size, num_rubrics=config.num_rubrics,
        truncated={name: counts[name] for name in (
            "generator_prompts", "generator_candidates", "verifier_prompts", "responses",
            "generated_items")},
        rubrics=_rubric_summary(result.rubrics))
    return result


def _query(tokenizer: Any, config: PreferenceConfig, candidate_set: CandidateSet,
           counts: Counter) -> Query:
    """The verifier's view of a set: each candidate after its own conversation."""
    prompt = prompt_text(candidate_set.messages)
    prompts = [common.last_tokens(tokenizer, prompt + c.context, config.max_prompt_tokens,
                                  counts, "verifier_prompts") for c in candidate_set.candidates]
    responses = [common.first_tokens(tokenizer, c.text, config.max_response_tokens, counts,
                                     "responses") for c in candidate_set.candidates]
    return Query(prompts, responses, [])


def _generator_prompt(tokenizer: Any, template: Any, config: PreferenceConfig,
                      candidate_set: CandidateSet, order: Sequence[int], counts: Counter
                      ) -> list[int]:
    """The generator's prompt: the set's prompt, then the candidates in ``order``, each with
    its own part of the conversation."""
    prompt = common.last_tokens(tokenizer, prompt_text(candidate_set.messages),
                                config.max_prompt_tokens, counts, "generator_prompts")
    shown = [common.first_tokens(tokenizer, c.context + c.text, config.max_response_tokens,
                                 counts, "generator_candidates")
             for c in (candidate_set.candidates[k] for k in order)]
    return common.fill(template, [prompt, *shown])


def _set_rows(result: EvalResult, candidate_set: CandidateSet, order: Sequence[int],
              query: Query, rubrics: Sequence[dict[str, Any]], out: Mapping[str, np.ndarray],
              b: int) -> np.ndarray | None:
    """Appends the output rows of set ``b``; returns its candidates' scores (None when no
    rubric counts)."""
    counting = [bool(out["group_valid"][b, g]) and r["complete"] for g, r in enumerate(rubrics)]
    for g, (rubric, items) in enumerate(zip(rubrics, query.groups)):
        result.rubrics.append({
            "id": candidate_set.id, "rubric": g, "counted": counting[g],
            **{k: rubric[k] for k in ("text", "complete", "finished", "num_tokens")},
            "items": [i.row() for i in items]})
    num = len(candidate_set.candidates)
    result.verdicts += common.verdict_rows(candidate_set.id, num, query.groups,
                                           [{"rubric": g} for g in range(len(rubrics))], out, b)
    scores = soft = None
    if any(counting):
        scores = out["scores"][b, :num][:, counting].astype(np.float64).mean(-1)
        soft = out["soft"][b, :num][:, counting].astype(np.float64).mean(-1)
    for k, candidate in enumerate(candidate_set.candidates):
        result.scores.append({
            "id": candidate_set.id, "response": k, "position": order.index(k) + 1,
            "row": candidate.row, "rank": candidate.rank,
            "reference_score": candidate.reference_score,
            "score": None if scores is None else float(scores[k]),
            "soft_score": None if soft is None else float(soft[k]),
            "rubric_scores": [float(out["scores"][b, k, g]) if ok else None
                              for g, ok in enumerate(counting)]})
    return scores


def preference_metrics(sets: Sequence[CandidateSet], scores: Sequence[np.ndarray | None], *,
                       format: str) -> dict[str, Any]:
    """Pairwise (and, for ranked lists, listwise) agreement of the candidates' ``scores``
    (None: a set without a counting rubric, left out) with the sets' reference ranks."""
    scored = [(s, v) for s, v in zip(sets, scores) if v is not None]
    chosen, rejected = [], []
    for s, v in scored:
        for better, worse in preference_pairs(s.ranks):
            chosen.append(v[better])
            rejected.append(v[worse])
    chosen_a, rejected_a = np.asarray(chosen, np.float64), np.asarray(rejected, np.float64)
    metrics: dict[str, Any] = {
        "method": "dynamic_rubric", "format": format,
        "sets": {"total": len(sets), "scored": len(scored),
                 "no_counting_rubric": len(sets) - len(scored)},
        "pairwise": {
            "accuracy": pairwise_preference_accuracy(chosen_a, rejected_a),
            "pairs": len(chosen),
            "ties": int(np.sum(np.abs(chosen_a - rejected_a) <= DEFAULT_TOL)),
            "sets_without_pairs": sum(not preference_pairs(s.ranks) for s, _ in scored)},
    }
    if format in LISTWISE_FORMATS:
        reference = [(v, -np.asarray(s.ranks, np.float64)) for s, v in scored]
        metrics["listwise"] = {
            "spearman": aggregate([spearman(v, r) for v, r in reference]),
            "kendall_tau_b": aggregate([kendall_tau_b(v, r) for v, r in reference]),
            "top1": aggregate([top1_consistency(v, r) for v, r in reference])}
    return metrics


def _rubric_summary(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    return {"written": len(rows), "counted": sum(r["counted"] for r in rows),
            "complete": sum(r["complete"] for r in rows),
            "out_of_tokens": sum(not r["finished"] for r in rows),
            "mean_items": mean([len(r["items"]) for r in rows])}


def format_preference_metrics(metrics: Mapping[str, Any]) -> str:
    """The metrics as plain text."""
    s, p, r, data = metrics["sets"], metrics["pairwise"], metrics["rubrics"], metrics.get(
        "data", {})
    lines = [f"{metrics['format']} data: {s['scored']} of {s['total']} sets scored "
             f"({s['no_counting_rubric']} without a counting rubric; "
             f"{data.get('bad_rows_skipped', 0)} bad rows skipped), "
             f"{metrics['candidates_per_set']} candidates each",
             f"rubrics: {r['written']} written ({metrics['num_rubrics']} per set), {r['counted']} "
             f"counted, {r['out_of_tokens']} out of tokens, {fmt(r['mean_items'])} items on "
             "average",
             "truncated: " + ", ".join(f"{k} {v}" for k, v in metrics["truncated"].items()),
             "", f"pairwise preference accuracy: {fmt(p['accuracy'])} over {p['pairs']} pairs "
                 f"({p['ties']} ties, counted half)"]
    if "listwise" in metrics:
        lines += ["", f"{'listwise':<16} {'mean':>8} {'sets':>5} {'skipped':>8}"]
        for name, agg in metrics["listwise"].items():
            lines.append(f"{name:<16} {fmt(agg['mean']):>8} {agg['n']:>5} {agg['skipped']:>8}")
    return "\n".join(lines)
