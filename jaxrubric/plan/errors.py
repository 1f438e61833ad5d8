"""The one error `jaxrubric plan` reports as a usage error (exit status 2), not a traceback."""

from __future__ import annotations


class PlanError(ValueError):
    """A plan that cannot be made as asked: a bad mesh, memory size or model source."""
