"""The plan's figures for every 8B recipe, bare and sized for each slice, and on three
sub-meshes (what each stage reads from another mesh), held to the numbers recorded in
tests/data/plan_figures.json: a change to where the plan reads its shapes from must leave them
as they are. After a change meant to move them, rewrite the file with
`python tests/plan/test_plan_figures.py` and say why in the commit."""

import json
import sys
from pathlib import Path

import pytest

from jaxrubric import plan
from jaxrubric.config import load_config
from jaxrubric.recipes import SLICES

ROOT = Path(__file__).resolve().parents[2]
FIGURES = ROOT / "tests" / "data" / "plan_figures.json"
RECIPES = ["qwen3_8b_dynamic_rubric", "llama31_8b_dynamic_rubric", "qwen3_8b_genrubric",
           "llama31_8b_genrubric"]
SUBMESHES = ("submeshes.policy=fsdp=4", "submeshes.generator=fsdp=2", "submeshes.verifier=fsdp=2")
CASES = {**{name: (f"configs/{name}.py", ()) for name in RECIPES},
         **{f"{name}:{s}": (f"configs/{name}.py:{s}", ()) for name in RECIPES for s in SLICES},
         **{f"{name}:8xH100 on sub-meshes": (f"configs/{name}.py:8xH100", SUBMESHES)
            for name in RECIPES}}


def figures(case: str) -> dict:
    """The plan of `case` at 95 GiB per device, as JSON (phases as their items and total)."""
    path, overrides = CASES[case]
    config = load_config(str(ROOT / path), overrides)
    p = plan.plan_memory(config, plan.parse_bytes("95GiB"))
    return json.loads(json.dumps(p, default=lambda phase: phase._asdict()))


@pytest.fixture(scope="module")
def recorded() -> dict:
    return json.loads(FIGURES.read_text())


@pytest.mark.parametrize("case", list(CASES))
def test_plan_figures_are_the_recorded_ones(case, recorded):
    assert figures(case) == recorded[case]


if __name__ == "__main__":
    FIGURES.write_text(json.dumps({case: figures(case) for case in CASES}, indent=1) + "\n")
    sys.exit(0)
