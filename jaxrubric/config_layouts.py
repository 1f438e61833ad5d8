"""Configs written before a key moved: a workdir's saved `config.json` and a checkpoint's run
config read in today's layout (`upgrade`), and the new home of a moved key, for the error that
refuses the old one (`moved_to`).

The round's per-role settings were `round.<role>_<name>` pairs and `round.freeze_<role>`; they
are each trained role's record now (`round.policy.beta`, `methods.round_config.RoleConfig`).
The advantage mode was one shared `round.advantage_mode`, with `round.policy_advantage_mode`
overriding it for the policy when not empty; each role has its own now.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_TRAINED = ("policy", "generator")
# round.<old> -> (role, name in its record)
MOVED: dict[str, tuple[str, str]] = {
    **{f"{role}_{name}": (role, name) for role in _TRAINED
       for name in ("temperature", "beta", "kl", "entropy")},
    **{f"freeze_{role}": (role, "freeze") for role in _TRAINED},
    "policy_advantage_mode": ("policy", "advantage_mode"),
}
SHARED_ADVANTAGE_MODE = "advantage_mode"


def moved_to(key: str) -> str | None:
    """Where a dotted config key of an earlier layout lives now (None: it did not move)."""
    section, _, name = key.partition(".")
    if section != "round":
        return None
    if name == SHARED_ADVANTAGE_MODE:
        return " and ".join(f"config.round.{role}.advantage_mode" for role in _TRAINED)
    if name in MOVED:
        role, field = MOVED[name]
        return f"config.round.{role}.{field}"
    return None


def upgrade(config: Mapping[str, Any]) -> dict[str, Any]:
    """A config as nested dicts (`ConfigDict.to_dict()`, a saved `config.json`) in today's
    layout; one already in it comes back unchanged."""
    out = dict(config)
    old = dict(out.get("round") or {})
    if SHARED_ADVANTAGE_MODE not in old and not MOVED.keys() & old.keys():
        return out
    roles = {role: dict(old.pop(role, None) or {}) for role in _TRAINED}
    shared = old.pop(SHARED_ADVANTAGE_MODE, None)
    if shared is not None:
        for record in roles.values():
            record["advantage_mode"] = shared
    for name, (role, field) in MOVED.items():
        if name in old:
            value = old.pop(name)
            if name != "policy_advantage_mode" or value:  # "": the shared mode
                roles[role][field] = value
    out["round"] = {**old, **roles}
    return out
