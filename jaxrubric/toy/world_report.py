"""The DynamicRubric toy world's result: the final evaluation of every run's last policy,
paired by question (`toy/final_eval.py`), and `summary.json`, `quality.png`, `saturation.png` and
the table."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np

from jaxrubric.toy import digits_task as task
from jaxrubric.toy import final_eval
from jaxrubric.toy.tokens import policy_prompt
from jaxrubric.toy.workdir import use_workdir
from jaxrubric.toy.world_config import LEADS, POLICY_TOKENS, ToyWorldConfig
from jaxrubric.toy.world_runs import held_out_rows
from jaxrubric.train_loop import METRICS_HISTORY, read_eval_history

FINAL_FILE = "final_eval.json"
FINAL_KEY_OFFSET = 20_000  # the final evaluation's sampling key: seed + this (held-out data's: 10k)
CURVES = ("quality", "quality_se", "delta_gap", "delta_gap_se", "pair_accuracy",
          "anchor_delta_gap")


def final_evaluation(workdir: Path, cfg: ToyWorldConfig) -> dict[str, list[float]]:
    """Every run's last policy on every held-out question, `cfg.final_samples` answers each,
    all runs from one sampling key (`toy/final_eval.py`): per run, each question's mean
    quality, written to `final_eval.json`. Redone whenever the world runs (it is quick), so it
    always reads the runs' current checkpoints."""
    from jaxrubric.train import export

    seed = cfg.seed + FINAL_KEY_OFFSET
    tokenizer = use_workdir(workdir)
    questions = [row["prompt"] for row in held_out_rows(workdir)]
    prompts = [policy_prompt(tokenizer, q) for q in questions]
    per_question = {}
    for name in cfg.runs:
        model_dir = export(workdir / "runs" / name, "policy", workdir / "exported" / name,
                           oracle=task.oracle_reward)
        per_question[name] = final_eval.per_question_quality(
            model_dir, tokenizer, questions, prompts, task.quality, samples=cfg.final_samples,
            seed=seed, max_new_tokens=POLICY_TOKENS)
    path = workdir / FINAL_FILE
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps({"samples": cfg.final_samples, "seed": seed,
                                   "per_question": per_question}))
    partial.replace(path)  # a crash leaves the last complete file
    return per_question


def quality_curves(workdir: Path, runs: tuple[str, ...]) -> dict[str, list[dict[str, float]]]:
    """Per run, every evaluated round's held-out quality (with its standard error), Δgap and
    pair accuracy on the policy's own answers, and Δgap on the held-out anchor lists."""
    curves = {}
    for name in runs:
        history = read_eval_history(workdir / "runs" / name)
        curves[name] = [{"round": h["round"], **{k: h.get(f"eval/{k}") for k in CURVES}}
                        for h in history]
    return curves


def summarize(workdir: Path, cfg: ToyWorldConfig) -> dict[str, Any]:
    """Writes `summary.json`, `quality.png` and `saturation.png`, prints the table, returns the
    summary."""
    curves = quality_curves(workdir, cfg.runs)
    summary = {name: [p["quality"] for p in curve] for name, curve in curves.items()}
    summary["rounds"] = [p["round"] for p in next(iter(curves.values()))]
    for key in CURVES[1:]:
        summary[key] = {name: [p[key] for p in c] for name, c in curves.items()}
    if (workdir / FINAL_FILE).exists():  # the world's last stage
        final = json.loads((workdir / FINAL_FILE).read_text())
        summary["final"] = final_eval.final_summary(final["per_question"], LEADS,
                                                    final["samples"])
    summary["config"] = dataclasses.asdict(cfg)
    (workdir / "summary.json").write_text(json.dumps(summary, indent=1))
    plot(summary, workdir / "quality.png", cfg.runs)
    plot_saturation(workdir, workdir / "saturation.png", cfg.runs)
    print(table(summary, cfg.runs))
    return summary


def table(summary: dict[str, Any], runs: tuple[str, ...]) -> str:
    """The quality curves, the last Δgaps and the final evaluation's leads, as printed."""
    lines = ["round  " + "  ".join(f"{r:>8}" for r in runs)]
    for i, round_ in enumerate(summary["rounds"]):
        lines.append(f"{round_:5d}  " + "  ".join(f"{summary[r][i]:8.3f}" for r in runs))
    se = max(max(v) for v in summary["quality_se"].values())
    gaps = "  ".join(f"{r} {summary['delta_gap'][r][-1]:.3f}" for r in runs)
    text = ("held-out quality of the policy (1 = exactly the big digits; standard error "
            f"<= {se:.3f})\n" + "\n".join(lines)
            + f"\nΔgap on each run's own answers at the last evaluation: {gaps}")
    final = summary.get("final")
    if final:
        quality = "  ".join(f"{r} {final['quality'][r]:.3f} ± {final['quality_se'][r]:.3f}"
                            for r in runs)
        leads = "  ".join(f"{pair} {v['mean']:+.3f} ± {1.96 * v['se']:.3f}"
                          for pair, v in final["leads"].items())
        text += (f"\nfinal evaluation ({final['samples']} answers per question, the same "
                 f"draws for every run): {quality}\nleads, paired by question (95%): {leads}")
    return text


LABELS = {"coevolve": "co-evolving generator", "frozen": "frozen generator (stale)",
          "static": "static rubric (prompt only)", "oracle": "ground-truth reward (ceiling)"}
SMOOTHING = 10  # rounds in the running mean of a telemetry curve


def plot_saturation(workdir: Path, path: Path, runs: tuple[str, ...]) -> None:
    """Two panels of the round telemetry (docs/observability.md), a running mean over
    `SMOOTHING` rounds: the share of rubric items every answer passes or none does, and the
    share of prompts whose answers all tie (no advantage to learn from). Runs without the
    telemetry's log are left out (none: no figure)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    histories = {name: workdir / "runs" / name / METRICS_HISTORY for name in runs}
    histories = {name: path for name, path in histories.items() if path.exists()}
    if not histories:  # runs trained before the telemetry was logged
        return
    fig, panels = plt.subplots(1, 2, figsize=(10, 3.6), dpi=110)
    names = ("telemetry/generator/saturated_items", "telemetry/policy/tied_prompts")
    for name, history in histories.items():
        rows = {}
        with open(history, encoding="utf-8") as f:
            for line in f:
                row = json.loads(line)
                rows[row["round"]] = row  # after a resume the later line of a round
        rounds = sorted(r for r, row in rows.items() if all(m in row for m in names))
        for panel, metric in zip(panels, names, strict=True):
            values = np.convolve([rows[r][metric] for r in rounds], np.ones(SMOOTHING) / SMOOTHING,
                                 mode="valid")
            panel.plot(rounds[SMOOTHING - 1:], values, label=LABELS[name])
    panels[0].set(xlabel="co-evolution round", ylabel="saturated items",
                  title="Rubric items that tell no answers apart")
    panels[1].set(xlabel="co-evolution round", ylabel="tied prompts",
                  title="Prompts whose answers all score alike")
    for ax in panels:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot(summary: dict[str, Any], path: Path, runs: tuple[str, ...]) -> None:
    """Two panels: the policy's held-out quality, and the evaluator's Δgap (how far its rubric
    scores separate better from worse reference answers) per evaluated round."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (quality, gap) = plt.subplots(1, 2, figsize=(10, 3.6), dpi=110)
    for name in runs:
        quality.errorbar(summary["rounds"], summary[name], yerr=summary["quality_se"][name],
                         marker="o", ms=3, capsize=2, label=LABELS[name])
        gap.plot(summary["rounds"], summary["delta_gap"][name], marker="o", ms=3,
                 label=LABELS[name])
    quality.set(xlabel="co-evolution round", ylabel="held-out quality",
                title="Policy: keep the big digits")
    gap.set(xlabel="co-evolution round", ylabel="Δgap on the policy's own answers",
            title="Evaluator: better minus worse answer's score")
    for ax in (quality, gap):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
