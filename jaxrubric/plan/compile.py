"""`jaxrubric plan --compile` and `--topology`: the plan checked against the compiler.

Lowers and compiles the round exactly as training builds it, from shapes (`plan.abstract`: no
weights), without running it, for this machine's devices (`--compile`) or a TPU slice's or
GPUs' (`--topology`, `plan.topology`), and sets XLA's memory analysis beside the plan's estimate:
the whole round when the roles share a mesh, each stage program (`placement.SubMeshes`) when
they are on sub-meshes or `config.stage_programs` asks for them; with each program's FLOPs and bytes (`plan.hlo_cost`) for the
roofline (`plan.roofline`).
"""

from __future__ import annotations

import math
import re
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import jax
import ml_collections
import numpy as np
from jax.sharding import Mesh

from jaxrubric import flops, placement
from jaxrubric.methods.programs import round_program
from jaxrubric.models.config import ModelConfig
from jaxrubric.plan import hlo_cost
from jaxrubric.plan.abstract import AbstractRound, abstract_round
from jaxrubric.plan.errors import PlanError
from jaxrubric.plan.meshes import mesh_name, role_meshes, stage_key
from jaxrubric.plan.report import GIB, table_unit, verdict
from jaxrubric.plan.roofline import Work, bound, format_roofline
from jaxrubric.plan.topology import Chip
from jaxrubric.roles import ROLES, Role


def local_devices_for(config: ml_collections.ConfigDict, requested: int | None = None) -> int:
    """The devices a compile runs on (this machine's), checked against the mesh."""
    available = len(jax.devices())
    try:
        if requested not in (None, available):
            raise PlanError(f"--devices is {requested}")
        role_meshes(config, available)
    except PlanError as err:
        raise PlanError(f"--compile builds the round on this machine's {available} devices: "
                        f"{err}") from err
    return available


# Every stage program's plan name (`meshes.stage_key`): rollouts, the verifier, updates.
STAGES = tuple(dict.fromkeys(stage_key(role, keep) for role in ROLES for keep in (0, 1)))


class StageFailed(PlanError):
    """A stage that does not lower or compile for the target, named by stage and role; `oom`:
    the compiler's refusal where the stage does not fit the memory (`OutOfMemory`)."""

    def __init__(self, message: str, oom: OutOfMemory | None = None):
        super().__init__(message)
        self.oom = oom


def _failed(what: str, err: Exception) -> StageFailed:
    """The first lines of the compiler's message, under the name of what failed."""
    lines = [line for line in str(err).splitlines() if line.strip()]
    if "cuDNN not found" in str(err):  # a compile-only GPU environment (the gpu-plan extra)
        lines[:1] = [lines[0] + " (its attention goes through cuDNN, whose compile needs cuDNN "
                     "itself: pip install --no-deps nvidia-cudnn-cu12, or compile the einsum "
                     "form with --config.<role>.attention_impl=xla)"]
    return StageFailed(f"{what} does not lower or compile: "
                       + ("\n  ".join(lines[:6]) or type(err).__name__))


class ScopedStages:
    """`placement.colocated` with each stage traced under a `jax.named_scope` of its plan name
    (`meshes.stage_key`): the same program, its ops named by stage in the compiled HLO (for
    `plan.hlo_cost`), and a stage that fails to lower is reported by name."""

    def __call__(self, role: Role, stage: Callable[..., Any], setup: Any, *args: Any,
                 keep: int = 0) -> Any:
        key = stage_key(role, keep)
        try:
            with jax.named_scope(key):
                return stage(setup, *args)
        except StageFailed:
            raise
        except Exception as err:
            raise _failed(f"stage {key!r} (role {role})", err) from err


GB_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}
_SIZE = r"([\d.]+)([KMGT]?)"


def _size(pattern: str, text: str) -> int | None:
    match = re.search(pattern.replace("SIZE", _SIZE), text)
    return None if match is None else int(float(match.group(1)) * GB_UNITS[match.group(2)])


class OutOfMemory(NamedTuple):
    """The TPU compiler's refusal of a program that does not fit the chip's memory (or the
    limit `compiled_memory` sets): what it says the program needs, per chip, and the
    optimised HLO it dumped (for the roofline)."""

    capacity: int | None
    temp: int | None  # the program's temporaries ("program" in XLA's report)
    argument: int | None  # None when the temporaries alone are too many (checked first)
    hlo: str


def out_of_memory(message: str, dump: Path) -> OutOfMemory | None:
    """`message` read as the TPU compiler's out-of-memory error (two forms: the temporaries
    alone exceed the memory, checked early; or the buffers assigned do), else None."""
    if "RESOURCE_EXHAUSTED" not in message or "memory" not in message:
        return None
    early = re.search(rf"HLO temporaries \({_SIZE}\) exceeds available HBM \({_SIZE}\)",
                      message)
    if early:
        temp = int(float(early.group(1)) * GB_UNITS[early.group(2)])
        capacity = int(float(early.group(3)) * GB_UNITS[early.group(4)])
        argument = None
    else:
        capacity = _size(r"Used SIZE of SIZE hbm".replace("SIZE of ", r"[\d.]+[KMGT]? of ", 1),
                         message)
        temp, argument = _size(r"program\s+SIZE", message), _size(r"arguments\s+SIZE", message)
    optimised = sorted(dump.rglob("*after_optimizations.txt"))
    return OutOfMemory(capacity, temp, argument, optimised[0].read_text() if optimised else "")


def _compile(lowered: Any, what: str, memory_limit: int | None) -> tuple[Any, OutOfMemory | None]:
    """`lowered` compiled, or the compiler's out-of-memory verdict. With `memory_limit` (a
    TPU target) the compiler itself holds the program to that many bytes per chip
    (`xla_tpu_max_hbm_size_mib`; it never allows more than the chip has), and dumps the
    optimised HLO, which an out-of-memory error leaves behind."""
    with tempfile.TemporaryDirectory() as dump:
        options = None if memory_limit is None else {
            "xla_tpu_max_hbm_size_mib": str(memory_limit // GB_UNITS["M"]),
            "xla_dump_to": dump, "xla_dump_hlo_as_text": True,
            "xla_dump_hlo_module_re": "jit_"}
        try:
            return lowered.compile(compiler_options=options), None
        except Exception as err:
            oom = out_of_memory(str(err), Path(dump)) if memory_limit is not None else None
            if oom is None:
                raise _failed(what, err) from err
            return None, oom


def _memory(compiled: Any) -> dict[str, int]:
    """XLA's memory analysis, per device: its buffers by kind and its peak. The peak is the
    compiler's own (`peak_memory_in_bytes`, buffers live at once after temporaries took
    the memory of donated arguments) where it reports one; else the upper bound arguments +
    temporaries + the outputs not written into donated arguments (`bound`, always given)."""
    a = compiled.memory_analysis()
    out = {"argument": a.argument_size_in_bytes, "output": a.output_size_in_bytes,
           "alias": a.alias_size_in_bytes, "temp": a.temp_size_in_bytes,
           "generated_code": a.generated_code_size_in_bytes}
    out["bound"] = out["argument"] + out["temp"] + out["output"] - out["alias"]
    out["peak"] = getattr(a, "peak_memory_in_bytes", 0) or out["bound"]
    return out


def compiled_memory(config: ml_collections.ConfigDict,
                    devices: Sequence[jax.Device] | None = None,
                    memory_limit: int | None = None) -> dict[str, Any]:
    """XLA's analysis of the real round of `config`, compiled for `config.mesh` over `devices`
    (default this machine's; on CPU, fake them with
    `XLA_FLAGS=--xla_force_host_platform_device_count=N` before jax starts; a TPU slice's or
    GPUs' from `plan.topology`), lowered from shapes (`plan.abstract`) and never run.

    Jits the method's round with `methods.programs.round_program`, as training does. Per-device
    bytes: `argument` (state, frozen weights, batch, rng, in the device's layout: on TPU
    padded to its tiles), `output`, `alias` (outputs written into donated arguments), `temp`
    (XLA's peak of everything else), `generated_code`, `peak`; `argument_arrays`: the
    arguments' own bytes; `cost`: FLOPs and bytes per stage (`hlo_cost`), `xla_cost`: XLA's
    cost analysis (loop bodies once), `model_flops`, `seconds` to build and compile.
    """
    if devices is None:
        local_devices_for(config)
    start = time.perf_counter()
    built = abstract_round(config, jax.devices() if devices is None else devices)
    method = built.method
    jitted = round_program(
        built.setup,
        placement.within(ScopedStages(), method.round),
        jax.tree.map(lambda x: x.sharding, built.state))
    try:
        lowered = jitted.lower(built.state, built.frozen, built.batch, built.rng)
    except StageFailed:
        raise
    except Exception as err:  # between the stages: the round's own glue
        raise _failed("the round (between its stages)", err) from err
    compiled, oom = _compile(lowered, "the round (one program of every stage)", memory_limit)
    arrays = jax.tree.leaves((built.state, built.frozen, built.batch, built.rng))
    found = ({"oom": oom} if compiled is None else
             {**_memory(compiled), "xla_cost": compiled.cost_analysis()})
    text = oom.hlo if compiled is None else compiled.as_text()
    return {**found, "cost": hlo_cost.stage_costs(text, STAGES) if text else None,
            "argument_arrays": sum(_device_bytes(x) for x in arrays),
            "seconds": time.perf_counter() - start, "note": built.tokenizer_note,
            "model_flops": _model_flops(built)}


def _model_flops(built: AbstractRound) -> dict[str, Work]:
    """The round's model FLOPs (what training's MFU counts, `jaxrubric.flops`) and its work
    done once (`Work`), per stage program (`meshes.stage_key`)."""
    setup = built.setup
    shapes = built.method.round_shapes(setup, built.state, built.frozen, built.batch, built.rng)
    out: dict[str, Work] = {}
    for name, value in flops.round_flops_by_stage(built.configs, setup.config, shapes).items():
        role, kind = name.split("/")
        key = stage_key(role, kind in ("update", "reference"))
        once = value * (recompute(built.configs[role]) if kind == "update" else 1.0)
        out[key] = out.get(key, Work()) + Work(value, once)
    return out


def recompute(model: ModelConfig) -> float:
    """The factor rematerialisation puts on a trained role's update FLOPs: `remat=full`
    recomputes each layer's forward once in the backward pass (forward + backward is 3
    forwards, 2 for a LoRA role whose frozen base takes no weight gradients); the `dots_*`
    policies keep the matmuls' results (their recomputation is element-wise work, which model
    FLOPs do not count)."""
    if model.remat != "full":
        return 1.0
    passes = 3.0 if model.lora is None else 2.0
    return (passes + 1.0) / passes


def _device_bytes(x: Any) -> int:
    """One device's shard of an array or `ShapeDtypeStruct` with a sharding."""
    return math.prod(x.sharding.shard_shape(x.shape)) * x.dtype.itemsize


def _abstract(tree: Any) -> Any:
    """Shapes, dtypes and shardings: all that lowering a program needs."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                        tree)


def _on_mesh(x: jax.ShapeDtypeStruct, mesh: Mesh) -> jax.ShapeDtypeStruct:
    """`x` where `placement.to_mesh` puts it for a stage on `mesh`."""
    target = placement.destination(x, mesh)
    return x if target is None else jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=target)


class StageCompiler:
    """A `placement.Placement` that compiles each stage's program as `placement.SubMeshes`
    jits it, for abstract inputs, and runs nothing: the stage's outputs come back abstract,
    with the compiler's shardings, for the next stage to compile against. `stages` records
    each program's memory analysis, FLOPs and bytes (`hlo_cost`), compile time, the bytes
    per device it receives from other meshes (`moved`) and those of its arguments that are
    the round's own arrays (`from_state`: of `state`, whose ids it is given)."""

    def __init__(self, meshes: Mapping[Role, Mesh], memory_limit: int | None = None,
                 state: Any = ()):
        self.meshes = dict(meshes)
        self.memory_limit = memory_limit
        self._state_ids = {id(x) for x in jax.tree.leaves(state)}
        self.stages: list[dict[str, Any]] = []
        self._moved: dict[str, dict[int, tuple[Any, Any]]] = {}  # per plan stage, by source

    def __call__(self, role: Role, stage: Callable[..., Any], setup: Any, *args: Any,
                 keep: int = 0) -> Any:
        mesh, key = self.meshes[role], stage_key(role, keep)
        placed = jax.tree.map(lambda x: _on_mesh(x, mesh), args)
        # Each input counted once per plan stage, as `placement.SubMeshes` moves it once.
        earlier = self._moved.setdefault(key, {})
        fresh = {id(old): (old, new) for old, new in zip(jax.tree.leaves(args),
                                                         jax.tree.leaves(placed))
                 if new is not old and id(old) not in earlier}
        earlier.update(fresh)
        moved = sum(_device_bytes(new) for _, new in fresh.values())
        start = time.perf_counter()
        what = f"stage {key!r} (role {role})"
        compiled, oom = _compile(placement.stage_program(setup, stage, mesh, placed, keep)
                                 .lower(*placed), what, self.memory_limit)
        if oom is not None:
            raise StageFailed(f"{what} does not fit: the TPU compiler needs {oom.temp / GIB:.2f} "
                              f"GiB of temporaries per chip"
                              + (f" and {oom.argument / GIB:.2f} GiB of arguments"
                                 if oom.argument else "")
                              + f", over the {self.memory_limit / GIB:.2f} GiB allowed", oom)
        cost = hlo_cost.stage_costs(compiled.as_text())
        from_state = sum(_device_bytes(x) for x in jax.tree.leaves(placed)
                         if id(x) in self._state_ids)
        self.stages.append({"role": role, "stage": key, "moved": moved, "from_state": from_state,
                            **_memory(compiled), "seconds": time.perf_counter() - start,
                            "cost": hlo_cost.total(cost),
                            "unknown_loops": cost["unknown_loops"].flops})
        return _abstract(compiled.out_info)


def _per_stage(programs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The programs of each plan stage (`meshes.stage_key`) as one: the verifier's judge and
    reward are two programs. The memory analysis of the one with the most temporaries; the
    inputs moved, compile time and cost summed."""
    stages: dict[str, dict[str, Any]] = {}
    for program in programs:
        first = stages.get(program["stage"])
        if first is not None:
            program = {**max(first, program, key=lambda p: p["temp"]),
                       **{k: first[k] + program[k]
                          for k in ("moved", "seconds", "cost", "unknown_loops")}}
        stages[program["stage"]] = program
    return stages


def compiled_stage_memory(config: ml_collections.ConfigDict,
                          devices: Sequence[jax.Device] | None = None,
                          memory_limit: int | None = None) -> dict[str, Any]:
    """With roles on sub-meshes: per mesh, the bytes per device of the round's arrays on it
    (its state; the batch and the round's rng key live on the policy's mesh) and XLA's
    analysis of each stage program on it, compiled over `devices` (default this machine's) as
    `placement.SubMeshes` builds them, from shapes, without running (see `StageCompiler`).

    Returns `meshes`: mesh name (`meshes.mesh_name`) -> `state` and `stages` (stage key ->
    memory analysis, `moved`, `cost`, `seconds`), `model_flops` and the `seconds` it took.
    """
    if devices is None:
        local_devices_for(config)
    start = time.perf_counter()
    built = abstract_round(config, jax.devices() if devices is None else devices)
    # The round adds one to its counter between the stages, outside every program: a host
    # number stands in for it.
    state = built.state._replace(round=np.int32(0))
    compiler = StageCompiler(built.meshes, memory_limit,
                             (state, built.frozen, built.batch, built.rng))
    placement.within(compiler, built.method.round)(
        built.setup, state, built.frozen, built.batch, built.rng)
    groups: dict[int, list[Role]] = {}
    for role, mesh in built.meshes.items():
        groups.setdefault(id(mesh), []).append(role)
    meshes = {}
    for roles in groups.values():
        devices_of = set(built.meshes[roles[0]].devices.flat)
        held = [x for x in jax.tree.leaves((built.state, built.frozen, built.batch, built.rng))
                if x.sharding.device_set == devices_of]
        meshes[mesh_name(roles)] = {
            "state": sum(_device_bytes(x) for x in held),
            "stages": _per_stage([s for s in compiler.stages if s["role"] in roles])}
    return {"meshes": meshes, "seconds": time.perf_counter() - start,
            "note": built.tokenizer_note, "model_flops": _model_flops(built)}


def format_out_of_memory(plan: dict[str, Any], compiled: dict[str, Any]) -> str:
    """The compiler's out-of-memory verdict (`compiled_memory`'s `oom`) beside the plan."""
    oom: OutOfMemory = compiled["oom"]
    capacity = oom.capacity or plan["device_memory"]
    temp = plan["phase_totals"][plan["peak_phase"]]
    row = lambda label, xla, est: (  # noqa: E731
        f"{label:<44}{xla / GIB:>12.2f}{est / GIB:>12.2f}{est / xla:>9.2f}")
    lines = [f"The TPU compiler refuses the round ({compiled['seconds']:.0f} s to compile): it "
             f"does not fit in {capacity / GIB:.2f} GiB per chip. When it stopped, per chip:",
             f"{'':<44}{'XLA GiB':>12}{'plan GiB':>12}{'plan/XLA':>9}",
             row("temporaries (plan: the largest phase)", oom.temp, temp)]
    if oom.argument is not None:
        lines.append(row("arguments (state, frozen, batch, rng)", oom.argument,
                         plan["state_total"]))
    else:
        lines.append("(its temporaries alone were over the memory, the first check it makes; "
                     "with more room it may rematerialise further)")
    return "\n".join(lines + [f"-> DOES NOT FIT in {capacity / GIB:.2f} GiB (the compiler's "
                              "verdict)"])


def format_comparison(plan: dict[str, Any], compiled: dict[str, Any]) -> str:
    """XLA's numbers (`compiled_memory`) beside the plan's, for the parts they measure alike;
    on a TPU slice, a round that compiled is one the compiler fits in the device memory."""
    if "oom" in compiled:
        return format_out_of_memory(plan, compiled)
    unit, scale = table_unit(max(compiled["argument"] + compiled["temp"], plan["total"]))
    arguments = plan["state_total"]
    temp = plan["phase_totals"][plan["peak_phase"]]
    row = lambda label, xla, est: (  # noqa: E731
        f"{label:<44}{xla / scale:>12.2f}" + ("" if est is None else
                                              f"{est / scale:>12.2f}{est / max(xla, 1):>9.2f}"))
    return "\n".join([
        f"XLA memory analysis of the compiled round ({compiled['seconds']:.0f} s to compile), "
        "per device",
        f"{'':<44}{'XLA ' + unit:>12}{'plan ' + unit:>12}{'plan/XLA':>9}",
        row("arguments (state, frozen, batch, rng)", compiled["argument"], arguments),
        row("temporaries (plan: the largest phase)", compiled["temp"], temp),
        row("outputs", compiled["output"], None),
        row("  of which written into donated arguments", compiled["alias"], None),
        row("generated code", compiled["generated_code"], None),
        row("arguments + temporaries + new outputs", compiled["bound"], None),
        row("peak (the compiler's)", compiled["peak"], plan["total"]),
        row("  above the arguments (plan: the largest phase)",
            compiled["peak"] - compiled["argument"], temp),
        f"that peak against {plan['usable'] / GIB:.2f} GiB usable -> "
        f"{verdict(compiled['peak'], plan['usable'])}",
    ])


def stage_peak(state: int, analysis: Mapping[str, int]) -> int:
    """What a chip holds while a stage program runs: the program's own peak (its arguments,
    among them the inputs moved to it and what earlier stages left it, with its temporaries
    and the outputs not written in place, as the compiler lays them out: on TPU temporaries
    reuse donated arguments' memory) and the rest of its mesh's state, which the program
    does not read."""
    return state - analysis["from_state"] + analysis["peak"]


def stage_temporaries(section: dict[str, Any], stage: str) -> int:
    """The plan's temporaries of one stage program on a sub-mesh (`section` of
    `memory.plan_memory`): its largest phase less the inputs moved to it, which XLA counts
    among the program's arguments."""
    moved = sum(b for _, b in section["moved"][stage])
    return max(phase.total for name, phase in section["phases"].items()
               if name.startswith(stage)) - moved


def format_stage_comparison(plan: dict[str, Any], compiled: dict[str, Any]) -> str:
    """Per mesh, the built task's state and each compiled stage's temporaries and moved
    inputs (`compiled_stage_memory`) beside the plan's: roles on sub-meshes, or every role on
    one mesh with a program per stage (`config.stage_programs`)."""
    sections = {s["name"]: s for s in plan.get("meshes", [dict(plan, name=mesh_name(ROLES))])}
    unit, scale = table_unit(plan["total"])
    row = lambda label, real, est: (  # noqa: E731
        f"{label:<48}{real / scale:>12.2f}{est / scale:>12.2f}{est / max(real, 1):>11.2f}")
    lines = [f"The built task's arrays and XLA's memory analysis of each stage program "
             f"({compiled['seconds']:.0f} s to compile), per device",
             f"{'':<48}{'real ' + unit:>12}{'plan ' + unit:>12}{'plan/real':>11}"]
    for name, real in compiled["meshes"].items():
        section = sections[name]
        lines += [f"{name} mesh " + " ".join(f"{a}={s}" for a, s in section["mesh"].items()),
                  row("  state (the task's arrays on its devices)", real["state"],
                      section["state_total"])]
        for stage, analysis in real["stages"].items():
            lines.append(row(f"  {stage}: temporaries", analysis["temp"],
                             stage_temporaries(section, stage)))
            moved = sum(b for _, b in section["moved"][stage])
            if moved or analysis["moved"]:
                lines.append(row(f"  {stage}: inputs from other meshes", analysis["moved"],
                                 moved))
        peak = max(stage_peak(real["state"], a) for a in real["stages"].values())
        lines += [row("  peak: the largest stage program's own and the state it does not read",
                      peak, section["total"]),
                  f"  XLA's peak against {plan['usable'] / GIB:.2f} GiB usable -> "
                  f"{verdict(peak, plan['usable'])}"]
    return "\n".join(lines)


def _notes(compiled: Mapping[str, Any], loops: float) -> list[str]:
    notes = [f"note: {compiled['note']}"] if compiled["note"] else []
    if loops:
        notes.append(f"note: {loops:.0f} loops without a trip count XLA or their condition "
                     "tells are counted once: their FLOPs and bytes are low")
    return notes


def comparison(plan: dict[str, Any], config: ml_collections.ConfigDict,
               devices: Sequence[jax.Device] | None = None, chip: Chip | None = None) -> str:
    """`--compile`'s table for `plan` (`memory.plan_memory` of `config`): the whole round when
    the roles share a mesh, each stage program when they are on sub-meshes; compiled for
    `devices` (default this machine's). With `chip` (a TPU slice or GPUs), the roofline on
    `chip` follows; on a TPU slice the compiler holds the programs to the device memory (XLA's
    GPU compiler has no such limit: its peak is set against the memory as `--compile`'s is)."""
    # The compiler is held to the device memory, not the usable part: its buffer assignment is
    # exact, and it tries harder (rematerialises more) the less room it has; the headroom is
    # then applied to the peak it reports.
    limit = None if chip is None or chip.platform != "tpu" else plan["device_memory"]
    if "meshes" in plan or plan["stage_programs"]:
        compiled = compiled_stage_memory(config, devices, limit)
        stages = {k: a for m in compiled["meshes"].values() for k, a in m["stages"].items()}
        lines = [format_stage_comparison(plan, compiled)]
        costs = {k: a["cost"] for k, a in stages.items()}
        where = {k: name for name, m in compiled["meshes"].items() for k in m["stages"]}
        loops = sum(a["unknown_loops"] for a in stages.values())
        lines += [f"  {k}: {a['seconds']:.0f} s to compile" for k, a in stages.items()]
    else:
        compiled = compiled_memory(config, devices, limit)
        lines = [format_comparison(plan, compiled)]
        costs = {k: c for k, c in (compiled["cost"] or {}).items() if k != "unknown_loops"}
        where = None
        loops = compiled["cost"]["unknown_loops"].flops if compiled["cost"] else 0
    lines += _notes(compiled, loops)
    if chip is not None and (chip.peak_flops is None or chip.hbm_bandwidth is None):
        lines.append(f"(no roofline: jaxrubric/mfu.py has no peaks for {chip.kind!r})")
    elif chip is not None and not costs:
        lines.append("(no roofline: the compiler left no optimised program behind)")
    elif chip is not None:
        chips = plan["devices"]
        lines += ["", format_roofline({k: bound(c, chip) for k, c in costs.items()},
                                      compiled["model_flops"], chips, chip, where)]
    return "\n".join(lines)
