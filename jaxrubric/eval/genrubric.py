"""GenRubric-style evaluation: score HealthBench-style reference completions under a rubric
judged by an LLM verifier, and measure how far generated rubrics agree with the experts'.

For every query with reference completions (the ideal completion and the others shown with
it), the rubric is either written by a generator from the query alone (signed weights,
constrained to the rubric grammar) or taken from the data set (the physicians' rubric). The
verifier judges every item for every completion in one tree forward per completion
(`jaxrubric.rubric.verifier.verify`), and a completion's score is HealthBench's: points of the
criteria met over the positive points. With generated rubrics the expert rubric is judged in
the same forward (a second group of branches), so the two score vectors of a query can be
compared (`agreement_table`) and both give a Δgap against the reference order (the ideal
completion above the others). The shared machinery is `jaxrubric.eval.common`.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from jaxrubric.data import HealthBenchRecord, prompt_text
from jaxrubric.eval import common
from jaxrubric.eval.common import CommonConfig, EvalResult, Item, Query, fmt, mean
from jaxrubric.eval.metrics import aggregate, agreement_table, delta_gap_from_ranks
from jaxrubric.rubric.grammar import SIGNED_WEIGHTS
from jaxrubric.rubric.scores import genrubric_score
from jaxrubric.rubric.templates import genrubric_generator_template

RUBRIC_SOURCES = ("generated", "expert")


@dataclasses.dataclass(frozen=True)
class EvalConfig(CommonConfig):
    """`CommonConfig` and where the rubric comes from (``--rubrics``)."""

    rubrics: str = "generated"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.rubrics not in RUBRIC_SOURCES:
            raise ValueError(f"rubrics must be one of {RUBRIC_SOURCES}, got {self.rubrics!r}")

    @property
    def kinds(self) -> tuple[str, ...]:
        """The rubric groups judged, in group order: the expert rubric always, last."""
        return ("generated", "expert") if self.rubrics == "generated" else ("expert",)


def evaluate(records: Sequence[HealthBenchRecord], verifier: Any, verifier_tokenizer: Any,
             config: EvalConfig, *, generator: Any = None, generator_tokenizer: Any = None,
             progress: bool = True) -> EvalResult:
    """Judges the reference completions of ``records`` (see the module docstring).

    Records without completions are counted, not scored. ``generator`` and its tokenizer are
    needed for ``config.rubrics == "generated"``.
    """
    kinds = config.kinds
    if "generated" in kinds and (generator is None or generator_tokenizer is None):
        raise ValueError("generated rubrics need a generator model and tokenizer")
    scored = [r for r in records if r.responses]
    if not scored:
        raise ValueError("no record has reference completions to score")
    counts: Counter = Counter()
    queries = {r.id: _query(verifier_tokenizer, config, r, counts) for r in scored}
    judge = common.Judge(
        verifier, verifier_tokenizer, config, score=genrubric_score,
        prompt_len=max(len(p) for q in queries.values() for p in q.prompts),
        response_len=max(len(x) for q in queries.values() for x in q.responses),
        num_responses=max(len(r.responses) for r in scored), num_groups=len(kinds),
        num_items=max(max(len(r.rubric) for r in scored),
                      config.max_items if "generated" in kinds else 0))
    writer = template = None
    if "generated" in kinds:
        writer = common.RubricWriter(generator, generator_tokenizer, config,
                                     weights=SIGNED_WEIGHTS)
        template = genrubric_generator_template(
            generator_tokenizer, max_items=config.max_items,
            chat_template_kwargs=config.chat_template_kwargs)
    result = EvalResult([], [], [], {})
    per_query: list[tuple[HealthBenchRecord, dict[str, np.ndarray | None]]] = []
    key = jax.random.key(config.seed)
    for step, batch in common.batches(scored, config.batch_size, progress=progress,
                                      unit="query"):
        written: list[dict[str, Any] | None] = [None] * len(batch)
        if writer is not None:
            prompts = [common.fill(template, [common.last_tokens(
                generator_tokenizer, prompt_text(r.messages), config.max_prompt_tokens, counts,
                "generator_prompts")]) for r in batch]
            written = [rubrics[0] for rubrics in writer(prompts, jax.random.fold_in(key, step))]
        batch_queries = []
        for record, rubric in zip(batch, written):
            query = queries[record.id]
            if rubric is not None:
                generated = [common.item(verifier_tokenizer, c, w, config.max_item_tokens)
                             for c, w in rubric["items"]]
                counts["generated_items"] += sum(i.truncated for i in generated)
                query = dataclasses.replace(query, groups=[generated, *query.groups])
            batch_queries.append(query)
        out = judge(batch_queries)
        for b, (record, query, rubric) in enumerate(zip(batch, batch_queries, written)):
            per_query.append((record, _record_rows(result, record, b, kinds, query.groups,
                                                   rubric, out)))
    result.metrics = _metrics(config, records, per_query, counts, result.rubrics)
    return result


def _query(tokenizer: Any, config: EvalConfig, record: HealthBenchRecord,
           counts: Counter) -> Query:
    """The verifier's view of a record: its prompt, its completions and the expert rubric."""
    prompt = common.last_tokens(tokenizer, prompt_text(record.messages), config.max_prompt_tokens,
                                counts, "verifier_prompts")
    responses = [common.first_tokens(tokenizer, text, config.max_response_tokens, counts,
                                     "responses") for text in record.responses]
    expert = [common.item(tokenizer, i.criterion, i.weight, config.max_item_tokens)
              for i in record.rubric]
    counts["expert_items"] += sum(i.truncated for i in expert)
    return Query([prompt] * len(responses), responses, [expert])


def _record_rows(result: EvalResult, record: HealthBenchRecord, b: int, kinds: tuple[str, ...],
                 groups: Sequence[Sequence[Item]], rubric: dict[str, Any] | None,
                 out: dict[str, np.ndarray]) -> dict[str, np.ndarray | None]:
    """Appends the output rows of query ``b``; returns its score vector per rubric kind
    (None where the rubric is invalid: no valid item with positive weight)."""
    num = len(record.responses)
    vectors: dict[str, np.ndarray | None] = {}
    for g, kind in enumerate(kinds):
        written = ({k: rubric[k] for k in ("text", "complete", "finished", "num_tokens")}
                   if kind == "generated" else {})
        result.rubrics.append({"id": record.id, "rubric": kind, **written,
                               "items": [i.row() for i in groups[g]]})
        valid = bool(out["group_valid"][b, g])
        vectors[kind] = out["scores"][b, :num, g].astype(np.float64) if valid else None
    result.verdicts += common.verdict_rows(record.id, num, groups, kinds, out, b)
    ok = [bool(out["group_valid"][b, g]) for g in range(len(kinds))]
    for k in range(num):
        result.scores.append({
            "id": record.id, "response": k,
            "completion": "ideal" if k == 0 else "reference",
            "scores": {kind: float(out["scores"][b, k, g]) if ok[g] else None
                       for g, kind in enumerate(kinds)},
            "soft_scores": {kind: float(out["soft"][b, k, g]) if ok[g] else None
                            for g, kind in enumerate(kinds)}})
    return vectors
def _metrics(config: EvalConfig, records: Sequence[HealthBenchRecord],
             per_query: list[tuple[HealthBenchRecord, dict[str, np.ndarray | None]]],
             counts: Counter, rubric_rows: list[dict[str, Any]]) -> dict[str, Any]:
    kinds = config.kinds
    metrics: dict[str, Any] = {
        "rubrics": config.rubrics,
        "queries": {"total": len(records), "scored": len(per_query),
                    "without_responses": len(records) - len(per_query)},
        "responses": sum(len(r.responses) for r, _ in per_query),
        "truncated": {name: counts[name] for name in (
            ("verifier_prompts", "responses", "expert_items") + (
                ("generator_prompts", "generated_items") if "generated" in kinds else ()))},
        "scores": {}, "reference_delta_gap": {},
    }
    for kind in kinds:
        by_role: dict[str, list[float]] = {"ideal": [], "reference": []}
        for _, vectors in per_query:
            if vectors[kind] is not None:
                by_role["ideal"].append(float(vectors[kind][0]))
                by_role["reference"].extend(map(float, vectors[kind][1:]))
        metrics["scores"][kind] = {
            "mean": mean(by_role["ideal"] + by_role["reference"]),
            "ideal": mean(by_role["ideal"]), "reference": mean(by_role["reference"]),
            "invalid_rubrics": sum(v[kind] is None for _, v in per_query)}
        metrics["reference_delta_gap"][kind] = aggregate([
            None if v[kind] is None else delta_gap_from_ranks(v[kind], r.reference_ranks)
            for r, v in per_query])
    if "generated" in kinds:
        generated = [row for row in rubric_rows if row["rubric"] == "generated"]
        metrics["generated_rubrics"] = {
            "complete": sum(row["complete"] for row in generated),
            "out_of_tokens": sum(not row["finished"] for row in generated),
            "mean_items": mean([len(row["items"]) for row in generated])}
        pairs = [(v["generated"], v["expert"]) for r, v in per_query
                 if len(r.responses) >= 2 and v["generated"] is not None
                 and v["expert"] is not None]
        metrics["agreement"] = agreement_table([g for g, _ in pairs], [e for _, e in pairs])
        metrics["agreement_queries"] = {
            "compared": len(pairs),
            "single_response": sum(len(r.responses) < 2 for r, _ in per_query),
            "invalid_rubric": sum(len(r.responses) >= 2 and any(x is None for x in v.values())
                                  for r, v in per_query)}
    return metrics


def format_metrics(metrics: Mapping[str, Any]) -> str:
    """The metrics as a plain-text table."""
    q, data = metrics["queries"], metrics.get("data", {})
    lines = [f"queries scored: {q['scored']} of {q['total']} ({q['without_responses']} without "
             f"reference completions; {data.get('bad_rows_skipped', 0)} bad rows skipped)",
             f"responses scored: {metrics['responses']}",
             "truncated: " + ", ".join(f"{k} {v}" for k, v in metrics["truncated"].items()),
             "", f"{'rubric':<10} {'mean':>8} {'ideal':>8} {'reference':>10} {'Δgap':>8} "
                 f"{'invalid':>8}"]
    for kind, s in metrics["scores"].items():
        gap = metrics["reference_delta_gap"][kind]["mean"]
        lines.append(f"{kind:<10} {fmt(s['mean']):>8} {fmt(s['ideal']):>8} "
                     f"{fmt(s['reference']):>10} {fmt(gap):>8} {s['invalid_rubrics']:>8}")
    if "agreement" in metrics:
        g, a = metrics["generated_rubrics"], metrics["agreement_queries"]
        lines += ["", f"generated rubrics: {g['complete']} complete, {g['out_of_tokens']} out of "
                      f"tokens, {fmt(g['mean_items'])} items on average",
                  f"agreement, generated vs expert ({a['compared']} queries; "
                  f"{a['single_response']} with one response, {a['invalid_rubric']} with an "
                  f"invalid rubric left out)",
                  f"{'metric':<20} {'mean':>8} {'n':>5} {'skipped':>8}"]
        for name, agg in metrics["agreement"].items():
            lines.append(f"{name:<20} {fmt(agg['mean']):>8} {agg['n']:>5} {agg['skipped']:>8}")
    return "\n".join(lines)

