"""Meshes and the one table that maps logical axes, of parameters and of activations, to mesh
axes.

Models name their axes (`vocab`, `embed`, `heads`, ...; activations `activation_batch`,
`activation_mlp`, ...); this module alone decides where those go on the `data` x `fsdp` x
`tensor` mesh. A logical axis whose mesh axes do not divide the dimension (e.g. one kv head on
a 4-way tensor axis) stays replicated rather than failing.

Activations are placed by `constrain` under the layout a program is traced in
(`activation_layout`): without those constraints XLA's partitioner follows the FSDP-sharded
weights, splits activations along their hidden dimension and keeps every row of the batch on
every chip.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "tensor")

Rules = tuple[tuple[str, str | tuple[str, ...] | None], ...]

# Activations: rows split over every batch axis, the feature dimensions a tensor-parallel
# layer splits (heads, the MLP's intermediate, the vocabulary) over `tensor`, the residual
# stream's own width whole.
ACTIVATION_RULES: Rules = (
    ("activation_batch", ("data", "fsdp")),
    ("activation_length", None),
    ("activation_embed", None),
    ("activation_heads", "tensor"),
    ("activation_kv_heads", "tensor"),
    ("activation_head_dim", None),
    ("activation_mlp", "tensor"),
    ("activation_vocab", "tensor"),
)

# Training: parameters sharded FSDP-style over `fsdp`, tensor-parallel over `tensor`.
TRAINING_RULES: Rules = (
    ("batch", ("data", "fsdp")),
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("mlp", "tensor"),
    ("head_dim", None),
    ("layers", None),
    *ACTIVATION_RULES,
)

# Sampling: weights whole on every data/fsdp replica (no per-token all-gathers while decoding),
# still tensor-parallel.
SAMPLING_RULES: Rules = tuple(
    (name, None if name == "embed" else axes) for name, axes in TRAINING_RULES
)


def make_mesh(shape: Mapping[str, int] | Sequence[int] | None = None,
              devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A mesh over (`data`, `fsdp`, `tensor`); one entry may be -1 for "the remaining devices".

    Axes are `AxisType.Auto`: jax's default `Explicit` axes reject sharded contractions.
    """
    devices = list(jax.devices() if devices is None else devices)
    if shape is None:
        sizes = [1, len(devices), 1]
    elif isinstance(shape, Mapping):
        unknown = set(shape) - set(MESH_AXES)
        if unknown:
            raise ValueError(f"unknown mesh axes {sorted(unknown)}; axes are {MESH_AXES}")
        sizes = [int(shape.get(a, 1)) for a in MESH_AXES]
    else:
        sizes = [int(s) for s in shape]
        if len(sizes) != len(MESH_AXES):
            raise ValueError(f"mesh shape {tuple(sizes)} must give one size per axis {MESH_AXES}")
    if sizes.count(-1) > 1:
        raise ValueError(f"at most one mesh axis may be -1, got {sizes}")
    if -1 in sizes:
        known = math.prod(s for s in sizes if s != -1)
        if len(devices) % known:
            raise ValueError(f"mesh {sizes} does not divide {len(devices)} devices")
        sizes[sizes.index(-1)] = len(devices) // known
    if math.prod(sizes) != len(devices):
        raise ValueError(
            f"mesh {dict(zip(MESH_AXES, sizes))} needs {math.prod(sizes)} devices, "
            f"{len(devices)} available"
        )
    return jax.make_mesh(tuple(sizes), MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES),
                         devices=devices)


def single_device_mesh(device: jax.Device | None = None) -> Mesh:
    return make_mesh((1, 1, 1), devices=[device or jax.devices()[0]])


def logical_to_spec(logical_axes: Sequence[str | None], shape: Sequence[int], mesh: Mesh,
                    rules: Rules = TRAINING_RULES, *, undivided: Any = None) -> PartitionSpec:
    """The PartitionSpec for one array: each logical axis gets the mesh axes the rules give it,
    unless they do not divide the dimension or are already used by an earlier axis.

    An axis the rules split but whose mesh axes do not divide it gets `undivided`: None
    (replicated) for parameters; `PartitionSpec.UNCONSTRAINED` for activations (`constrain`),
    so the partitioner keeps its own choice there instead of being forced to replicate.
    """
    table = dict(rules)
    used: set[str] = set()
    spec = []
    for name, dim in zip(logical_axes, shape, strict=True):
        target = table.get(name) if name is not None else None
        axes = (target,) if isinstance(target, str) else tuple(target or ())
        axes = tuple(a for a in axes if a not in used and mesh.shape.get(a, 1) > 1)
        size = math.prod(mesh.shape[a] for a in axes)
        if not axes:
            spec.append(None)
            continue
        if dim % size:
            spec.append(undivided)
            continue
        used.update(axes)
        spec.append(axes[0] if len(axes) == 1 else axes)
    return PartitionSpec(*spec)


@dataclasses.dataclass(frozen=True)
class ActivationLayout:
    """Where a traced program's activations go: its mesh and the rules table it reads."""

    mesh: Mesh
    rules: Rules = TRAINING_RULES


_LAYOUT: contextvars.ContextVar[ActivationLayout | None] = contextvars.ContextVar(
    "activation_layout", default=None)


@contextlib.contextmanager
def activation_layout(mesh: Mesh, rules: Rules = TRAINING_RULES) -> Iterator[ActivationLayout]:
    """Activations traced inside are constrained to `mesh` by `rules` (`constrain`).

    Set where a program is traced (the round, a stage, an SFT step, a sampler): the model code
    names its activations' axes and never sees a mesh.
    """
    token = _LAYOUT.set(ActivationLayout(mesh, rules))
    try:
        yield _LAYOUT.get()
    finally:
        _LAYOUT.reset(token)


def traced_in(fn: Callable[..., Any], mesh: Mesh | None, rules: Rules = TRAINING_RULES
              ) -> Callable[..., Any]:
    """`fn` traced under `activation_layout(mesh, rules)`: what a program's builder jits. With
    no mesh (one device, nowhere to place anything), `fn` itself."""
    if mesh is None:
        return fn

    @functools.wraps(fn)
    def traced(*args: Any, **kwargs: Any) -> Any:
        with activation_layout(mesh, rules):
            return fn(*args, **kwargs)

    return traced


def current_layout() -> ActivationLayout | None:
    """The layout set by the innermost `activation_layout`, or None outside any."""
    return _LAYOUT.get()


def constrain(x: jax.Array, logical_axes: Sequence[str | None]) -> jax.Array:
    """`x` constrained to the current layout's placement of `logical_axes` (one per dimension).

    Outside an `activation_layout` (eager calls, a test's plain `jax.jit`) and on a
    one-device mesh there is nothing to place, and `x` is returned as it is. The device kind
    never matters: an ahead-of-time TPU compile traced on a CPU host keeps every constraint.
    """
    layout = _LAYOUT.get()
    if layout is None or layout.mesh.size == 1:
        return x
    spec = logical_to_spec(logical_axes, x.shape, layout.mesh, layout.rules,
                           undivided=PartitionSpec.UNCONSTRAINED)
    return jax.lax.with_sharding_constraint(x, NamedSharding(layout.mesh, spec))


def vocab_multiple(mesh: Mesh | None, rules: Rules = TRAINING_RULES) -> int:
    """How many ways the vocabulary axis is split: the vocabulary is padded to a multiple."""
    if mesh is None:
        return 1
    target = dict(rules).get("vocab")
    axes = (target,) if isinstance(target, str) else tuple(target or ())
    return math.prod(mesh.shape.get(a, 1) for a in axes)


def variable_sharding(variable: nnx.Variable, mesh: Mesh, rules: Rules = TRAINING_RULES
                      ) -> NamedSharding:
    axes = variable.get_metadata().get("logical_axes")
    shape = variable.shape
    if axes is None:
        return NamedSharding(mesh, PartitionSpec())
    return NamedSharding(mesh, logical_to_spec(axes, shape, mesh, rules))


def state_shardings(state: nnx.State, mesh: Mesh, rules: Rules = TRAINING_RULES) -> nnx.State:
    """The NamedSharding of every variable in an (abstract or concrete) state."""
    return jax.tree.map(
        lambda v: v.replace(variable_sharding(v, mesh, rules)),
        state, is_leaf=lambda x: isinstance(x, nnx.Variable),
    )


def shard_model(model: nnx.Module, mesh: Mesh, rules: Rules = TRAINING_RULES) -> nnx.Module:
    """Places every parameter of `model` on `mesh` by the rules table (in place, returned)."""
    state = nnx.state(model)
    shardings = state_shardings(state, mesh, rules)
    if all(x.is_fully_addressable for x in jax.tree.leaves(state)):
        # Through host memory: device-to-device resharding compiles a program per parameter.
        state = jax.tree.map(np.asarray, state)
    nnx.update(model, jax.device_put(state, shardings))
    return model


def _batch_axes(mesh: Mesh, rules: Rules) -> tuple[str, ...]:
    target = dict(rules).get("batch")
    axes = (target,) if isinstance(target, str) else tuple(target or ())
    return tuple(a for a in axes if mesh.shape.get(a, 1) > 1)


def batch_ways(mesh: Mesh, rules: Rules = TRAINING_RULES) -> int:
    """How many ways the batch is split: batch sizes must be a multiple of it."""
    return math.prod(mesh.shape[a] for a in _batch_axes(mesh, rules))


def batch_sharding(mesh: Mesh, ndim: int, rules: Rules = TRAINING_RULES) -> NamedSharding:
    """Leading (batch) dimension split over the batch mesh axes, the rest replicated."""
    axes = _batch_axes(mesh, rules)
    lead = None if not axes else (axes[0] if len(axes) == 1 else axes)
    return NamedSharding(mesh, PartitionSpec(lead, *([None] * (ndim - 1))))


def assemble_array(shape: tuple[int, ...], dtype: np.dtype, sharding: NamedSharding,
                   fill_shard) -> jax.Array:
    """Builds a global array shard by shard: `fill_shard(index) -> np.ndarray` gives the host
    data of one device's slice. Equal slices (replicas) are read once."""
    index_map = sharding.addressable_devices_indices_map(shape)
    cache: dict[tuple, np.ndarray] = {}
    pieces = []
    for device, index in index_map.items():
        key = tuple((s.start, s.stop) for s in index)
        if key not in cache:
            cache[key] = np.ascontiguousarray(fill_shard(index), dtype=dtype)
        pieces.append(jax.device_put(cache[key], device))
    return jax.make_array_from_single_device_arrays(shape, sharding, pieces)


def local_rows(mesh: Mesh, batch_size: int, rules: Rules = TRAINING_RULES) -> list[int]:
    """The global batch rows held by this process's devices, in order: what it must load.

    On one host that is every row; on a pod each host reads only its share of the data.
    """
    sharding = batch_sharding(mesh, 1, rules)
    rows: set[int] = set()
    for (index,) in sharding.addressable_devices_indices_map((batch_size,)).values():
        rows.update(range(*index.indices(batch_size)))
    return sorted(rows)


def global_batch(mesh: Mesh, local: Any, rows: Sequence[int], batch_size: int,
                 rules: Rules = TRAINING_RULES) -> Any:
    """Global batch arrays from this process's rows (a pytree of NumPy arrays whose row `i`
    is global row `rows[i]`), split over the batch mesh axes; same tree structure."""
    position = {row: i for i, row in enumerate(rows)}

    def build(value: np.ndarray) -> jax.Array:
        shape = (batch_size, *value.shape[1:])
        return assemble_array(
            shape, value.dtype, batch_sharding(mesh, value.ndim, rules),
            lambda index: value[[position[r] for r in range(*index[0].indices(batch_size))]])

    return jax.tree.map(lambda value: build(np.asarray(value)), local)
