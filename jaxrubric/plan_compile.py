"""`jaxrubric plan --compile`: the plan checked against the compiler.

Builds the trainer's task for this machine's devices (real models, tokenizer, data), lowers
and compiles the round exactly as training does, without running it, and sets XLA's memory
analysis beside the plan's estimate: the whole round when the roles share a mesh, each stage
program (`placement.SubMeshes`) when they are on sub-meshes.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from typing import Any

import jax
import ml_collections
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxrubric import placement
from jaxrubric.plan import PlanError, _unit, mesh_name, role_meshes, stage_key


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


def compiled_memory(config: ml_collections.ConfigDict) -> dict[str, Any]:
    """XLA's memory analysis of the real round of `config`, compiled for `config.mesh` over
    this machine's devices (on CPU, fake them with
    `XLA_FLAGS=--xla_force_host_platform_device_count=N` before jax starts).

    Builds the trainer's task (`train.CoevolveTask`: real models, tokenizer, data) and jits
    the round as `coevolve.make_round_step` does, with the state donated; it lowers and
    compiles without running. Per-device bytes: `argument` (state, frozen weights, batch,
    rng), `output`, `alias` (outputs written into donated arguments), `temp` (XLA's peak of
    everything else) and `generated_code`.
    """
    from jaxrubric.train import _METHODS, CoevolveTask

    local_devices_for(config)
    start = time.perf_counter()
    task = CoevolveTask(config)
    state = task.abstract_state()
    round_fn = _METHODS[config.method][1]
    shardings = jax.tree.map(lambda x: x.sharding, state)
    replicated = NamedSharding(task.mesh, PartitionSpec())
    jitted = jax.jit(lambda s, f, b, r: round_fn(task.setup, s, f, b, r), donate_argnums=(0,),
                     out_shardings=(shardings, replicated))
    analysis = jitted.lower(state, task.frozen, task.batch(0), jax.random.key(0)).compile(
        ).memory_analysis()
    return {
        "argument": analysis.argument_size_in_bytes,
        "output": analysis.output_size_in_bytes,
        "alias": analysis.alias_size_in_bytes,
        "temp": analysis.temp_size_in_bytes,
        "generated_code": analysis.generated_code_size_in_bytes,
        "seconds": time.perf_counter() - start,
    }


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
    each program's temporaries (XLA's memory analysis) and the bytes per device it receives
    from other meshes."""

    def __init__(self, setup: Any, meshes: Mapping[str, Mesh]):
        self.setup = setup
        self.meshes = dict(meshes)
        self.stages: list[dict[str, Any]] = []

    def __call__(self, role: str, stage: Callable[..., Any], *args: Any, keep: int = 0) -> Any:
        mesh = self.meshes[role]
        placed = jax.tree.map(lambda x: _on_mesh(x, mesh), args)
        moved = sum(_device_bytes(new) for old, new in zip(jax.tree.leaves(args),
                                                            jax.tree.leaves(placed))
                    if new is not old)
        compiled = placement.stage_program(self.setup, stage, mesh, placed, keep).lower(
            *placed).compile()
        self.stages.append({"role": role, "stage": stage_key(role, keep), "moved": moved,
                            "temp": compiled.memory_analysis().temp_size_in_bytes})
        return _abstract(compiled.out_info)


def compiled_stage_memory(config: ml_collections.ConfigDict) -> dict[str, Any]:
    """With roles on sub-meshes: per mesh, the bytes per device of the built task's arrays on
    it (its state; the batch and the round's rng key live on the policy's mesh) and XLA's
    memory analysis of each stage program on it, compiled over this machine's devices as
    `placement.SubMeshes` builds them, without running (see `StageCompiler`).

    Returns `meshes`: mesh name (`mesh_name`) -> `state` and `stages` (stage -> `temp` and
    `moved`), and the `seconds` it took.
    """
    from jaxrubric.train import _METHODS, CoevolveTask

    local_devices_for(config)
    start = time.perf_counter()
    task = CoevolveTask(config)
    state = task.init_state(jax.random.key(0))
    # The round counter stays concrete: the round adds one to it between the stages.
    state = {**_abstract(state), "round": state["round"]}
    frozen, batch = _abstract(task.frozen), _abstract(task.batch(0))
    rng = jax.ShapeDtypeStruct((), jax.random.key(0).dtype,
                               sharding=NamedSharding(task.meshes["policy"], PartitionSpec()))
    compiler = StageCompiler(task.setup, task.meshes)
    _METHODS[config.method][1](task.setup, state, frozen, batch, rng, compiler)
    groups: dict[int, list[str]] = {}
    for role, mesh in task.meshes.items():
        groups.setdefault(id(mesh), []).append(role)
    meshes = {}
    for roles in groups.values():
        devices = set(task.meshes[roles[0]].devices.flat)
        held = [x for x in jax.tree.leaves((state, frozen, batch, rng))
                if x.sharding.device_set == devices]
        meshes[mesh_name(roles)] = {
            "state": sum(_device_bytes(x) for x in held),
            "stages": {s["stage"]: s for s in compiler.stages if s["role"] in roles}}
    return {"meshes": meshes, "seconds": time.perf_counter() - start}


def format_comparison(plan: dict[str, Any], compiled: dict[str, int]) -> str:
    """XLA's numbers beside the plan's, for the parts they measure alike."""
    unit, scale = _unit(max(compiled["argument"] + compiled["temp"], plan["total"]))
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
    ])


def stage_temporaries(section: dict[str, Any], stage: str) -> int:
    """The plan's temporaries of one stage program on a sub-mesh (`section` of
    `plan_memory`): its largest phase less the inputs moved to it, which XLA counts among the
    program's arguments."""
    moved = sum(b for _, b in section["moved"][stage])
    return max(phase.total for name, phase in section["phases"].items()
               if name.startswith(stage)) - moved


def format_stage_comparison(plan: dict[str, Any], compiled: dict[str, Any]) -> str:
    """Per sub-mesh, the built task's state and each compiled stage's temporaries and moved
    inputs beside the plan's."""
    sections = {s["name"]: s for s in plan["meshes"]}
    unit, scale = _unit(plan["total"])
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
    return "\n".join(lines)
