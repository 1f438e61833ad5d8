"""The plan as text: memory sizes read from the command line and printed in tables."""

from __future__ import annotations

import re
from typing import Any

from jaxrubric.plan.errors import PlanError

GIB = 1024**3
MIB = 1024**2
UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
         "kib": 1024, "mib": MIB, "gib": GIB, "tib": 1024**4}


def parse_bytes(text: str) -> int:
    """`95GiB`, `80GB`, `16384MiB` or a plain byte count -> bytes."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    if not match or match.group(2).lower() not in UNITS:
        raise PlanError(f"memory size {text!r}: expected a number and a unit "
                        "(GiB, GB, MiB, MB, TiB, TB), e.g. 95GiB")
    return int(float(match.group(1)) * UNITS[match.group(2).lower()])


def table_unit(nbytes: int) -> tuple[str, int]:
    """The unit a table whose largest figure is `nbytes` prints in, and its size: GiB, or MiB
    under 1 GiB (tiny configs) so that the numbers are not all 0.00."""
    return ("GiB", GIB) if nbytes >= GIB else ("MiB", MIB)


def verdict(total: int, usable: int) -> str:
    """Whether a peak fits the usable memory, and by how much it does not."""
    return "fits" if total <= usable else (
        f"DOES NOT FIT ({total / usable:.1f}x the usable memory)")


def format_plan(plan: dict[str, Any], title: str = "") -> str:
    """The plan (`memory.plan_memory`) as a table: sections with their items, the peak and the
    verdict; on sub-meshes one table per mesh, then the verdict over all of them."""
    unit, scale = table_unit(plan["total"])
    width = 66
    row = lambda label, value: f"{label:<{width}}{value / scale:>12.2f}"  # noqa: E731
    shape = lambda mesh: " ".join(f"{a}={s}" for a, s in mesh.items())  # noqa: E731
    meshes = plan.get("meshes")
    head = f"jaxrubric plan: {title} ({plan['method']}), "
    lines = [head + (f"roles on {len(meshes)} sub-meshes = {plan['devices']} devices" if meshes
                     else f"mesh {shape(plan['mesh'])} = {plan['devices']} devices, batch split "
                          f"{plan['batch_ways']} ways"
                          + (", a program per stage" if plan.get("stage_programs") else ""))]
    for role, m in plan["models"].items():
        weights = (f"{m['param_dtype']} weights" if not m.get("lora_rank") else
                   f"{m['dtype']} base + rank-{m['lora_rank']} {m['param_dtype']} LoRA adapters "
                   f"({m['trained_parameters']:,} trained)")
        lines.append(f"  {role:<10} {m['source']}: {m['parameters']:,} parameters, "
                     f"{weights}, {m['dtype']} compute")
    lines += [f"  note: {note}" for note in plan["notes"]]

    def table(section: dict[str, Any]) -> list[str]:
        out = [f"{'per device':<{width}}{unit:>12}",
               row("state, held through the round", section["state_total"])]
        out += [row(f"  {label}", value) for label, value in section["state"]]
        for phase_name, phase in section["phases"].items():
            out.append(row(phase_name, phase.total))
            out += [row(f"  {label}", value) for label, value in phase.items]
            if phase.rule != "sum":
                out.append(f"  (peak: {phase.rule})")
        return out

    usable = plan["usable"]
    memory = (f"device memory {plan['device_memory'] / GIB:.2f} GiB, headroom "
              f"{plan['headroom']:.0%}: {usable / GIB:.2f} GiB usable")
    if not meshes:
        state_verdict = "fits" if plan["state_total"] <= usable else "does not fit"
        return "\n".join(lines + [""] + table(plan) + [
            "",
            row(f"peak = state + largest phase ({plan['peak_phase']})", plan["total"]),
            f"{memory} -> {verdict(plan['total'], usable)}",
            f"state alone: {plan['state_total'] / GIB:.2f} GiB -> {state_verdict}",
        ])
    for section in meshes:
        state_verdict = "fits" if section["state_total"] <= usable else "does not fit"
        lines += ["", f"{section['name']} mesh {shape(section['mesh'])} ({section['devices']} "
                      f"devices), batch split {section['batch_ways']} ways"]
        lines += table(section) + [
            row(f"peak = state + largest phase ({section['peak_phase']})", section["total"]),
            f"{section['name']} mesh -> {verdict(section['total'], usable)}; state alone: "
            f"{section['state_total'] / GIB:.2f} GiB -> {state_verdict}"]
    over = [s["name"] for s in meshes if not s["fits"]]
    lines += ["", f"{memory} -> " + ("fits on every mesh" if not over else
                                     f"DOES NOT FIT on the {' and '.join(over)} mesh"
                                     + ("es" if len(over) > 1 else ""))]
    return "\n".join(lines)
