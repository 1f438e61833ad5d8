"""The per-device memory plan of one round: what each mesh holds through the round (state) and
what each of its stages needs on top (phases), from the shapes of the round's stages as its
code makes them (`plan.shapes`: rollouts, verifier passes, updates, and what each reads from
another role's mesh)."""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from typing import Any, NamedTuple

import jax.numpy as jnp
import ml_collections

from jaxrubric import sharding as shd
from jaxrubric.config import role_lora, round_config
from jaxrubric.methods.round_config import RoundConfig
from jaxrubric.methods.shapes import RoundShapes
from jaxrubric.models import attention
from jaxrubric.models.attention import cudnn
from jaxrubric.models.config import ModelConfig
from jaxrubric.plan.errors import PlanError
from jaxrubric.plan.meshes import abstract_mesh, mesh_name, role_meshes, stage_key, stage_role
from jaxrubric.plan.models import (RoleParams, load_tokenizer_offline, optimizer_bytes,
                                   role_model_config, role_params, tokenizer_source)
from jaxrubric.plan.phases import (Local, Phase, rollout_phase, rows_per_device, update_phase,
                                   verifier_phase, with_inputs)
from jaxrubric.plan.shapes import RoundDims, round_shapes
from jaxrubric.plan.templates import CHARS_PER_TOKEN
from jaxrubric.roles import ROLES, TRAINED, Role

Moved = Mapping[str, list[tuple[str, int]]]  # stage key -> (label, bytes per device)


def state_items(config: ml_collections.ConfigDict, params: Mapping[Role, RoleParams],
                dims: RoundDims, ways: int, roles: Collection[Role] = ROLES
                ) -> list[tuple[str, int]]:
    """What a mesh holding `roles` keeps through the round: their part of
    `methods.setup.init_state`'s state and of the frozen weights (`train.CoevolveTask`), and on
    the policy's mesh the batch; colocated, exactly the compiled round's arguments."""
    rc = round_config(config)
    trained = [r for r in ROLES if r in TRAINED and r in roles]
    items = []
    for r in trained:
        p = params[r]
        if p.config.lora is None:
            items.append((f"{r} params ({p.config.param_dtype})", p.bytes))
        else:
            items += [(f"{r} base, frozen ({p.config.dtype})", p.base_bytes),
                      (f"{r} LoRA adapters, rank {p.config.lora.rank} ({p.config.param_dtype})",
                       p.bytes)]
    if trained:
        items.append((f"AdamW state, {'both roles' if len(trained) == 2 else trained[0]}",
                      sum(optimizer_bytes(config, r, params[r]) for r in trained)))
    items += [(f"{r} reference ({params[r].reference_dtype})", params[r].reference_bytes)
              for r in trained if rc.needs_reference(r) and params[r].config.lora is None]
    if Role.VERIFIER in roles:
        items.append((f"verifier params ({params[Role.VERIFIER].config.param_dtype})",
                      params[Role.VERIFIER].bytes))
    if Role.POLICY in roles:  # the batch is placed on the policy's mesh
        # + the rng key (2 x uint32) and the int32 round counter
        items.append(("batch, rng, round counter",
                      rows_per_device(dims.batch, ways) * dims.batch_row_bytes + 8 + 4))
    return items


def moved_inputs(shapes: RoundShapes, dims: RoundDims, owners: Mapping[Role, Role],
                 ways: Mapping[Role, int]) -> dict[str, list[tuple[str, int]]]:
    """Per stage, what its program receives from another role's mesh (`RoundShapes.reads`),
    per device: on sub-meshes a stage's inputs move to its role's mesh first
    (`placement.to_mesh`: split over that mesh's batch ways). `owners[role]` names the role's
    mesh (roles sharing one name the same role), `ways[role]` its batch ways. Empty lists when
    every role is on one mesh."""
    moved = {}
    for (role, keep), reads in shapes.reads.items():
        moved[stage_key(role, keep)] = [
            (f"moved from the {read.source}'s mesh: {read.what}",
             rows_per_device(dims.batch, ways[role]) * read.bytes_per_prompt
             + read.bytes_replicated)
            for read in reads if owners[read.source] != owners[role]]
    return moved


class Decoding(NamedTuple):
    """How a role's rollouts hold it on a mesh (`sharding.decoding_rules`): its per-device
    dimensions, the ways its rows split, and the bytes per device of its weights' copy."""

    local: Local
    ways: int
    weights: int


def decoding(params: RoleParams, shape: Mapping[str, int], backend: str) -> Decoding:
    """A role's decoding layout on a mesh of `shape`: tensor-parallel over `fsdp` x `tensor`
    where its kv heads divide among those chips (rows over `data`), else whole weights on every
    replica (rows over `data` x `fsdp`, heads over `tensor`); the weights cast to the compute
    dtype."""
    mesh = abstract_mesh(dict(shape))
    rules = shd.decoding_rules(mesh, params.config.num_kv_heads)
    split = shape["tensor"] * (shape["fsdp"] if rules is shd.TENSOR_PARALLEL_RULES else 1)
    c = jnp.dtype(params.config.dtype).itemsize
    return Decoding(Local.of(params, split, backend), shd.batch_ways(mesh, rules),
                    params.count * c // split)


class Stage(NamedTuple):
    """A phase of the round and the stage program it belongs to (`meshes.stage_key`)."""

    key: str
    name: str
    phase: Phase


def round_stages(rc: RoundConfig, shapes: RoundShapes, loc: Mapping[Role, Local],
                 params: Mapping[Role, RoleParams], ways: int,
                 decode: Mapping[Role, Decoding]) -> list[Stage]:
    """Every phase of the round in the order it runs, on a mesh that splits the batch `ways`
    ways: the rollouts (in each role's decoding layout), the verifier passes, then the
    updates of the roles this run trains."""
    m = rc.rollout_micro_batches
    stages = [Stage(stage_key(s.role, 0), s.name, rollout_phase(
        decode[s.role].local, s.prompts, s.samples, s.prompt_len, s.new_tokens,
        decode[s.role].ways, m, decode[s.role].weights))
        for s in shapes.sampling]
    stages += [Stage(stage_key(Role.VERIFIER, 0), f"verifier: {v.name}", verifier_phase(
        loc[Role.VERIFIER], v.rows, v.prefix_len, v.branches, v.branch_len,
        v.readout_tokens, ways, m))
        for v in shapes.verification]
    stages += [Stage(stage_key(u.role, 1), f"{u.role} update", update_phase(
        loc[u.role], params[u.role], u.rows, u.prompt_len, u.completion_len, rc.logprob_chunk,
        ways, rc.update_micro_batches, u.group if u.shared(rc) else 1,
        forward_kl=rc.roles[u.role].beta > 0 and rc.roles[u.role].kl == "forward"))
        for u in shapes.updates]
    return stages


def uneven_micro_batches(rc: RoundConfig, shapes: RoundShapes, dims: RoundDims, ways: int,
                         roles: Collection[Role] = ROLES,
                         rollout_ways: int | None = None) -> list[str]:
    """Notes for micro-batches whose rows do not split evenly over the chips holding the
    batch (on a mesh of `roles`; a rollout's rows split `rollout_ways` ways, its decoding
    layout's): the plan counts the rows of the busiest chip, and the others repeat or idle."""
    stages = {"rollout": (dims.batch, "prompts", rc.rollout_micro_batches,
                          ways if rollout_ways is None else rollout_ways),
              **{f"{u.role} update": (u.micro_batch_units(rc),
                                      "prompts" if u.shared(rc) else "rows",
                                      rc.update_micro_batches, ways)
                 for u in shapes.updates if u.role in roles}}
    notes = []
    for stage, (rows, unit, n, split) in stages.items():
        if (rows // n) % split:
            notes.append(f"{stage} micro-batches of {rows // n} {unit} do not split evenly over "
                         f"the {split} chips holding the batch (fewer micro-batches would)")
    return notes


def mesh_plan(config: ml_collections.ConfigDict, roles: Sequence[Role], shape: dict[str, int],
              params: Mapping[Role, RoleParams], loc: Mapping[Role, Local], dims: RoundDims,
              shapes: RoundShapes, moved: Moved, usable: int) -> dict[str, Any]:
    """One mesh's part of the plan: the state of `roles`, their phases (each with the inputs
    `moved` to its program from other meshes, held while it runs), the peak."""
    ways = shd.batch_ways(abstract_mesh(shape))
    state = state_items(config, params, dims, ways, roles)
    decode = {role: decoding(params[role], shape, loc[role].backend) for role in ROLES}
    stages = [s for s in round_stages(round_config(config), shapes, loc, params, ways, decode)
              if stage_role(s.key) in roles]
    phases = {s.name: with_inputs(s.phase, moved.get(s.key, [])) for s in stages}
    state_total = sum(b for _, b in state)
    phase_totals = {name: phase.total for name, phase in phases.items()}
    peak_phase = max(phase_totals, key=phase_totals.get)
    total = state_total + phase_totals[peak_phase]
    rollout_ways = max((decode[s.role].ways for s in shapes.sampling if s.role in roles),
                       default=None)
    return {"mesh": shape, "devices": math.prod(shape.values()), "batch_ways": ways,
            "rollout_ways": rollout_ways,
            "state": state, "state_total": state_total, "phases": phases,
            "phase_totals": phase_totals, "peak_phase": peak_phase, "total": total,
            "fits": total <= usable, "moved": {s.key: moved.get(s.key, []) for s in stages}}


def attention_backend(model: ModelConfig, platform: str | None) -> str:
    """The attention backend a role's model runs on `platform` (None: this machine's), as
    the plan counts it: cuDNN only where it takes the model's dtype and head size."""
    backend = attention.resolve_impl(model.attention_impl, platform)
    if backend == "cudnn" and not (jnp.dtype(model.dtype).name in cudnn.DTYPES
                                   and model.head_dim % 8 == 0
                                   and model.head_dim <= cudnn.MAX_HEAD_DIM):
        return "xla"
    return backend


def plan_memory(config: ml_collections.ConfigDict, device_memory: int, *, headroom: float = 0.1,
                devices: int | None = None, platform: str | None = None) -> dict[str, Any]:
    """The per-device memory plan of one round of `config` on `config.mesh`, or on
    `config.submeshes` (a -1 axis filled from `devices`).

    Colocated: `state` (a list of `(label, bytes)`), `phases` (name -> `Phase`), their totals,
    the peak `total` (state + largest phase), the `usable` memory after `headroom`, `fits`,
    the models, the round's lengths and the notes a reader needs (estimated templates,
    micro-batches that do not split over the chips), and `moved`: per stage program, the
    inputs it receives from other meshes (none here). On sub-meshes a chip holds only its
    roles' state and runs only their stages, so `meshes` has those keys per distinct mesh
    (with its `roles` and `name`); `total` is the largest peak and `fits` holds when every
    mesh fits. Either way a chip's peak is its state and its largest stage's phase: each stage
    a program of its own (`config.stage_programs` on one mesh, `stage_programs` here) is what
    the estimate assumes. `platform` (`tpu`, `gpu`; None: this machine's) picks the attention
    backend the estimate counts for `attention_impl=auto`.
    """
    if not 0 <= headroom < 1:
        raise PlanError(f"--headroom must be in [0, 1), got {headroom}")
    meshes = role_meshes(config, devices)
    groups: dict[Role, list[Role]] = {}  # owner -> the roles on its mesh
    for role, (_, owner) in meshes.items():
        groups.setdefault(owner, []).append(role)
    colocated = len(groups) == 1
    for owner, roles in groups.items():
        shape = meshes[owner][0]
        ways = shd.batch_ways(abstract_mesh(shape))
        if config.data.batch_size % ways:
            where = "mesh" if colocated else f"{mesh_name(roles)} mesh"
            raise PlanError(f"config.data.batch_size={config.data.batch_size} must be a multiple "
                            f"of the {ways} ways the {where} {shape} splits the batch")
    rc = round_config(config)  # a bad round section fails here, before any model is read
    source = tokenizer_source(config)
    tokenizer = load_tokenizer_offline(source)
    notes = [] if tokenizer is not None else [
        f"template lengths estimated: tokenizer {source!r} is not available offline "
        f"(~{CHARS_PER_TOKEN} characters per token)"]
    params = {}
    for role in ROLES:  # each role's model is built for its own mesh (vocabulary padding)
        mesh = abstract_mesh(meshes[role][0])
        lora = role_lora(config, role) if role in TRAINED else None
        params[role] = role_params(*role_model_config(config[role], tokenizer, mesh, source, lora),
                                   mesh)
    dims, shapes = round_shapes(config)
    loc = {role: Local.of(params[role], meshes[role][0]["tensor"],
                          attention_backend(params[role].config, platform)) for role in ROLES}
    usable = int(device_memory * (1 - headroom))
    owners = {role: owner for role, (_, owner) in meshes.items()}
    role_ways = {role: shd.batch_ways(abstract_mesh(shape)) for role, (shape, _) in meshes.items()}
    moved = moved_inputs(shapes, dims, owners, role_ways)
    sections = []
    for owner, roles in groups.items():
        section = mesh_plan(config, roles, meshes[owner][0], params, loc, dims, shapes, moved,
                            usable)
        prefix = "" if colocated else f"{mesh_name(roles)} mesh: "
        notes += [prefix + note for note in uneven_micro_batches(
            rc, shapes, dims, section["batch_ways"], roles, section["rollout_ways"])]
        sections.append((roles, section))
    plan = {
        "method": config.method,
        "models": {r: {"source": params[r].source, "parameters": params[r].count,
                       "trained_parameters": params[r].trained_count if r in TRAINED else 0,
                       "lora_rank": params[r].config.lora.rank if params[r].config.lora else 0,
                       "dtype": params[r].config.dtype,
                       "param_dtype": params[r].config.param_dtype} for r in ROLES},
        "lengths": {"rubric": dims.rubric,
                    **{f"{s.role}_prompt": s.prompt_len for s in shapes.sampling},
                    **{f"verifier {v.name}": v.length for v in shapes.verification}},
        "templates_estimated": tokenizer is None,
        "device_memory": device_memory, "headroom": headroom, "usable": usable,
        "notes": notes, "stage_programs": bool(config.stage_programs),
    }
    if colocated:
        return {**plan, **sections[0][1]}
    return {**plan, "devices": sum(s["devices"] for _, s in sections),
            "total": max(s["total"] for _, s in sections),
            "fits": all(s["fits"] for _, s in sections),
            "meshes": [dict(section, roles=roles, name=mesh_name(roles))
                       for roles, section in sections]}
