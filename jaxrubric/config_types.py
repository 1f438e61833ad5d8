"""Config values as a command line spells them, read and checked against a key's declared type
(`config.apply_override` and `config.check_config` use them)."""

from __future__ import annotations

import json
import types
import typing
from typing import Any


def cast(raw: str, hint: Any) -> Any:
    """`raw` as one type (ValueError if it is not one), spelled as on a command line."""
    if hint is type(None):
        raise ValueError(raw)  # only `none` is None, handled by the caller
    if hint is bool:
        if raw.lower() not in ("true", "false", "1", "0"):
            raise ValueError(raw)
        return raw.lower() in ("true", "1")
    if typing.get_origin(hint) is typing.Literal:
        return raw  # checked against its registry by check_config
    return hint(raw)


def free_form_value(raw: str) -> Any:
    """A chat-template argument has no declared type: true/false, a JSON number, or text."""
    if raw.lower() in ("true", "false"):
        return raw.lower() == "true"
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        return raw
    return value if isinstance(value, (int, float)) else raw


def union_members(hint: Any) -> tuple[Any, ...]:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return typing.get_args(hint)
    return (hint,)


def type_name(hint: Any) -> str:
    if typing.get_origin(hint) is typing.Literal:
        return type(typing.get_args(hint)[0]).__name__
    if hint is type(None):
        return "None"
    members = union_members(hint)
    if len(members) > 1:
        return " or ".join(type_name(member) for member in members)
    return hint.__name__


def matches(value: Any, hint: Any) -> bool:
    """Whether `value` has the declared type (an int is a float; a bool is neither)."""
    members = union_members(hint)
    if len(members) > 1:
        return any(matches(value, member) for member in members)
    if typing.get_origin(hint) is typing.Literal:
        return any(type(value) is type(arg) for arg in typing.get_args(hint))
    if hint in (int, float):
        return isinstance(value, int if hint is int else (int, float)) and not isinstance(
            value, bool)
    return isinstance(value, hint)
