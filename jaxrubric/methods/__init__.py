"""The co-evolution methods, by name: the one place that reads `config.method`.

A method is one file (`dynamic_rubric.py`, `genrubric.py`) holding a `Method` (`method.py`); a
third method is one new file and one line here.
"""

from __future__ import annotations

import difflib

from jaxrubric.methods.dynamic_rubric import DYNAMIC_RUBRIC
from jaxrubric.methods.genrubric import GENRUBRIC
from jaxrubric.methods.method import Method

METHODS: dict[str, Method] = {m.name: m for m in (DYNAMIC_RUBRIC, GENRUBRIC)}


def get_method(name: str) -> Method:
    """The method registered as `name`; a ValueError naming the registered ones (and the
    closest match) otherwise."""
    if name not in METHODS:
        close = difflib.get_close_matches(str(name), METHODS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"config.method {name!r} is not one of {sorted(METHODS)}{hint}")
    return METHODS[name]
