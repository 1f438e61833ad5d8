"""The toy world over several seeds: does co-evolution beat the stale and the static evaluator?

    python benchmarks/toy_world_seeds.py --seeds 0 1 2 [--workdir toy_seeds] [--rounds N]

Runs `jaxrubric.toy.world.run_toy_world` once per seed (each seed's workdir is cached, so a
rerun only re-reads) and prints, per seed, the final held-out quality of every run with its
standard error (clustered by question) from the world's final evaluation (every run's last
policy, `final_samples` answers per question, the same sampling draws for every run:
`jaxrubric/toy/final_eval.py`), the co-evolving run's lead over the frozen and the static run
with 95% intervals (±1.96 times the standard error of the difference paired by question) and
in standard errors, and Δgap on each run's own answers at the last evaluation (the
paper's mechanism: it stays open under co-evolution and closes under a stale evaluator),
with its standard error clustered by question. The ground-truth run's lead over the same
two baselines is printed beside the co-evolving one's: the most any evaluator could lead by
in that world, so a seed on which the ceiling itself is level with a baseline cannot show
co-evolution ahead of it. A second table gives each run's Δgap at its last evaluation minus
its first: the saturation the paper names, a change rather than a level, since the stale
evaluator starts with the wider gaps (it trained longer on the warm start's answers).

A seed's interval holds the evaluation's noise only (which questions, which sampled answers),
not the training's: one run per seed is one draw of its rounds' sampling. With several seeds
it also prints each lead's mean over the seeds with the standard error of that mean across
seeds, which holds both (and the warm starts' spread).
Measure run times without `XLA_FLAGS` (one CPU device), as a user runs `jaxrubric train`.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import math
import time
from pathlib import Path

from jaxrubric.toy.final_eval import mean_and_se
from jaxrubric.toy.world import ToyWorldConfig, run_toy_world
from jaxrubric.toy.world_config import LEADS, RUNS


def lead(summary: dict, a: str, b: str, key: str = "quality") -> tuple[float, float]:
    """`a`'s final quality (`key` "delta_gap": Δgap) minus `b`'s, and the half-width of its 95%
    interval: quality from the final evaluation, paired by question; Δgap from the last
    training-time evaluations, as two independent ones (each samples its own answers)."""
    if key == "quality":
        paired = summary["final"]["leads"][f"{a}-{b}"]
        return paired["mean"], 1.96 * paired["se"]
    gaps, errors = summary["delta_gap"], summary["delta_gap_se"]
    return gaps[a][-1] - gaps[b][-1], 1.96 * math.hypot(errors[a][-1], errors[b][-1])


def gap_change(summary: dict, run: str) -> tuple[float, float]:
    """`run`'s Δgap at the last evaluation minus at the first (the paper's saturation: an
    evaluator whose gaps on the policy's own answers close as the policy moves on), and the
    half-width of its 95% interval (the two evaluations sample independent answers)."""
    gaps, errors = summary["delta_gap"][run], summary["delta_gap_se"][run]
    return gaps[-1] - gaps[0], 1.96 * math.hypot(errors[0], errors[-1])


def quality_cell(summary: dict, run: str) -> str:
    """`run`'s quality in the final evaluation ± its standard error."""
    final = summary["final"]
    return f"{final['quality'][run]:.3f} ± {final['quality_se'][run]:.3f}"


def lead_cell(mean: float, half_width: float) -> str:
    ses = f" ({mean / (half_width / 1.96):+.1f} SE)" if half_width else ""
    return f"{mean:+.3f} ± {half_width:.3f}{ses}"


def gap_cell(summary: dict, run: str) -> str:
    return f"{summary['delta_gap'][run][-1]:.3f} ± {summary['delta_gap_se'][run][-1]:.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--workdir", default="toy_seeds", help="one folder per seed inside")
    parser.add_argument("--rounds", type=int, default=0, help="rounds per run (0: default)")
    args = parser.parse_args()
    rows = []
    for seed in args.seeds:
        cfg = ToyWorldConfig(seed=seed, **({"rounds": args.rounds} if args.rounds else {}))
        cfg = dataclasses.replace(cfg, eval_every=min(cfg.eval_every, cfg.rounds))
        start = time.perf_counter()
        summary = run_toy_world(Path(args.workdir) / f"seed{seed}", cfg)
        rows.append((seed, summary, time.perf_counter() - start))
    print_report(rows)


def print_report(rows: list[tuple[int, dict, float]]) -> None:
    """The seeds table and the across-seed leads, from (seed, summary.json, seconds) rows."""
    runs = [r for r in RUNS if r in rows[0][1]]
    print("\nfinal held-out quality ± standard error; leads of coevolve and of the ceiling "
          "(oracle) with 95% intervals (paired by question) and in standard errors; Δgap on own "
          "answers at the last evaluation")
    pairs = [pair for pair in LEADS if set(pair) <= set(runs)]
    head = ["seed", *runs, *(f"{a}-{b}" for a, b in pairs), *(f"Δgap {r}" for r in runs),
            "minutes"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for seed, summary, seconds in rows:
        quality = [quality_cell(summary, r) for r in runs]
        leads = [lead_cell(*lead(summary, a, b)) for a, b in pairs]
        gaps = [gap_cell(summary, r) for r in runs]
        print(f"| {seed} | " + " | ".join([*quality, *leads, *gaps, f"{seconds / 60:.1f}"])
              + " |")
    print("\nΔgap on own answers, last evaluation minus first, with 95% intervals")
    print("| seed | " + " | ".join(runs) + " |")
    print("|" + "---|" * (len(runs) + 1))
    for seed, summary, _ in rows:
        print(f"| {seed} | " + " | ".join("{:+.3f} ± {:.3f}".format(*gap_change(summary, r))
                                          for r in runs) + " |")
    if len(rows) > 1:
        for run in runs:
            changes = [gap_change(summary, run)[0] for _, summary, _ in rows]
            mean, se = mean_and_se(changes)
            print(f"Δgap change of {run} over {len(changes)} seeds: {mean:+.3f} ± {se:.3f} "
                  f"(standard error across seeds; closed on {sum(c < 0 for c in changes)})")
        for base in ("frozen", "static"):
            if "coevolve" in runs and base in runs:
                diffs = [gap_change(summary, "coevolve")[0] - gap_change(summary, base)[0]
                         for _, summary, _ in rows]
                mean, se = mean_and_se(diffs)
                print(f"Δgap change of coevolve minus {base}'s: {mean:+.3f} ± {se:.3f} "
                      f"(standard error across seeds; coevolve's closed less on "
                      f"{sum(d > 0 for d in diffs)})")
        for key, (a, b) in itertools.product(("quality", "delta_gap"), pairs):
            if key == "quality" or a == "coevolve":
                diffs = [lead(summary, a, b, key)[0] for _, summary, _ in rows]
                mean, se = mean_and_se(diffs)
                ahead = sum(d > 0 for d in diffs)
                print(f"{key}: {a} - {b} over {len(diffs)} seeds: {mean:+.3f} ± "
                      f"{se:.3f} (standard error across seeds: training and evaluation noise; "
                      f"ahead on {ahead})")


if __name__ == "__main__":
    main()
