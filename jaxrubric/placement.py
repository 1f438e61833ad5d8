"""Where a round's stages run: every role on one mesh, or each role on a sub-mesh of its own.

A round is written once, as stages called by name (`respond(setup, ...)`, `judge(...)`): each
stage is a function marked with the role whose weights it runs (`@stage(Role.POLICY)`), and the
placement in effect (`running(run)`, set by whoever builds the round's programs) decides where
the call runs:

- `colocated` (the default): every stage is a plain call, so the round traced under `jax.jit`
  is one compiled program (`methods.programs.make_round_step`).
- `SubMeshes`: each role's weights live on its own devices, so a chip never holds the verifier
  next to the policy's optimiser state. Each stage is a program of its own on its role's mesh;
  its inputs move there first (`jax.device_put`, once per array and mesh). Dispatch is
  asynchronous, so stages that do not wait on each other (the two roles' updates) run at the
  same time on their devices.

The devices of a `SubMeshes` placement must belong to one process: moving arrays between
meshes spread over hosts is left to a later change.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import math
import re
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol, TypeVar

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxrubric import sharding as shd
from jaxrubric.roles import ROLES, Role

Stage = TypeVar("Stage", bound=Callable[..., Any])


class Placement(Protocol):
    def __call__(self, role: Role, stage: Callable[..., Any], setup: Any, *args: Any,
                 keep: int = 0) -> Any:
        """`stage(setup, *args)` run where `role`'s weights are; `setup` is static (what the
        stage's program is built for), `args` are arrays.

        `keep=n`: the stage returns `(*updated, metrics)` where `updated[i]` replaces `args[i]`
        for i < n (a role's parameters and optimiser state): those arguments are donated and the
        results keep their shardings; the metrics come back replicated.
        """


def colocated(role: Role, stage: Callable[..., Any], setup: Any, *args: Any,
              keep: int = 0) -> Any:
    """Every stage inline: the caller's `jax.jit` compiles the whole round as one program."""
    del role, keep
    return stage(setup, *args)


_PLACEMENT: contextvars.ContextVar[Placement] = contextvars.ContextVar("placement",
                                                                      default=colocated)


@contextlib.contextmanager
def running(run: Placement) -> Iterator[None]:
    """The stages called inside run where `run` places them."""
    token = _PLACEMENT.set(run)
    try:
        yield
    finally:
        _PLACEMENT.reset(token)


def within(run: Placement, fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` with the stages it calls placed by `run`."""

    @functools.wraps(fn)
    def placed(*args: Any, **kwargs: Any) -> Any:
        with running(run):
            return fn(*args, **kwargs)

    return placed


def stage(role: Role | None = None, *, keep: int = 0) -> Callable[[Stage], Stage]:
    """Marks a round's stage: a function `(setup, *arrays)` that runs on `role`'s devices, placed
    by the placement in effect (`running`). Rounds call it by name, so a reader reaches the stage
    itself. `keep` as in `Placement`. With `role=None` the stage is `(role, setup, *arrays)`,
    run for the role it is given (a role's update). A stage called inside another stage is part
    of that stage's program."""

    def mark(body: Stage) -> Stage:
        for_role: dict[Role, Callable[..., Any]] = {}  # stable callables: a program per role

        @functools.wraps(body)
        def placed(*args: Any) -> Any:
            if role is None:
                who = args[0]
                fn = for_role.setdefault(who, functools.partial(body, who))
                args = args[1:]
            else:
                who, fn = role, body
            run = _PLACEMENT.get()
            with running(colocated):
                return run(who, fn, *args, keep=keep)

        return placed  # type: ignore[return-value]

    return mark


class SubMeshes:
    """Each role's stages as programs of their own on that role's mesh (see module doc)."""

    def __init__(self, meshes: Mapping[str, Mesh]):
        missing = set(ROLES) - set(meshes)
        if missing:
            raise ValueError(f"sub-meshes: no mesh for {sorted(missing)}")
        self.meshes = dict(meshes)
        self._programs: dict[tuple, Callable[..., Any]] = {}
        # Arrays already moved to a mesh, while their source lives: a stage that reads what an
        # earlier stage on that mesh read (the verifier's reward after its judge) moves nothing.
        self._moved: dict[tuple[int, int], tuple[weakref.ref, jax.Array]] = {}

    def __call__(self, role: Role, stage: Callable[..., Any], setup: Any, *args: Any,
                 keep: int = 0) -> Any:
        mesh = self.meshes[role]
        args = jax.tree.map(lambda x: self._on(x, mesh), args)
        key = (role, stage, keep, setup)
        if key not in self._programs:
            self._programs[key] = stage_program(setup, stage, mesh, args, keep)
        return self._programs[key](*args)

    def _on(self, x: Any, mesh: Mesh) -> Any:
        """`x` where a stage on `mesh` takes it (`moved_to`), moved at most once."""
        if not isinstance(x, jax.Array) or destination(x, mesh) is None:
            return x
        key = (id(x), id(mesh))
        if key not in self._moved or self._moved[key][0]() is not x:
            self._moved[key] = (weakref.ref(x, lambda _, k=key: self._moved.pop(k, None)),
                                moved_to(x, mesh))
        return self._moved[key][1]

    def compiled_programs(self) -> int:
        """How many programs the stages have compiled (one per stage and input shape)."""
        return sum(p._cache_size() for p in self._programs.values())


def stage_program(setup: Any, stage: Callable[..., Any], mesh: Mesh, args: Sequence[Any],
                  keep: int) -> Callable[..., Any]:
    """The jitted program of `stage` on `mesh` for `args` already placed there (concrete or
    abstract): the first `keep` arguments donated and their replacements pinned to their
    shardings, the metrics replicated (see `Placement`)."""
    out_shardings = None
    if keep:
        out_shardings = (*(jax.tree.map(lambda x: x.sharding, a) for a in args[:keep]),
                         NamedSharding(mesh, PartitionSpec()))
    return jax.jit(shd.traced_in(lambda *a: stage(setup, *a), mesh),
                   donate_argnums=tuple(range(keep)), out_shardings=out_shardings)


def destination(x: jax.Array | jax.ShapeDtypeStruct, mesh: Mesh) -> NamedSharding | None:
    """Where a stage on `mesh` takes array `x` (or its abstract value): None when it is already
    there; else split over the batch axes when its leading dimension allows, else replicated."""
    if x.sharding.device_set == set(mesh.devices.flat):
        return None
    if x.ndim and x.shape[0] % shd.batch_ways(mesh) == 0:
        return shd.batch_sharding(mesh, x.ndim)
    return NamedSharding(mesh, PartitionSpec())


def moved_to(x: Any, mesh: Mesh) -> Any:
    """An array where a stage on `mesh` takes it (`destination`); anything else as it is."""
    target = destination(x, mesh) if isinstance(x, jax.Array) else None
    return x if target is None else jax.device_put(x, target)


def to_mesh(tree: Any, mesh: Mesh) -> Any:
    """`tree`'s arrays moved to where a stage on `mesh` takes them (`destination`)."""
    return jax.tree.map(lambda x: moved_to(x, mesh), tree)


def parse_mesh_spec(text: str) -> dict[str, int]:
    """`"data=2,fsdp=-1"` -> a size for every mesh axis (those left out are 1)."""
    sizes: dict[str, int] = {}
    for part in text.split(","):
        name, sep, size = part.strip().partition("=")
        if not sep or name not in shd.MESH_AXES or not re.fullmatch(r"-1|[1-9]\d*", size.strip()):
            raise ValueError(f"mesh {text!r}: expected comma-separated AXIS=SIZE with AXIS in "
                             f"{shd.MESH_AXES} and SIZE a positive integer (or -1), e.g. "
                             "'data=1,fsdp=4,tensor=1'")
        if name in sizes:
            raise ValueError(f"mesh {text!r}: axis {name!r} given twice")
        sizes[name] = int(size)
    return {axis: sizes.get(axis, 1) for axis in shd.MESH_AXES}


def resolve_submeshes(specs: Mapping[str, str], device_count: int | None
                      ) -> dict[str, tuple[dict[str, int], str]]:
    """Per-role mesh shapes from `specs` (`config.submeshes`), -1 axes filled in.

    Each role's entry is a mesh (`"fsdp=4"`) or the name of an earlier role whose mesh it
    shares. Distinct meshes take disjoint devices, in role order, and together all of them; at
    most one mesh may have a -1 axis ("the devices the others leave"). Returns
    `{role: (shape, owner)}`, `owner` being the first role on that mesh. `device_count=None`
    checks the specs alone (a -1 stays -1).
    """
    owners: dict[str, str] = {}
    shapes: dict[str, dict[str, int]] = {}
    for role in ROLES:
        spec = specs.get(role, "").strip()
        if not spec:
            raise ValueError(f"config.submeshes.{role} is empty: give every role a mesh (or an "
                             "earlier role's name), or leave all three empty to colocate")
        if spec in ROLES:
            if spec not in owners:
                raise ValueError(f"config.submeshes.{role}={spec!r}: only an earlier role's mesh "
                                 f"can be shared ({list(owners) or 'none yet'})")
            owners[role] = owners[spec]
            continue
        try:
            shape = parse_mesh_spec(spec)
        except ValueError as err:
            raise ValueError(f"config.submeshes.{role}: {err}") from None
        if list(shape.values()).count(-1) > 1:
            raise ValueError(f"config.submeshes.{role}={spec!r}: at most one axis may be -1")
        owners[role] = role
        shapes[role] = shape
    open_ended = [r for r, s in shapes.items() if -1 in s.values()]
    if len(open_ended) > 1:
        raise ValueError(f"config.submeshes: only one mesh may have a -1 axis, {open_ended} do")
    if device_count is None:
        return {role: (shapes[owners[role]], owners[role]) for role in ROLES}
    fixed = sum(math.prod(s.values()) for r, s in shapes.items() if r not in open_ended)
    if open_ended:
        shape = shapes[open_ended[0]]
        known = -math.prod(shape.values())
        left = device_count - fixed
        if left <= 0 or left % known:
            raise ValueError(f"config.submeshes: {left} devices are left for "
                             f"{open_ended[0]}'s mesh {shape}, not a positive multiple of {known}")
        shape[next(a for a, s in shape.items() if s == -1)] = left // known
    used = sum(math.prod(s.values()) for s in shapes.values())
    if used != device_count:
        raise ValueError(f"config.submeshes: the meshes {shapes} cover {used} devices, there are "
                         f"{device_count}")
    return {role: (shapes[owners[role]], owners[role]) for role in ROLES}


def make_submeshes(specs: Mapping[str, str], devices: Sequence[jax.Device] | None = None
                   ) -> dict[str, Mesh]:
    """The role meshes of `specs` (see `resolve_submeshes`) over `devices` (default: all), each
    distinct mesh on the next devices in order."""
    devices = list(jax.devices() if devices is None else devices)
    if len({d.process_index for d in devices}) > 1:
        raise ValueError("config.submeshes: sub-meshes over several processes are not supported "
                         "yet; colocate the roles (config.mesh) on a multi-host slice")
    resolved = resolve_submeshes(specs, len(devices))
    meshes: dict[str, Mesh] = {}
    start = 0
    for role, (shape, owner) in resolved.items():
        if owner != role:
            meshes[role] = meshes[owner]
            continue
        size = math.prod(shape.values())
        meshes[role] = shd.make_mesh(shape, devices[start:start + size])
        start += size
    return meshes
