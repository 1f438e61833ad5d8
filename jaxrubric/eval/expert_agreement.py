"""GenRubric's held-out evaluation during training: how far the generator's rubrics agree with
expert rubrics on held-out rows (HealthBench schema: a prompt, physician criteria with signed
points, several completions), every `eval_every` rounds.

The work is split where it is cheapest:
- **on device**, one jitted program (`jaxrubric.methods.genrubric.genrubric_evaluation`): the
  generator writes `runs` rubrics per held-out query at its sampling temperature and one greedy
  rubric, and the verifier judges every completion of the query under each of them and under
  the expert rubric in one tree forward per completion. Shapes are static: B queries, N
  completion slots, the expert criteria padded to the longest rubric of the rows. Only the
  score matrix `[B, N, runs + 2]` and the groups' validity `[B, runs + 2]` leave the device.
- **on the host** (`agreement_scalars`): Spearman, Kendall tau-b, Top-1 consistency and 3-way
  pairwise accuracy of each generated rubric's scores against the expert rubric's, per query
  and run, averaged over the runs, then over the queries, exactly as `jaxrubric evaluate`
  computes them (`metrics.agreement_over_runs`). Rank statistics with ties and data-dependent
  skipping are microseconds of NumPy on a few hundred numbers; in XLA they would need sorts and
  masks for nothing.

Group order in every matrix: runs `0 .. runs-1` (sampled), `runs` (greedy), `runs + 1` (the
expert rubric). A generated rubric is invalid when it is incomplete or has no positive item (as
in training); the expert rubric is always valid (the loader requires a positive criterion).

Rows are checked before any model loads (`ExpertRows.from_config`): a schema error names the
file, the row and the field (`jaxrubric.data.load_healthbench`). Rows with fewer than 2
completions cannot be ranked: they are left out and listed. Text longer than its budget is cut
as `jaxrubric evaluate` cuts it (a prompt keeps its last tokens, a completion its first, a
criterion its first `max_item_tokens`) and every cut is counted.
"""

from __future__ import annotations

import dataclasses
import functools
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from jaxrubric.data import HealthBenchRecord, load_healthbench, prompt_text
from jaxrubric.eval import common
from jaxrubric.eval.metrics import AGREEMENT_METRICS, agreement_over_runs

# The agreement tables the host reports, by scalar prefix: generated rubrics left out when
# invalid (the paper's number), invalid ones scored as failures, the greedy rubric alone.
TABLES = ("agreement", "agreement_with_failures", "agreement_greedy")


@functools.partial(jax.tree_util.register_dataclass,
                   data_fields=["question", "question_lengths", "responses", "response_lengths",
                                "items", "item_lengths", "weights", "valid"],
                   meta_fields=["runs"])
@dataclasses.dataclass(frozen=True)
class ExpertBatch:
    """The held-out rows as fixed-shape arrays (NumPy on the host, global arrays on device).

    `runs` is static (part of the tree structure, not an array): the number of sampled
    rubrics the evaluation writes per query.
    """

    question: Any  # [B, Lq] int32, right-padded: the query (generator and verifier prompt)
    question_lengths: Any  # [B]
    responses: Any  # [B, N, Lr] int32, right-padded completions
    response_lengths: Any  # [B, N]; 0 in the slots of a query with fewer than N completions
    items: Any  # [B, M, Li] int32: the expert criteria as the verifier reads them
    item_lengths: Any  # [B, M]
    weights: Any  # [B, M] int32 signed points
    valid: Any  # [B, M] bool
    runs: int = 4


@dataclasses.dataclass(frozen=True)
class ExpertRows:
    """The held-out rows of a training run, checked and encoded once (host side)."""

    source: str
    records: list[HealthBenchRecord]  # the B queries of the batch, in batch order
    rows: list[int]  # their 0-based rows in `source`
    batch: ExpertBatch  # NumPy
    cut: dict[str, int]  # texts cut to fit: prompts, responses, criteria
    left_out: list[int]  # rows before the last one used that have fewer than 2 completions
    seed: int = 0  # of the bootstrap standard errors

    @classmethod
    def from_config(cls, config: Any, tokenizer: Any) -> ExpertRows:
        """`config.data.eval`'s first `data.eval_batch_size` (0: `data.batch_size`) rows with
        at least 2 completions, within the run's budgets: `data.prompt_tokens`,
        `data.anchor_tokens` per completion (the held-out answers' budget) and
        `rubric.max_item_tokens` per criterion; `data.eval_rubric_runs` sampled rubrics."""
        d = config.data
        return load_expert_rows(
            d.eval, tokenizer, size=d.eval_batch_size or d.batch_size, runs=d.eval_rubric_runs,
            prompt_tokens=d.prompt_tokens, response_tokens=d.anchor_tokens,
            item_tokens=config.rubric.max_item_tokens, seed=config.seed)

    @property
    def num_responses(self) -> list[int]:
        return [len(r.responses) for r in self.records]

    def summary(self) -> str:
        """One line on what the evaluation reads (printed when a run starts)."""
        b = self.batch
        cuts = ", ".join(f"{n} {what}" for what, n in self.cut.items() if n) or "nothing"
        left = (f"; left out rows {self.left_out} (fewer than 2 completions)"
                if self.left_out else "")
        return (f"{self.source}: held-out GenRubric evaluation on {len(self.records)} queries "
                f"(rows {self.rows}), {sum(self.num_responses)} completions, up to "
                f"{b.items.shape[1]} expert criteria, {b.runs} sampled rubrics + 1 greedy per "
                f"query; cut to fit: {cuts}{left}")

    def scalars(self, out: Mapping[str, Any]) -> dict[str, float]:
        """The evaluation's host-side metrics from its fetched outputs (`agreement_scalars`)."""
        return agreement_scalars(out["scores"], out["group_valid"], self.num_responses,
                                 self.batch.runs, seed=self.seed)

    def score_rows(self, out: Mapping[str, Any], round_: int, tokenizer: Any
                   ) -> list[dict[str, Any]]:
        """One JSON row per query: the score matrix `[n, runs + 2]` of its n completions and
        the groups' validity, in group order (sampled runs, greedy, expert), and the written
        rubrics (`rubrics`: per generated group, its valid items as ``[weight, criterion]``
        with the criterion decoded as the verifier read it, leading space stripped)."""
        scores, valid = np.asarray(out["scores"]), np.asarray(out["group_valid"])
        items, lengths = np.asarray(out["rubric_items"]), np.asarray(out["rubric_item_lengths"])
        weights, item_valid = np.asarray(out["rubric_weights"]), np.asarray(out["rubric_valid"])

        def rubric(b: int, g: int) -> list[list[Any]]:
            return [[int(weights[b, g, m]),
                     tokenizer.decode(items[b, g, m, :lengths[b, g, m]].tolist()).strip()]
                    for m in range(items.shape[2]) if item_valid[b, g, m]]

        return [{"round": round_, "id": r.id, "row": row, "valid": valid[b].tolist(),
                 "scores": scores[b, :len(r.responses)].tolist(),
                 "rubrics": [rubric(b, g) for g in range(items.shape[1])]}
                for b, (r, row) in enumerate(zip(self.records, self.rows))]


def load_expert_rows(source: str, tokenizer: Any, *, size: int, runs: int, prompt_tokens: int,
                     response_tokens: int, item_tokens: int, seed: int = 0) -> ExpertRows:
    """Reads, checks and encodes the first `size` usable rows of `source` (see `ExpertRows`);
    raises `DataError` naming the file, row and field of a bad row, ValueError when fewer than
    `size` rows have 2 completions."""
    loaded = load_healthbench(source, skip_bad_rows=False)
    usable, left_out = [], []
    for row, record in enumerate(loaded.records):  # no row is skipped: index = row
        if len(usable) == size:
            break
        (usable if len(record.responses) >= 2 else left_out).append(row)
    if len(usable) < size:
        raise ValueError(
            f"{source}: {len(usable)} rows have >= 2 completions (field "
            f"'ideal_completions_data' with 'ideal_completions_ref_completions'); the held-out "
            f"batch needs {size} (config.data.eval_batch_size). Rows without: {left_out}")
    records = [loaded.records[row] for row in usable]
    batch, cut = encode_expert_rows(tokenizer, records, runs=runs, prompt_tokens=prompt_tokens,
                                    response_tokens=response_tokens, item_tokens=item_tokens)
    return ExpertRows(str(source), records, usable, batch, cut, left_out, seed)


def encode_expert_rows(tokenizer: Any, records: Sequence[HealthBenchRecord], *, runs: int,
                       prompt_tokens: int, response_tokens: int, item_tokens: int
                       ) -> tuple[ExpertBatch, dict[str, int]]:
    """Host side: records -> the fixed-shape `ExpertBatch` (N and M the most completions and
    criteria of any record), and how many texts were cut to fit (`eval.common`'s cuts)."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    b = len(records)
    n = max(len(r.responses) for r in records)
    m = max(len(r.rubric) for r in records)
    counts: Counter = Counter()
    batch = ExpertBatch(
        np.full((b, prompt_tokens), pad, np.int32), np.zeros((b,), np.int32),
        np.full((b, n, response_tokens), pad, np.int32), np.zeros((b, n), np.int32),
        np.full((b, m, item_tokens), pad, np.int32), np.zeros((b, m), np.int32),
        np.zeros((b, m), np.int32), np.zeros((b, m), bool), runs)
    for i, record in enumerate(records):
        ids = common.last_tokens(tokenizer, prompt_text(record.messages), prompt_tokens, counts,
                                 "prompts")
        batch.question[i, :len(ids)], batch.question_lengths[i] = ids, len(ids)
        for j, text in enumerate(record.responses):
            ids = common.first_tokens(tokenizer, text, response_tokens, counts, "responses")
            batch.responses[i, j, :len(ids)], batch.response_lengths[i, j] = ids, len(ids)
        for k, criterion in enumerate(record.rubric):
            item = common.item(tokenizer, criterion.criterion, criterion.weight, item_tokens)
            counts["criteria"] += item.truncated
            batch.items[i, k, :len(item.ids)], batch.item_lengths[i, k] = item.ids, len(item.ids)
            batch.weights[i, k], batch.valid[i, k] = item.weight, True
    return batch, {what: counts[what] for what in ("prompts", "responses", "criteria")}


def run_vectors(scores: Any, group_valid: Any, num_responses: Sequence[int], runs: int
                ) -> tuple[list[list[np.ndarray | None]], list[list[np.ndarray | None]],
                           list[np.ndarray]]:
    """Per query: its sampled runs' score vectors (None: an invalid rubric), its greedy one
    (a list of one), and the expert rubric's, each over the query's real completions."""
    scores = np.asarray(scores, np.float64)
    valid = np.asarray(group_valid, bool)
    if scores.shape[-1] != runs + 2 or valid.shape != (scores.shape[0], runs + 2):
        raise ValueError(f"expected scores [B, N, {runs + 2}] and validity [B, {runs + 2}] "
                         f"(runs, greedy, expert), got {scores.shape} and {valid.shape}")

    def vector(b: int, g: int) -> np.ndarray | None:
        return scores[b, :num_responses[b], g] if valid[b, g] else None

    sampled = [[vector(b, g) for g in range(runs)] for b in range(len(num_responses))]
    greedy = [[vector(b, runs)] for b in range(len(num_responses))]
    expert = [scores[b, :n, -1] for b, n in enumerate(num_responses)]
    return sampled, greedy, expert


def agreement_scalars(scores: Any, group_valid: Any, num_responses: Sequence[int], runs: int,
                      *, seed: int = 0) -> dict[str, float]:
    """The held-out agreement metrics of one evaluation, as flat scalars.

    `scores [B, N, runs + 2]`, `group_valid [B, runs + 2]` in group order (sampled runs,
    greedy, expert); `num_responses[b]` real completions of query b. For each table of
    `TABLES` and each metric m of `metrics.AGREEMENT_METRICS`: `{table}/{m}` the mean over
    queries (left out when every query was skipped), `{table}/{m}_se` its bootstrap standard
    error over queries (with >= 2 queries), `{table}/{m}_skipped` the queries without a
    defined value, `{table}/{m}_left_out` the (query, run) values left out (invalid rubrics,
    except where they count as failures, and constant score vectors). Beside them: `queries`,
    `responses`, and `rubrics/{sampled, invalid, valid_rate, greedy_invalid}`.
    """
    sampled, greedy, expert = run_vectors(scores, group_valid, num_responses, runs)
    invalid = sum(v is None for q in sampled for v in q)
    out: dict[str, float] = {
        "queries": float(len(expert)), "responses": float(sum(num_responses)),
        "rubrics/sampled": float(runs * len(expert)), "rubrics/invalid": float(invalid),
        "rubrics/valid_rate": 1.0 - invalid / (runs * len(expert)),
        "rubrics/greedy_invalid": float(sum(q[0] is None for q in greedy))}
    tables = [agreement_over_runs(vectors, expert, invalid_as_failure=failure, seed=seed)
              for vectors, failure in ((sampled, False), (sampled, True), (greedy, False))]
    for table, values in zip(TABLES, tables):
        for name in AGREEMENT_METRICS:
            value = values[name]
            if value["mean"] is not None:
                out[f"{table}/{name}"] = value["mean"]
            if value["bootstrap_se"] is not None:
                out[f"{table}/{name}_se"] = value["bootstrap_se"]
            out[f"{table}/{name}_skipped"] = float(value["skipped"])
            out[f"{table}/{name}_left_out"] = float(value["runs_left_out"])
    return out
