"""The GenRubric toy world's result, read back from its runs' logged held-out rubrics and
scores: agreement with the expert rubric per evaluated round, the rises with bootstrap
intervals, `summary.json`, `agreement.png` and the table."""

from __future__ import annotations

import dataclasses
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from jaxrubric.data import load_healthbench, prompt_text
from jaxrubric.eval.metrics import AGREEMENT_METRICS, agreement_metrics
from jaxrubric.toy import signed_rubrics as sr
from jaxrubric.toy.genrubric_config import RUNS, GenRubricWorldConfig
from jaxrubric.toy.genrubric_warm_starts import FOLLOWING
from jaxrubric.train import EVAL_SCORES

# summary.json's names of `metrics.AGREEMENT_METRICS`.
METRICS = dict(zip(AGREEMENT_METRICS, ("spearman", "kendall_tau_b", "top1", "pairwise")))


def read_scores(run_dir: Path) -> dict[int, list[dict[str, Any]]]:
    """A run's `eval_scores.jsonl` rows by round, one per held-out query (after a resume the
    later row of a round and query wins)."""
    rows: dict[int, dict[str, dict]] = defaultdict(dict)
    for line in (run_dir / EVAL_SCORES).read_text().splitlines():
        row = json.loads(line)
        rows[row["round"]][row["id"]] = row
    return {r: sorted(by_id.values(), key=lambda row: row["row"])
            for r, by_id in sorted(rows.items())}


def per_query_agreement(rows: list[dict[str, Any]], runs: int, responses: dict[str, list[str]]
                        | None = None, prompts: dict[str, str] | None = None
                        ) -> dict[str, list[float | None]]:
    """Per held-out query, each metric averaged over its valid sampled rubrics (None where none
    is defined), as the paper computes it: from the verifier's scores, or, given `responses`
    and `prompts` by row id, with the checker judging the written rubrics and the expert one."""
    out: dict[str, list[float | None]] = {m: [] for m in AGREEMENT_METRICS}
    for row in rows:
        if responses is None:
            scores = np.asarray(row["scores"], np.float64)
            expert = scores[:, -1]
            vectors = [scores[:, g] for g in range(runs) if row["valid"][g]]
        else:
            answers, prompt = responses[row["id"]], prompts[row["id"]]
            expert = np.array([sr.score(sr.expert_rubric(prompt), a) for a in answers])
            vectors = []
            for g in range(runs):
                rubric = [(c, w) for w, c in row["rubrics"][g]]
                if row["valid"][g]:
                    vectors.append(np.array([sr.score(rubric, a) for a in answers]))
        values = [agreement_metrics(v, expert) for v in vectors]
        for m in AGREEMENT_METRICS:
            defined = [v[m] for v in values if v[m] is not None]
            out[m].append(float(np.mean(defined)) if defined else None)
    return out


def _mean(values: list[float | None]) -> float | None:
    defined = [v for v in values if v is not None]
    return float(np.mean(defined)) if defined else None


def paired_interval(after: list[float | None], before: list[float | None], seed: int,
                    resamples: int) -> dict[str, float]:
    """Mean of ``after - before`` over the queries where both are defined, with its 95%
    percentile bootstrap interval over queries."""
    d = np.array([a - b for a, b in zip(after, before) if a is not None and b is not None])
    if not len(d):  # no query with both values (every rubric invalid or constant)
        return {"mean": None, "low": None, "high": None, "queries": 0}
    rng = np.random.default_rng(seed)
    means = rng.choice(d, size=(resamples, len(d))).mean(axis=1)
    low, high = np.percentile(means, [2.5, 97.5])
    return {"mean": float(d.mean()), "low": float(low), "high": float(high),
            "queries": int(len(d))}


def summarize(workdir: Path, cfg: GenRubricWorldConfig) -> dict[str, Any]:
    """Writes `summary.json` and `agreement.png`, prints the table, returns the summary."""
    # The held-out rows as the training loop read them (the same loader, the same order of
    # completions as its score matrices).
    held_out = load_healthbench(workdir / "data" / "eval.jsonl").records
    responses = {r.id: r.responses for r in held_out}
    prompts = {r.id: prompt_text(r.messages) for r in held_out}
    per_query: dict[str, dict[int, dict[str, list]]] = {}
    for name in cfg.runs:
        scores = read_scores(workdir / "runs" / name)
        per_query[name] = {r: per_query_agreement(rows, cfg.eval_rubric_runs)
                           for r, rows in scores.items()}
        if name == "evolving":
            per_query["checker_judged"] = {
                r: per_query_agreement(rows, cfg.eval_rubric_runs, responses, prompts)
                for r, rows in scores.items()}
    rounds = sorted(next(iter(per_query.values())))
    summary: dict[str, Any] = {"rounds": rounds}
    for name, by_round in per_query.items():
        summary[name] = {METRICS[m]: [_mean(by_round[r][m]) for r in rounds]
                         for m in AGREEMENT_METRICS}
    first, last = rounds[0], rounds[-1]
    intervals = {}
    for name, by_round in per_query.items():
        intervals[f"{name}_rise"] = {
            METRICS[m]: paired_interval(by_round[last][m], by_round[first][m], cfg.seed,
                                        cfg.bootstrap) for m in AGREEMENT_METRICS}
    if "control" in per_query and "evolving" in per_query:
        intervals["evolving_minus_control"] = {
            METRICS[m]: paired_interval(per_query["evolving"][last][m],
                                        per_query["control"][last][m], cfg.seed, cfg.bootstrap)
            for m in AGREEMENT_METRICS}
    summary["intervals"] = intervals
    summary["rubric_following"] = json.loads((workdir / FOLLOWING).read_text())
    summary["config"] = dataclasses.asdict(cfg)
    (workdir / "summary.json").write_text(json.dumps(summary, indent=1))
    plot(summary, workdir / "agreement.png")
    print(table(summary))
    return summary


def table(summary: dict[str, Any]) -> str:
    """The Spearman and pairwise curves of every run, and the rises with their intervals."""
    names = [n for n in (*RUNS, "checker_judged") if n in summary]
    lines = ["held-out agreement with the expert rubric (Spearman / pairwise accuracy)",
             "round  " + "  ".join(f"{n:>15}" for n in names)]
    for i, round_ in enumerate(summary["rounds"]):
        lines.append(f"{round_:5d}  " + "  ".join(
            f"{_show(summary[n]['spearman'][i], '7.3f')} /"
            f"{_show(summary[n]['pairwise'][i], '6.3f')}" for n in names))
    for key, by_metric in summary["intervals"].items():
        s = by_metric["spearman"]
        lines.append(f"{key}: Spearman {_show(s['mean'], '+.3f')} [{_show(s['low'], '+.3f')}, "
                     f"{_show(s['high'], '+.3f')}] over {s['queries']} queries")
    return "\n".join(lines)


def _show(value: float | None, spec: str) -> str:
    """A table cell: the value, or "-" where it is undefined (no valid rubric)."""
    width = int(spec.lstrip("+").split(".")[0] or 0)
    return format(value, spec) if value is not None else "-".rjust(width)


def plot(summary: dict[str, Any], path: Path) -> None:
    """Spearman and pairwise accuracy per evaluated round, one line per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = {"evolving": "self-evolving generator", "control": "shuffled rewards (control)",
              "checker_judged": "self-evolving, judged by the checker"}
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), dpi=110)
    for ax, metric in zip(axes, ("spearman", "pairwise")):
        for name, label in labels.items():
            if name in summary:
                values = [np.nan if v is None else v for v in summary[name][metric]]
                ax.plot(summary["rounds"], values, marker="o", ms=3, label=label)
        ax.set(xlabel="GenRubric round", ylabel=metric,
               title=f"Agreement with the expert rubric: {metric}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)

