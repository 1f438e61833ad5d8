"""The jitted round: one program of every stage (`make_round_step`), or one program per stage on
the roles' sub-meshes (`make_submesh_round_step`, `jaxrubric.placement`). Both take and return
the same typed pytrees; the state is donated and keeps its shardings, so no round recompiles."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
from jax.sharding import NamedSharding, PartitionSpec

from jaxrubric import placement
from jaxrubric import sharding as shd
from jaxrubric.methods.data import Frozen, RoundBatch, RoundResult, RoundState
from jaxrubric.methods.setup import RoundSetup

PyTree = Any


RoundFn = Callable[..., tuple[RoundState, RoundResult]]


def round_program(setup: RoundSetup, round_fn: RoundFn, state_shardings: PyTree
                  ) -> Callable[[RoundState, Frozen, RoundBatch, jax.Array],
                                tuple[RoundState, RoundResult]]:
    """The jitted round `(state, frozen, batch, rng) -> (state, result)` for a state with these
    shardings (concrete or abstract: `jaxrubric plan` compiles the same program): the state
    donated and its shardings kept, frozen weights arguments (not constants), scalars
    replicated, outputs where the program leaves them."""
    mesh = jax.tree.leaves(state_shardings)[0].mesh
    replicated = NamedSharding(mesh, PartitionSpec())
    return jax.jit(
        shd.traced_in(lambda state, frozen, batch, rng: round_fn(setup, state, frozen, batch,
                                                                 rng), mesh),
        donate_argnums=(0,),
        out_shardings=(state_shardings, RoundResult(scalars=replicated, outputs=None)))


def make_round_step(setup: RoundSetup, frozen: Frozen, round_fn: RoundFn
                    ) -> Callable[[RoundState, RoundBatch, jax.Array],
                                  tuple[RoundState, RoundResult]]:
    """`round_program` with the frozen weights bound, built at the first call from that
    state's shardings."""
    compiled: dict[str, Any] = {}

    def round_step(state, batch, rng):
        if "jitted" not in compiled:
            compiled["jitted"] = round_program(setup, round_fn,
                                               jax.tree.map(lambda x: x.sharding, state))
            round_step.jitted = compiled["jitted"]  # exposes the compilation cache to tests
        return compiled["jitted"](state, frozen, batch, rng)

    return round_step


def make_submesh_round_step(setup: RoundSetup, frozen: Frozen, run: placement.SubMeshes,
                            round_fn: RoundFn
                            ) -> Callable[[RoundState, RoundBatch, jax.Array],
                                          tuple[RoundState, RoundResult]]:
    """The round with each role on its own sub-mesh: one program per stage (the round's
    stages placed by `run`), each role's state donated to its update and kept on its mesh.
    Same signature and results as `make_round_step`; its metrics live on the meshes that
    computed them."""
    placed = placement.within(run, round_fn)

    def round_step(state, batch, rng):
        return placed(setup, state, frozen, batch, rng)

    round_step.placement = run  # exposes the stages' compilation caches to tests
    return round_step

