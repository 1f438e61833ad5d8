"""The GenRubric toy world over several seeds: does self-evolution raise agreement with the
expert rubric, beyond what the shuffled-reward control does?

    python benchmarks/genrubric_seeds.py --seeds 0 1 2 [--workdir genrubric_seeds]

Runs `jaxrubric.toy.genrubric_world.run_genrubric_world` once per seed (each seed's workdir is
cached, so a rerun only re-reads) and prints, per seed: Spearman and pairwise accuracy with the
expert rubric at the cold start and at the last round, for the evolving run, the control and
the evolving run judged by the checker; the evolving run's rise and its lead over the control,
each with a paired 95% bootstrap interval over the held-out queries; the rise of its pairwise
accuracy, with its interval; and the minutes the seed took. A seed's interval holds the
evaluation's noise (which queries, which sampled rubrics), not the training's: one run per seed
is one draw of its rounds. Measure run times without `XLA_FLAGS` (one CPU device), as a user
runs `jaxrubric train`.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from jaxrubric.toy.genrubric_world import GenRubricWorldConfig, run_genrubric_world


def interval(value: dict) -> str:
    if value["mean"] is None:
        return "-"
    return f"{value['mean']:+.3f} [{value['low']:+.3f}, {value['high']:+.3f}]"


def show(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def first_last(summary: dict, name: str, metric: str) -> str:
    values = summary[name][metric]
    return f"{show(values[0])} -> {show(values[-1])}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--workdir", default="genrubric_seeds", help="one folder per seed inside")
    args = parser.parse_args()
    rows = []
    for seed in args.seeds:
        start = time.perf_counter()
        summary = run_genrubric_world(Path(args.workdir) / f"seed{seed}",
                                      GenRubricWorldConfig(seed=seed))
        rows.append((seed, summary, time.perf_counter() - start))
    head = ["seed", "Spearman evolving", "control", "checker-judged",
            "pairwise evolving (control)", "rise (Spearman)", "evolving - control",
            "checker-judged rise", "pairwise rise", "minutes"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for seed, summary, seconds in rows:
        intervals = summary["intervals"]
        cells = [str(seed), first_last(summary, "evolving", "spearman"),
                 first_last(summary, "control", "spearman"),
                 first_last(summary, "checker_judged", "spearman"),
                 f"{first_last(summary, 'evolving', 'pairwise')} "
                 f"({show(summary['control']['pairwise'][-1])})",
                 interval(intervals["evolving_rise"]["spearman"]),
                 interval(intervals["evolving_minus_control"]["spearman"]),
                 interval(intervals["checker_judged_rise"]["spearman"]),
                 interval(intervals["evolving_rise"]["pairwise"]), f"{seconds / 60:.1f}"]
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
