"""Which curves the report draws from a run's scalars, and the runs overlaid on one chart.

Each chart groups scalars read on one scale (`CHARTS`); evaluation scalars no chart names
get a chart per family (`eval/agreement/spearman` and its siblings on `eval/agreement`).
A chart is drawn when any run has any of its scalars.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from jaxrubric.report.data import Run
from jaxrubric.report.svg import Chart, Marker, Series
from jaxrubric.watch import DEFAULT_GOLD

GEN, POL = "telemetry/generator/", "telemetry/policy/"
# Evaluation scalars that only qualify another one (its error, what it left out).
_QUALIFIERS = ("_se", "_skipped", "_left_out")


@dataclasses.dataclass(frozen=True)
class ChartSpec:
    title: str
    names: tuple[str, ...]
    note: str


CHARTS = (
    ChartSpec("Held-out quality", DEFAULT_GOLD,
              "the gold metric: the ground truth of the policy's held-out answers, or their "
              "score under expert rubrics (data.gold)"),
    ChartSpec("Δgap", ("eval/delta_gap", "eval/anchor_delta_gap"),
              "the evaluator's score gap between better and worse answers (held out)"),
    ChartSpec("Agreement with the ground truth",
              (GEN + "oracle_agreement", "eval/pair_accuracy"),
              "answer pairs the evaluator orders as the ground truth does"),
    ChartSpec("Rewards", ("policy/reward", "generator/reward"), "each role's mean reward"),
    ChartSpec("Saturation", (GEN + "saturated_items", GEN + "saturated_weight"),
              "items every answer passes or every answer fails: they rank nothing"),
    ChartSpec("Spread", (GEN + "item_discriminability", POL + "tied_prompts"),
              "how much the items separate answers, and prompts whose answers all tie"),
    ChartSpec("Rubric validity",
              (GEN + "invalid_rubrics", GEN + "truncated_rubrics", GEN + "duplicate_items",
               GEN + "redundant_items", "rubric/valid_rate"),
              "shares of rubrics that do not score or were cut, and of repeated items"),
    ChartSpec("Score-length correlation", (POL + "score_length_corr",),
              "a rubric that pays for length shows here before the answers grow"),
    ChartSpec("Answer length", (POL + "length_mean", POL + "length_std"),
              "the policy's answers, in tokens"),
    ChartSpec("Rubric shape", (GEN + "items_per_rubric", GEN + "weight_mean",
                               GEN + "weight_std"), "items per rubric and their weights"),
    ChartSpec("Rubric tokens", (GEN + "rubric_tokens",), "tokens per written rubric"),
)


def short_name(name: str) -> str:
    """A scalar's name without the telemetry prefix (the chart says what it is)."""
    return name.removeprefix("telemetry/")


def gold_metrics(runs: Sequence[Run]) -> list[str]:
    """The gold metrics the runs' watches compare the training reward with, where a config
    names one other than the defaults (`config.watch.gold`, `jaxrubric.watch`)."""
    names = []
    for run in runs:
        gold = ((run.config or {}).get("watch") or {}).get("gold")
        if not gold:
            continue
        gold = gold if gold.startswith("eval/") else f"eval/{gold}"
        if gold not in DEFAULT_GOLD and gold not in names:
            names.append(gold)
    return names


def chart_specs(runs: Sequence[Run]) -> list[ChartSpec]:
    """`CHARTS`, the watch's gold metric where a config names another, and one chart per
    family of the runs' other evaluation scalars."""
    gold = gold_metrics(runs)
    specs = [*CHARTS[:1], *(ChartSpec(f"Gold metric {name}", (name,), "the metric the "
                                      "reward-hacking watch holds the training reward to")
                            for name in gold), *CHARTS[1:]]
    named = {n for spec in specs for n in spec.names}
    families: dict[str, list[str]] = {}
    for run in runs:
        for name in run.scalars:
            if (name.startswith("eval/") and name not in named
                    and not name.endswith(_QUALIFIERS)):
                family = name.rsplit("/", 1)[0]
                if name not in families.setdefault(family, []):
                    families[family].append(name)
    return [*specs, *(ChartSpec(family, tuple(sorted(names)), "held-out evaluation")
                      for family, names in sorted(families.items()))]


def charts(runs: Sequence[Run]) -> list[Chart]:
    """The charts the runs have data for. With several runs every chart overlays them: a run
    keeps its colour across charts and a scalar its dash; watch warnings mark every chart."""
    several = len(runs) > 1
    markers = tuple(
        Marker(w.round, f"{run.name + ': ' if several else ''}{w.kind} at round {w.round}: "
                        f"{w.message}")
        for run in runs for w in run.warnings)
    out = []
    for spec in chart_specs(runs):
        series = []
        for r, run in enumerate(runs):
            for n, name in enumerate(spec.names):
                points = run.scalars.get(name)
                if points:
                    label = f"{run.name}: {short_name(name)}" if several else short_name(name)
                    series.append(Series(label, tuple((float(x), y) for x, y in points),
                                         colour=r if several else n, dash=n if several else 0))
        if series:
            out.append(Chart(spec.title, tuple(series), markers, spec.note))
    return out
