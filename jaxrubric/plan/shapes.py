"""The round's shapes from a config alone: the round built from shapes as training builds it
(`plan.abstract`, on one device: no stage's shapes depend on the mesh) and traced, never run
(`Method.round_shapes`), giving its rollouts, verifier passes and updates in the order they run
and what each stage program reads from another role's mesh. The plan keeps only the formulas
that turn them into bytes (`plan.phases`, `plan.memory`)."""

from __future__ import annotations

import functools
import json
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import ml_collections

from jaxrubric.methods.shapes import RoundShapes
from jaxrubric.plan.abstract import abstract_round
from jaxrubric.roles import ROLES


class RoundDims(NamedTuple):
    """What the plan reads of the round's batch and grammar."""

    batch: int  # B prompts
    batch_row_bytes: int  # one prompt's row of the batch (`methods.batches.encode_batch`)
    rubric: int  # the grammar's longest rubric


def _stand_in_oracle(tokens: jax.Array, lengths: jax.Array, question: object) -> jax.Array:
    """A ground truth of the right shape, for a config that names one (`config.oracle`)."""
    del lengths, question
    return jnp.zeros(tokens.shape[:2], jnp.float32)


def round_shapes(config: ml_collections.ConfigDict) -> tuple[RoundDims, RoundShapes]:
    """The round's dims and its stages' global shapes. Cached: the plans of one config on
    several meshes trace it once."""
    one = config.copy_and_resolve_references()
    with one.ignore_type():
        one.mesh = ml_collections.ConfigDict({"data": 1, "fsdp": 1, "tensor": 1})
        one.submeshes = ml_collections.ConfigDict(dict.fromkeys(ROLES, ""))
    return _traced(one.to_json_best_effort(sort_keys=True))


@functools.lru_cache(maxsize=16)
def _traced(config_json: str) -> tuple[RoundDims, RoundShapes]:
    config = ml_collections.ConfigDict(json.loads(config_json))
    built = abstract_round(config, jax.devices()[:1],
                           _stand_in_oracle if config.oracle else None)
    shapes = built.method.round_shapes(built.setup, built.state, built.frozen, built.batch,
                                       built.rng)
    batch = built.batch.question.tokens.shape[0]
    row_bytes = sum(math.prod(x.shape) * x.dtype.itemsize
                    for x in jax.tree.leaves(built.batch)) // batch
    return RoundDims(batch, row_bytes, built.setup.grammar.max_rubric_tokens), shapes
