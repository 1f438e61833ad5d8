"""The roofline of a compiled round: a lower bound on each stage's time, and on the round's.

A stage can run no faster than its FLOPs at the chip's bf16 peak, nor than its HBM bytes at
the chip's bandwidth (`jaxrubric.mfu`); the larger of the two binds. FLOPs and bytes are
XLA's, per chip, from the compiled program (`plan.hlo_cost`). It is a bound, not a
measurement: real steps also wait on collectives, on the host, on kernels below peak.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from jaxrubric.plan.hlo_cost import Cost
from jaxrubric.plan.topology import Chip


class Bound(NamedTuple):
    """One stage's roofline on one chip."""

    cost: Cost
    compute_s: float
    memory_s: float

    @property
    def seconds(self) -> float:
        return max(self.compute_s, self.memory_s)

    @property
    def binds(self) -> str:
        return "compute" if self.compute_s >= self.memory_s else "memory"


def bound(cost: Cost, chip: Chip) -> Bound:
    """The roofline of `cost` (per chip) on `chip`."""
    if chip.peak_flops is None or chip.hbm_bandwidth is None:
        raise ValueError(f"no peak FLOP/s or HBM bandwidth known for {chip.kind!r}")
    return Bound(cost, cost.flops / chip.peak_flops, cost.bytes / chip.hbm_bandwidth)


class Work(NamedTuple):
    """A stage's work over all chips: its model FLOPs (`jaxrubric.flops`, what MFU counts),
    and its work done once: the model FLOPs plus the recomputation its remat policy asks for.
    The chips' FLOPs together over `once` is near 1 when no chip repeats another's rows."""

    model: float = 0.0
    once: float = 0.0

    def __add__(self, other: Work) -> Work:  # type: ignore[override]
        return Work(self.model + other.model, self.once + other.once)


def repeated(bound: Bound, work: Work, chips: int) -> float:
    """The chips' FLOPs together over the stage's work done once."""
    return bound.cost.flops * chips / work.once if work.once else float("nan")


def round_seconds(bounds: Mapping[str, Bound], meshes: Mapping[str, str] | None = None
                  ) -> float:
    """The round's bound: its stages one after another, except the updates of roles on
    different meshes (`meshes`: stage -> mesh name), which run at the same time."""
    updates: dict[str, float] = {}
    total = 0.0
    for stage, b in bounds.items():
        if meshes and stage.endswith("update"):
            updates[meshes[stage]] = updates.get(meshes[stage], 0.0) + b.seconds
        else:
            total += b.seconds
    return total + max(updates.values(), default=0.0)


def mfu_ceiling(model_flops: float, seconds: float, chips: int, chip: Chip) -> float:
    """The MFU of a round done in `seconds`: its model FLOPs (`jaxrubric.flops`, what
    training logs MFU from) over the chips' peak."""
    return model_flops / (seconds * chips * chip.peak_flops)


def format_roofline(bounds: Mapping[str, Bound], work: Mapping[str, Work], chips: int,
                    chip: Chip, meshes: Mapping[str, str] | None = None) -> str:
    """Per stage: XLA's TFLOPs and GB per chip, the compute and memory times, the bound and
    which binds, the model TFLOPs over all chips and the chips' FLOPs together over the work
    done once (`repeated`); then the round's bound and MFU ceiling."""
    head = (f"Roofline on {chip.kind} ({chip.peak_flops / 1e12:.0f} TFLOP/s bf16, "
            f"{chip.hbm_bandwidth / 1e9:,.0f} GB/s HBM per chip), from XLA's FLOPs and bytes "
            "per chip: a lower bound on time, not a measurement")
    w = 30
    lines = [head, f"{'stage':<{w}}{'TFLOP':>9}{'GB':>9}{'compute s':>11}{'memory s':>10}"
                   f"{'bound s':>9}  {'binds':<8}{'model TFLOP':>12}{'x chips/once':>13}"]
    for stage, b in bounds.items():
        done = work.get(stage)
        lines.append(f"{stage:<{w}}{b.cost.flops / 1e12:>9.2f}{b.cost.bytes / 1e9:>9.1f}"
                     f"{b.compute_s:>11.3f}{b.memory_s:>10.3f}{b.seconds:>9.3f}  {b.binds:<8}"
                     + ("" if done is None else f"{done.model / 1e12:>12.1f}"
                        f"{repeated(b, done, chips):>13.2f}"))
    seconds = round_seconds(bounds, meshes)
    total_model = sum(w.model for w in work.values())
    lines.append(f"round: at least {seconds:.2f} s on {chips} chips; MFU at most "
                 f"{mfu_ceiling(total_model, seconds, chips, chip):.0%} "
                 f"({total_model / 1e12:,.0f} model TFLOP)")
    return "\n".join(lines)
