"""A round's random keys, written as one plan and drawn where they are used.

A round function writes its key plan once: each stage's key is the round's `rng` split and
folded (`RoundKey.split`, `fold_in`). A key stays the round's `rng` with that derivation, which
is static, until the stage that uses it draws it (`RoundKey.draw`): no key is computed between
a round's programs, so a stage on a sub-mesh receives the round's key alone and the plan's
compile from shapes (`jaxrubric.plan.compile`) builds the same programs.
"""

from __future__ import annotations

import dataclasses

import jax

from jaxrubric.roles import TRAINED, Role

# Streams apart from the split of the round's key: DynamicRubric's explorer's rubrics beside
# the generator's, the updates' LoRA dropout beside the rollouts, GenRubric's shuffle control.
EXPLORER_STREAM = 0xE4B1
UPDATE_STREAM = 0x5EED
SHUFFLE_STREAM = 3


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class RoundKey:
    """The round's `rng` and the static derivation of one key from it."""

    rng: jax.Array
    path: tuple[tuple[str, int], ...] = dataclasses.field(default=(),
                                                          metadata={"static": True})

    def split(self) -> tuple[RoundKey, RoundKey]:
        """The two keys of `jax.random.split(key)`."""
        return tuple(RoundKey(self.rng, (*self.path, ("split", i))) for i in range(2))

    def fold_in(self, data: int) -> RoundKey:
        """The key of `jax.random.fold_in(key, data)`."""
        return RoundKey(self.rng, (*self.path, ("fold_in", data)))

    def draw(self) -> jax.Array:
        """The key itself (inside the stage that uses it)."""
        key = self.rng
        for op, value in self.path:
            key = jax.random.split(key)[value] if op == "split" else jax.random.fold_in(key, value)
        return key


def update_keys(key: RoundKey) -> dict[Role, RoundKey]:
    """Each trained role's update key (its LoRA dropout), from the round's."""
    stream = key.fold_in(UPDATE_STREAM)
    return {role: stream.fold_in(TRAINED.index(role)) for role in TRAINED}
