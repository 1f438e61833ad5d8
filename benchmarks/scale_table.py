"""The scale table: every 8B recipe on every slice it is sized for (`jaxrubric.recipes`),
compiled by the TPU and GPU compilers as `jaxrubric plan --topology` does, on this CPU host.

    python benchmarks/scale_table.py --out /tmp/scale            # all 16, one process each
    python benchmarks/scale_table.py --out /tmp/scale --recipes qwen3_8b_dynamic_rubric \
        --slices v5p-8                                           # one of them

Each compile runs in a process of its own (an 8B round holds 10-15 GB of host memory while
XLA compiles it, for 10-60 minutes on a 2-core box) and writes `RECIPE@SLICE.json` to `--out`;
a rerun skips the ones already there, then prints the markdown table from all of them
(`--readme`: the README's short form). Per
recipe and slice: the plan's state and peak, XLA's arguments, temporaries and peak per chip,
whether the compiler's peak fits the slice's memory with 10% to spare, the plan's temporaries
(its largest phase) over XLA's at its peak (the peak less the arguments: XLA's temporaries
allocation also counts buffers it places in donated arguments' memory), the round's roofline bound with each stage's binding resource, the MFU ceiling, the
largest of the stages' `x chips/once` (the chips' FLOPs together over the stage's work done
once: above 1, chips repeat each other's rows), the decode stages' bytes per step per chip over
the weights and KV cache they must read, and the compile time. The GPU slices need the
`gpu-plan` extra, the TPU ones the `tpu` extra.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

RECIPES = ("qwen3_8b_dynamic_rubric", "llama31_8b_dynamic_rubric", "qwen3_8b_genrubric",
           "llama31_8b_genrubric")
ROOT = Path(__file__).resolve().parent.parent
GIB = 1024 ** 3


def measure(recipe: str, slice_name: str) -> dict:
    """One recipe on one slice: the plan, the compiled round and its roofline, as numbers."""
    from jaxrubric import recipes
    from jaxrubric.config import load_config
    from jaxrubric.plan import compile as plan_compile
    from jaxrubric.plan import topology
    from jaxrubric.plan.memory import plan_memory
    from jaxrubric.plan.report import parse_bytes

    chosen = recipes.slice_named(slice_name)
    config = load_config(f"{ROOT}/configs/{recipe}.py:{slice_name}")
    devices = topology.devices(chosen.topology)
    plan = plan_memory(config, parse_bytes(chosen.device_memory), devices=len(devices),
                       platform=devices[0].platform)
    limit = plan["device_memory"] if devices[0].platform == "tpu" else None
    if config.stage_programs:
        compiled = per_stage(config, devices, limit)
    else:
        compiled = plan_compile.compiled_memory(config, devices, limit)
    return row_of(recipe, slice_name, config, plan, compiled, devices)


def per_stage(config, devices: list, limit: int | None) -> dict:
    """A round of a program per stage (`config.stage_programs`) in `compiled_memory`'s terms:
    the arguments are the round's arrays a chip holds, the peak the largest stage program's
    with the state it does not read (`plan.compile.stage_peak`), the temporaries the peak less
    the arguments; the costs by stage."""
    from jaxrubric.plan import compile as plan_compile

    try:
        compiled = plan_compile.compiled_stage_memory(config, devices, limit)
    except plan_compile.StageFailed as err:
        if err.oom is None:
            raise
        return {"oom": err.oom, "seconds": 0.0}
    (mesh,) = compiled["meshes"].values()
    peak = max(plan_compile.stage_peak(mesh["state"], s) for s in mesh["stages"].values())
    return {"argument": mesh["state"], "temp": peak - mesh["state"], "peak": peak,
            "cost": {k: s["cost"] for k, s in mesh["stages"].items()},
            "model_flops": compiled["model_flops"], "seconds": compiled["seconds"],
            "stage_peaks": {k: plan_compile.stage_peak(mesh["state"], s)
                            for k, s in mesh["stages"].items()}}


def row_of(recipe: str, slice_name: str, config, plan: dict, compiled: dict,
           devices: list) -> dict:
    """The table's numbers from a plan (`plan_memory`) and a compiled round
    (`compiled_memory`)."""
    from jaxrubric import recipes
    from jaxrubric.plan import roofline, topology

    chip = topology.chip(devices[0])
    row = {"recipe": recipe, "slice": slice_name,
           "lora": recipes.slice_named(slice_name).lora_rank,
           "chips": len(devices), "usable": plan["usable"], "plan_state": plan["state_total"],
           "plan_peak": plan["total"],
           "plan_temp": plan["phase_totals"][plan["peak_phase"]],
           "seconds": compiled["seconds"]}
    if "oom" in compiled:
        row.update(refused=True, temp=compiled["oom"].temp, argument=compiled["oom"].argument)
        return row
    stages = {k: c for k, c in compiled["cost"].items() if k not in ("unknown_loops", "other")}
    bounds = {k: roofline.bound(c, chip) for k, c in stages.items()}
    work = compiled["model_flops"]
    steps = {phase: _decode_steps(config, plan, phase) for phase in plan["phases"]}
    decode = {}
    for name, phase in plan["phases"].items():
        stage = name.split(" (")[0]  # "policy rollout (induced responses)": its stage's name
        if "rollout" in name and stage in stages and steps[name]:
            held = sum(b for label, b in phase.items
                       if label.startswith(("weights laid out", "KV cache")))
            decode[stage] = stages[stage].bytes / steps[name] / held
    row.update(
        refused=False, argument=compiled["argument"], temp=compiled["temp"],
        peak=compiled["peak"], fits=compiled["peak"] <= plan["usable"],
        seconds_bound=roofline.round_seconds(bounds),
        mfu=roofline.mfu_ceiling(sum(w.model for w in work.values()),
                                 roofline.round_seconds(bounds), len(devices), chip),
        binds={k: b.binds for k, b in bounds.items()},
        repeated={k: roofline.repeated(bounds[k], work[k], len(devices))
                  for k in bounds if k in work},
        decode_bytes=decode, stage_programs=bool(config.stage_programs))
    if "stage_peaks" in compiled:
        row["stage_peaks"] = compiled["stage_peaks"]
    return row


def _decode_steps(config, plan: dict, phase: str) -> int:
    """Decode steps of a rollout stage: its micro-batches times its new tokens (the policy's
    answers, or the generator's rubric budget)."""
    if "rollout" not in phase:
        return 0
    new = (config.round.response_tokens if phase.startswith("policy")
           else plan["lengths"]["rubric"])
    return config.round.rollout_micro_batches * new


def markdown(rows: list[dict]) -> str:
    """The table docs/scale.md and the README print."""
    head = ("| recipe | slice | plan: state / peak | XLA: arguments / temporaries / peak | "
            "fits (10% spare) | temporaries plan/XLA (XLA: its peak less the arguments) | bound; memory-bound stages | MFU ceiling "
            "| x chips/once, worst stage | decode bytes per step / (weights + KV) | compile |")
    lines = [head, "|" + "---|" * 11]
    for r in rows:
        name = r["recipe"] + (f" (LoRA r{r['lora']})" if r["lora"] else "")
        plan = f"{r['plan_state'] / GIB:.1f} / {r['plan_peak'] / GIB:.1f}"
        if r["refused"]:
            xla = f"refused: temporaries {r['temp'] / GIB:.1f}"
            lines.append(f"| {name} | {r['slice']} | {plan} | {xla} | no | "
                         f"{r['plan_temp'] / max(r['temp'], 1):.2f} | - | - | - | - | "
                         f"{r['seconds']:.0f} s |")
            continue
        memory = [k for k, b in r["binds"].items() if b == "memory"]
        worst = max(r["repeated"].items(), key=lambda kv: kv[1])
        decode = ", ".join(f"{k.split()[0]} {v:.2f}" for k, v in r["decode_bytes"].items())
        lines.append(
            f"| {name} | {r['slice']} | {plan} | {r['argument'] / GIB:.1f} / "
            f"{r['temp'] / GIB:.1f} / {r['peak'] / GIB:.1f} of {r['usable'] / GIB:.1f} | "
            f"{'yes' if r['fits'] else 'no'} | "
            f"{r['plan_temp'] / (r['peak'] - r['argument']):.2f} | "
            f"{r['seconds_bound']:.0f} s; {', '.join(memory) or 'none'} | {r['mfu']:.0%} | "
            f"{worst[1]:.2f} ({worst[0]}) | {decode} | {r['seconds']:.0f} s |")
    return "\n".join(lines)


def compact(rows: list[dict]) -> str:
    """The README's short form: per recipe and slice, the compiler's verdict and the bound."""
    lines = ["| recipe | slice | compiler's peak per chip (usable) | fits, 10% spare | round's "
             "bound; MFU ceiling |", "|---|---|---|---|---|"]
    for r in rows:
        name = r["recipe"] + (f" (LoRA r{r['lora']})" if r["lora"] else "")
        usable = f"{r['usable'] / GIB:.1f}"
        if r["refused"]:
            lines.append(f"| {name} | {r['slice']} | refused: {r['temp'] / GIB:.1f} GiB of "
                         f"temporaries ({usable}) | no | - |")
        else:
            lines.append(f"| {name} | {r['slice']} | {r['peak'] / GIB:.1f} GiB ({usable}) | "
                         f"{'yes' if r['fits'] else 'no'} | {r['seconds_bound']:.0f} s; "
                         f"{r['mfu']:.0%} |")
    return "\n".join(lines)


def main() -> None:
    from jaxrubric.recipes import SLICES

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--recipes", nargs="+", default=RECIPES)
    parser.add_argument("--slices", nargs="+", default=list(SLICES))
    parser.add_argument("--readme", action="store_true", help="the README's short table")
    parser.add_argument("--table-only", action="store_true",
                        help="print the table of what --out holds, compiling nothing")
    parser.add_argument("--one", nargs=2, metavar=("RECIPE", "SLICE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.one:
        recipe, slice_name = args.one
        (args.out / f"{recipe}@{slice_name}.json").write_text(
            json.dumps(measure(recipe, slice_name), indent=1))
        return
    for recipe in args.recipes:
        for slice_name in args.slices:
            path = args.out / f"{recipe}@{slice_name}.json"
            if path.exists() or args.table_only:
                continue
            print(f"compiling {recipe} for {slice_name}...", flush=True)
            subprocess.run([sys.executable, __file__, "--out", str(args.out), "--one", recipe,
                            slice_name], check=True)
    rows = [json.loads((args.out / f"{r}@{s}.json").read_text())
            for r in args.recipes for s in args.slices
            if (args.out / f"{r}@{s}.json").exists()]
    print(compact(rows) if args.readme else markdown(rows))


if __name__ == "__main__":
    main()
