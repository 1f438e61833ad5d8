"""The three roles of a round: the policy answers, the generator writes rubrics, the verifier
judges. One enum, so a role is never an f-string away from a typo."""

from __future__ import annotations

import enum


class Role(str, enum.Enum):
    """A role of the round. A `str`, so it indexes config sections (`config[role]`) and
    mesh tables keyed by the role's name."""

    POLICY = "policy"
    GENERATOR = "generator"
    VERIFIER = "verifier"

    def __str__(self) -> str:
        return self.value

    def __repr__(self) -> str:  # messages that print a role-keyed dict read like the config
        return repr(self.value)

    __format__ = str.__format__


ROLES: tuple[Role, ...] = tuple(Role)
# The roles a round trains, in the order their updates run (the generator first).
TRAINED: tuple[Role, ...] = (Role.GENERATOR, Role.POLICY)
