"""Data sets: record types, row validation and loaders (JSON parsed here; parquet and hub data
sets via `datasets`)."""

from jaxrubric.data.loaders import Loaded, load_anchors, load_healthbench, load_prompts, read_rows
from jaxrubric.data.preference import (
    FORMATS,
    Candidate,
    CandidateSet,
    LoadedSets,
    detect_format,
    load_candidate_sets,
)
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
    "FORMATS", "AnchorRecord", "Answer", "Candidate", "CandidateSet", "DataError", "ExpertItem",
    "HealthBenchRecord", "Loaded", "LoadedSets", "Messages", "PromptRecord", "detect_format",
    "load_anchors", "load_candidate_sets", "load_healthbench", "load_prompts", "prompt_text",
    "read_rows",
]
