"""Either world's config as a tree of settings: a world's own settings at the top and its round
config (`round`, with a record per trained role) below, each setting named by its dotted path
(`round.policy.beta`). Replacing settings by those names, and what two saved configs disagree
on."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

Config = TypeVar("Config")
UNSET = "(not set)"


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested mapping's leaves by dotted name."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, Mapping):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def setting(config: Any, dotted: str) -> Any:
    """One setting of a (nested) dataclass by its dotted name."""
    for part in dotted.split("."):
        config = getattr(config, part)
    return config


def replace(config: Config, settings: Mapping[str, Any]) -> Config:
    """`config` (a frozen dataclass holding dataclasses) with each dotted setting replaced, the
    records on its path rebuilt, so each checks its values again."""
    nested: dict[str, dict[str, Any]] = {}
    flat: dict[str, Any] = {}
    for dotted, value in settings.items():
        head, _, rest = dotted.partition(".")
        if not any(f.name == head for f in dataclasses.fields(config)):
            raise ValueError(f"{type(config).__name__} has no setting {head!r}")
        if rest:
            nested.setdefault(head, {})[rest] = value
        else:
            flat[head] = value
    for head, inner in nested.items():
        flat[head] = replace(flat.get(head, getattr(config, head)), inner)
    return dataclasses.replace(config, **flat)


def differences(there: Mapping[str, Any], now: Mapping[str, Any],
                ignored: Iterable[str] = ()) -> list[str]:
    """The settings two saved configs disagree on (`ignored` aside), each as
    "dotted.name: <there> there, <now> now"."""
    there, now, ignored = flatten(there), flatten(now), set(ignored)
    return [f"{key}: {there.get(key, UNSET)!r} there, {now.get(key, UNSET)!r} now"
            for key in sorted((there.keys() | now.keys()) - ignored)
            if there.get(key, UNSET) != now.get(key, UNSET)]
