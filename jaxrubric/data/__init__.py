"""Data sets: record types, row validation and loaders (via `datasets`)."""

from jaxrubric.data.loaders import Loaded, load_anchors, load_healthbench, load_prompts, read_rows
from jaxrubric.data.schemas import (
    AnchorRecord,
    Answer,
    DataError,
    ExpertItem,
    HealthBenchRecord,
    Messages,
    PromptRecord,
    prompt_text,
)

__all__ = [
    "AnchorRecord", "Answer", "DataError", "ExpertItem", "HealthBenchRecord", "Loaded",
    "Messages", "PromptRecord", "load_anchors", "load_healthbench", "load_prompts",
    "prompt_text", "read_rows",
]
