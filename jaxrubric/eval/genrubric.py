"""GenRubric-style evaluation: score HealthBench-style reference completions under a rubric
judged by an LLM verifier, and measure how far generated rubrics agree with the experts', as
the GenRubric paper computes it.

For every query with reference completions (the ideal completion and the others shown with
it), the rubrics are either written by a generator from the query alone (``runs`` samples per
query, signed weights, constrained to the rubric grammar) or taken from the data set (the
physicians' rubric) or from the row with the same ``prompt_id`` of another HealthBench-schema
file (`rubrics_from`; e.g. a run's rubrics as `jaxrubric.rubric_export` writes them), judged
and scored as the expert rubric is and labelled ``expert`` in the outputs. The verifier judges
every item for every completion in one tree forward per completion
(`jaxrubric.rubric.verifier.verify`): each generated rubric is a group of branches and the
expert rubric is the last group, so the score vectors of a query under its rubrics are judged
together. A completion's score is HealthBench's: points of the criteria met over the positive
points.

The metrics:
- **agreement** of each generated rubric's scores with the expert rubric's (Spearman, Kendall
  tau-b, Top-1, 3-way pairwise): per query and run, averaged over runs, then over queries,
  with invalid rubrics (nothing with positive weight parsed) left out and, beside it, counted
  as failures (`metrics.agreement_over_runs`); optionally on each query's ``top_k``
  responses by expert score only (the paper's high-quality subset);
- **HealthBench scores** per rubric kind and per tag (example-level ``theme:`` tags and
  rubric-level ``axis:`` / ``level:`` / ``cluster:`` tags), clipped to [0, 1] as HealthBench
  reports them, with the unclipped mean beside and a bootstrap standard error over queries;
- **Δgap** of each rubric kind against the reference order (the ideal completion above the
  others).

The shared machinery is `jaxrubric.eval.common`.
"""

from __future__ import annotations

import dataclasses
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jax
import numpy as np

from jaxrubric.data import HealthBenchRecord, prompt_text
from jaxrubric.eval import common
from jaxrubric.eval.common import CommonConfig, EvalResult, Item, Query, fmt, mean
from jaxrubric.eval.metrics import (AGREEMENT_METRICS, aggregate, agreement_over_runs,
                                    delta_gap_from_ranks, healthbench_aggregate,
                                    healthbench_tag_scores, top_k_responses)
from jaxrubric.rubric.grammar import SIGNED_WEIGHTS
from jaxrubric.rubric.scores import genrubric_score
from jaxrubric.rubric.templates import STYLES, genrubric_generator_template

# Where the rubrics come from; any other value of `EvalConfig.rubrics` names the file the
# expert rubric was taken from (`rubrics_from`).
RUBRIC_SOURCES = ("generated", "expert")
# The tag families the printed table shows (metrics.json has every tag).
_PRINTED_TAGS = ("theme:", "axis:")


@dataclasses.dataclass(frozen=True)
class EvalConfig(CommonConfig):
    """`CommonConfig`, where the rubric comes from (``--rubrics``: `RUBRIC_SOURCES` or the
    file the records' rubrics were taken from), the rubric-generation runs per query
    (``--runs``), the high-quality subset size (``--top-k``) and the prompts' style
    (``--template-style``, training's ``rubric.template_style``)."""

    rubrics: str = "generated"
    runs: int = 1
    top_k: int | None = None
    template_style: str = "full"

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.rubrics:
            raise ValueError(f"rubrics must be one of {RUBRIC_SOURCES} or a file, got ''")
        if self.template_style not in STYLES:
            raise ValueError(f"template_style must be one of {STYLES}, got "
                             f"{self.template_style!r}")
        if self.runs < 1:
            raise ValueError(f"runs must be >= 1, got {self.runs}")
        if self.top_k is not None and self.top_k < 2:
            raise ValueError(f"top_k must be >= 2 (agreement ranks at least two responses), "
                             f"got {self.top_k}")
        if not self.generated and (self.runs != 1 or self.top_k is not None):
            raise ValueError("runs and top_k compare generated rubrics with the expert "
                             "rubric: they need rubrics='generated'")
        if self.runs > 1 and self.temperature == 0:
            raise ValueError(f"runs={self.runs} with temperature 0 writes the same greedy "
                             "rubric every run; sample them (temperature > 0)")

    @property
    def generated(self) -> bool:
        return self.rubrics == "generated"

    @property
    def groups(self) -> list[dict[str, Any]]:
        """The rubric groups judged, in group order, as their rows name them: one per
        generation run, then the expert rubric (always judged, last)."""
        runs = [{"rubric": "generated", "run": r} for r in range(self.runs)]
        return [*(runs if self.generated else []), {"rubric": "expert"}]


class _Judged(NamedTuple):
    """One scored query: its expert score vector, one per run (None: an invalid rubric), and
    which expert criteria each response meets (``[n, M]``, for the per-tag scores)."""

    record: HealthBenchRecord
    expert: np.ndarray
    runs: list[np.ndarray | None]
    expert_met: np.ndarray


def rubrics_from(records: Sequence[HealthBenchRecord], rubric_rows: Sequence[HealthBenchRecord],
                 *, data: str, source: str) -> list[HealthBenchRecord]:
    """``records``, each with the rubric of the row of ``rubric_rows`` (read from ``source``)
    with the same id (``prompt_id``); a record without one is an error naming both files."""
    by_id = {r.id: r.rubric for r in rubric_rows}
    out = []
    for record in records:
        if record.id not in by_id:
            raise ValueError(f"{data}: row {record.id!r} has no rubric: no row of {source} has "
                             "that prompt_id")
        out.append(dataclasses.replace(record, rubric=by_id[record.id]))
    return out


def evaluate(records: Sequence[HealthBenchRecord], verifier: Any, verifier_tokenizer: Any,
             config: EvalConfig, *, generator: Any = None, generator_tokenizer: Any = None,
             progress: bool = True) -> EvalResult:
    """Judges the reference completions of ``records`` (see the module docstring).

    Records without completions are counted, not scored. ``generator`` and its tokenizer are
    needed for ``config.rubrics == "generated"``.
    """
    if config.generated and (generator is None or generator_tokenizer is None):
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
        num_responses=max(len(r.responses) for r in scored), num_groups=len(config.groups),
        num_items=max(max(len(r.rubric) for r in scored),
                      config.max_items if config.generated else 0),
        style=config.template_style)
    writer = template = None
    if config.generated:
        writer = common.RubricWriter(generator, generator_tokenizer, config,
                                     weights=SIGNED_WEIGHTS, num_rubrics=config.runs)
        template = genrubric_generator_template(
            generator_tokenizer, max_items=config.max_items,
            chat_template_kwargs=config.chat_template_kwargs, style=config.template_style)
    result = EvalResult([], [], [], {})
    judged: list[_Judged] = []
    key = jax.random.key(config.seed)
    for step, batch in common.batches(scored, config.batch_size, progress=progress,
                                      unit="query"):
        written: list[list[dict[str, Any]]] = [[] for _ in batch]
        if writer is not None:
            prompts = [common.fill(template, [common.last_tokens(
                generator_tokenizer, prompt_text(r.messages), config.max_prompt_tokens, counts,
                "generator_prompts")]) for r in batch]
            written = writer(prompts, jax.random.fold_in(key, step))
        batch_queries = []
        for record, rubrics in zip(batch, written):
            generated = common.generated_groups(verifier_tokenizer, rubrics,
                                                config.max_item_tokens, counts)
            query = queries[record.id]
            batch_queries.append(dataclasses.replace(query, groups=[*generated, *query.groups]))
        out = judge(batch_queries)
        for b, (record, query, rubrics) in enumerate(zip(batch, batch_queries, written)):
            judged.append(_record_rows(result, record, b, config, query.groups, rubrics, out))
    result.metrics = _metrics(config, records, judged, counts, result.rubrics)
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


def _record_rows(result: EvalResult, record: HealthBenchRecord, b: int, config: EvalConfig,
                 groups: Sequence[Sequence[Item]], rubrics: Sequence[dict[str, Any]],
                 out: dict[str, np.ndarray]) -> _Judged:
    """Appends the output rows of query ``b`` and returns its score vectors."""
    num = len(record.responses)
    labels = config.groups
    ok = [bool(out["group_valid"][b, g]) for g in range(len(labels))]
    for g, label in enumerate(labels):
        written = {}
        if label["rubric"] == "generated":
            rubric = rubrics[label["run"]]
            written = {**{k: rubric[k] for k in ("text", "complete", "finished", "num_tokens")},
                       "valid": ok[g]}
        result.rubrics.append({"id": record.id, **label, **written,
                               "items": [i.row() for i in groups[g]]})
    result.verdicts += common.verdict_rows(record.id, num, groups, labels, out, b)

    def by_kind(name: str, k: int) -> dict[str, Any]:
        values = [float(out[name][b, k, g]) if ok[g] else None for g in range(len(labels))]
        return {**({"generated": values[:-1]} if config.generated else {}),
                "expert": values[-1]}

    for k in range(num):
        result.scores.append({"id": record.id, "response": k,
                              "completion": "ideal" if k == 0 else "reference",
                              "scores": by_kind("scores", k), "soft_scores": by_kind("soft", k)})
    scores = out["scores"][b, :num].astype(np.float64)
    return _Judged(record, scores[:, -1],
                   [scores[:, g] if ok[g] else None for g in range(len(labels) - 1)],
                   out["verdicts"][b, :num, -1, :len(record.rubric)].astype(bool))


def _metrics(config: EvalConfig, records: Sequence[HealthBenchRecord], judged: list[_Judged],
             counts: Counter, rubric_rows: list[dict[str, Any]]) -> dict[str, Any]:
    kinds = ("generated", "expert") if config.generated else ("expert",)
    metrics: dict[str, Any] = {
        "rubrics": config.rubrics,
        **({"runs": config.runs} if config.generated else {}),
        "queries": {"total": len(records), "scored": len(judged),
                    "without_responses": len(records) - len(judged)},
        "responses": sum(len(j.record.responses) for j in judged),
        "truncated": {name: counts[name] for name in (
            ("verifier_prompts", "responses", "expert_items") + (
                ("generator_prompts", "generated_items") if config.generated else ()))},
        "scores": {}, "tags": {}, "reference_delta_gap": {},
    }
    for kind in kinds:
        # A query's scores under a kind: the expert rubric's, or those of every valid run.
        vectors = [[j.expert] if kind == "expert" else [v for v in j.runs if v is not None]
                   for j in judged]
        metrics["scores"][kind] = {
            **healthbench_aggregate([np.concatenate(v) if v else [] for v in vectors],
                                    seed=config.seed),
            "ideal": mean([float(x[0]) for v in vectors for x in v]),
            "reference": mean([float(r) for v in vectors for x in v for r in x[1:]])}
        metrics["tags"][kind] = _tag_scores(config, judged, kind, vectors)
        metrics["reference_delta_gap"][kind] = aggregate([
            mean([g for g in (delta_gap_from_ranks(x, j.record.reference_ranks) for x in v)
                  if g is not None]) for j, v in zip(judged, vectors)])
    if config.generated:
        generated = [row for row in rubric_rows if row["rubric"] == "generated"]
        metrics["generated_rubrics"] = {
            "total": len(generated), "valid": sum(row["valid"] for row in generated),
            "invalid": sum(not row["valid"] for row in generated),
            "complete": sum(row["complete"] for row in generated),
            "out_of_tokens": sum(not row["finished"] for row in generated),
            "mean_items": mean([len(row["items"]) for row in generated])}
        compared = [j for j in judged if len(j.record.responses) >= 2]
        metrics["agreement"] = {
            "queries": {"compared": len(compared), "single_response": len(judged) - len(compared)},
            **_agreement(config, [j.runs for j in compared], [j.expert for j in compared])}
        if config.top_k is not None:
            subsets = [top_k_responses(j.expert, config.top_k) for j in compared]
            metrics["agreement_top_k"] = {"k": config.top_k, **_agreement(
                config, [[None if v is None else v[s] for v in j.runs]
                         for j, s in zip(compared, subsets)],
                [j.expert[s] for j, s in zip(compared, subsets)])}
    return metrics


def _agreement(config: EvalConfig, runs: list[list[np.ndarray | None]],
               expert: list[np.ndarray]) -> dict[str, Any]:
    """The agreement metrics both ways: over valid rubrics, and invalid ones as failures."""
    return {mode: agreement_over_runs(runs, expert, invalid_as_failure=failure, seed=config.seed)
            for mode, failure in (("valid_only", False), ("invalid_as_failure", True))}


def _tag_scores(config: EvalConfig, judged: list[_Judged], kind: str,
                vectors: list[list[np.ndarray]]) -> dict[str, Any]:
    """HealthBench's per-tag scores, aggregated over queries. The expert rubric carries both
    kinds of tag; a generated rubric has no tagged criteria, so only the query's example-level
    tags score it (its overall score, pooled over the valid runs)."""
    per_tag: dict[str, list[np.ndarray]] = defaultdict(list)
    for j, v in zip(judged, vectors):
        if kind == "expert":
            tags = healthbench_tag_scores(j.expert, j.expert_met,
                                          [i.weight for i in j.record.rubric],
                                          [i.tags for i in j.record.rubric], j.record.tags)
        else:
            tags = {tag: np.concatenate(v) for tag in j.record.tags if v}
        for tag, scores in tags.items():
            per_tag[tag].append(scores)
    return {tag: healthbench_aggregate(per_tag[tag], seed=config.seed) for tag in sorted(per_tag)}


def format_metrics(metrics: Mapping[str, Any]) -> str:
    """The metrics as a plain-text table."""
    q, data = metrics["queries"], metrics.get("data", {})
    lines = [f"queries scored: {q['scored']} of {q['total']} ({q['without_responses']} without "
             f"reference completions; {data.get('bad_rows_skipped', 0)} bad rows skipped)",
             f"responses scored: {metrics['responses']}",
             "truncated: " + ", ".join(f"{k} {v}" for k, v in metrics["truncated"].items()),
             "", "HealthBench scores (the mean clipped to [0, 1], ± bootstrap standard error "
                 "over queries; unclipped mean beside)",
             f"{'rubric':<34} {'score':>8} {'± se':>8} {'mean':>8} {'ideal':>8} "
             f"{'reference':>10} {'Δgap':>8}"]
    for kind, s in metrics["scores"].items():
        gap = metrics["reference_delta_gap"][kind]["mean"]
        lines.append(f"{kind:<34} {fmt(s['clipped_mean']):>8} {fmt(s['bootstrap_se']):>8} "
                     f"{fmt(s['mean']):>8} {fmt(s['ideal']):>8} {fmt(s['reference']):>10} "
                     f"{fmt(gap):>8}")
        for tag, t in metrics["tags"][kind].items():
            if tag.startswith(_PRINTED_TAGS):
                lines.append(f"  {tag:<32} {fmt(t['clipped_mean']):>8} "
                             f"{fmt(t['bootstrap_se']):>8} {fmt(t['mean']):>8}")
    if "agreement" in metrics:
        g, a = metrics["generated_rubrics"], metrics["agreement"]
        lines += ["", f"generated rubrics: {g['total']} ({metrics['runs']} per query), "
                      f"{g['invalid']} invalid; {g['complete']} complete, {g['out_of_tokens']} "
                      f"out of tokens, {fmt(g['mean_items'])} items on average",
                  f"agreement, generated vs expert: {a['queries']['compared']} queries "
                  f"({a['queries']['single_response']} with one response left out); per query "
                  "and run, averaged over runs, then over queries"]
        lines += _agreement_lines(a)
        if "agreement_top_k" in metrics:
            top = metrics["agreement_top_k"]
            lines += [f"on each query's top {top['k']} responses by expert score:",
                      *_agreement_lines(top)]
    return "\n".join(lines)


def _agreement_lines(table: Mapping[str, Any]) -> list[str]:
    lines = [f"  {'metric':<18} {'valid rubrics':>14} {'± se':>8} {'n':>4} "
             f"{'invalid as failure':>19} {'± se':>8} {'n':>4}"]
    for name in AGREEMENT_METRICS:
        v, f = table["valid_only"][name], table["invalid_as_failure"][name]
        lines.append(f"  {name:<18} {fmt(v['mean']):>14} {fmt(v['bootstrap_se']):>8} "
                     f"{v['n']:>4} {fmt(f['mean']):>19} {fmt(f['bootstrap_se']):>8} {f['n']:>4}")
    return lines
