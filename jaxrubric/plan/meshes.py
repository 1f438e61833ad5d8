"""Where a plan's roles run: the mesh shapes a config places them on (colocated or on
sub-meshes, as `train.CoevolveTask` does) and the names of the stage programs they run."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import ml_collections
from jax.sharding import AbstractMesh, AxisType

from jaxrubric import placement
from jaxrubric import sharding as shd
from jaxrubric.plan.errors import PlanError
from jaxrubric.roles import ROLES, Role


def parse_mesh(text: str) -> dict[str, int]:
    """`data=D,fsdp=F,tensor=T` (any subset; missing axes are 1, one size may be -1)."""
    try:
        return placement.parse_mesh_spec(text)
    except ValueError as err:
        raise PlanError(f"--{err}") from None


def resolve_mesh(shape: Mapping[str, int], devices: int | None) -> dict[str, int]:
    """A mesh shape with its -1 filled in from `devices`, checked against `devices`."""
    sizes = {axis: int(shape.get(axis, 1)) for axis in shd.MESH_AXES}
    if any(s == 0 or s < -1 for s in sizes.values()) or list(sizes.values()).count(-1) > 1:
        raise PlanError(f"mesh {sizes}: sizes must be positive, with at most one -1")
    known = math.prod(s for s in sizes.values() if s != -1)
    if -1 in sizes.values():
        if devices is None:
            raise PlanError(f"mesh {sizes} has a -1 axis: give --devices N or every axis size")
        if devices % known:
            raise PlanError(f"mesh {sizes} does not divide {devices} devices")
        sizes = {a: devices // known if s == -1 else s for a, s in sizes.items()}
    elif devices is not None and known != devices:
        raise PlanError(f"mesh {sizes} covers {known} devices, not {devices}")
    return sizes


def abstract_mesh(shape: Mapping[str, int]) -> AbstractMesh:
    """A device-free mesh: all that `sharding.logical_to_spec` needs is its shape."""
    return AbstractMesh(tuple(shape[a] for a in shd.MESH_AXES), shd.MESH_AXES,
                        axis_types=(AxisType.Auto,) * len(shd.MESH_AXES))


def role_meshes(config: ml_collections.ConfigDict, devices: int | None
                ) -> dict[Role, tuple[dict[str, int], Role]]:
    """`{role: (mesh shape, owner)}` as `train.CoevolveTask` places the roles: all on
    `config.mesh` (owner the policy), or on `config.submeshes` (`placement.resolve_submeshes`),
    -1 axes filled from `devices`."""
    specs = dict(config.submeshes)
    if not any(specs.values()):
        shape = resolve_mesh(dict(config.mesh), devices)
        return {role: (shape, Role.POLICY) for role in ROLES}
    try:
        resolved = placement.resolve_submeshes(specs, devices)
    except ValueError as err:
        raise PlanError(str(err)) from err
    for role, (shape, owner) in resolved.items():
        if role == owner and -1 in shape.values():
            raise PlanError(f"config.submeshes.{role}={specs[role]!r} has a -1 axis (the devices "
                            "the other meshes leave): give --devices N")
    return {role: (dict(shape), owner) for role, (shape, owner) in resolved.items()}


def mesh_name(roles: Sequence[str]) -> str:
    """A mesh named by the roles on it: `policy + generator`."""
    return " + ".join(roles)


def stage_key(role: str, keep: int) -> str:
    """The plan's name of a stage program, from `placement.Placement`'s `role` and `keep` (the
    keys of `RoundShapes.reads`): a role's update keeps its state; the verifier's programs
    (judge, reward) are one plan stage; the other stages are the roles' rollouts."""
    if keep:
        return f"{role} update"
    return "verifier" if role == Role.VERIFIER else f"{role} rollout"


def stage_role(stage: str) -> Role:
    """The role whose mesh runs a stage: its key's first word (see `stage_key`)."""
    return Role(stage.split()[0])
