"""The 8B recipes sized for a slice (`configs/NAME.py:SLICE`, `jaxrubric.recipes`): what sizing
changes, and the errors for a slice that does not exist."""

from pathlib import Path

import pytest

from jaxrubric.config import ConfigFileError, load_config
from jaxrubric.recipes import DEFAULT_SLICE, SLICES

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
RECIPE = CONFIGS / "qwen3_8b_dynamic_rubric.py"


def test_a_recipe_without_a_slice_is_sized_for_the_default_one():
    plain, sized = load_config(RECIPE), load_config(f"{RECIPE}:{DEFAULT_SLICE}")
    assert plain.to_dict() == sized.to_dict()


@pytest.mark.parametrize("name", list(SLICES))
def test_sizing_sets_the_mesh_and_micro_batches_and_lora_only_where_named(name):
    chosen, paper = SLICES[name], load_config(f"{RECIPE}:{DEFAULT_SLICE}")
    config = load_config(f"{RECIPE}:{name}")
    assert {axis: config.mesh[axis] for axis, _ in chosen.mesh} == dict(chosen.mesh)
    assert config.mesh.data * config.mesh.fsdp * config.mesh.tensor == chosen.chips
    assert config.round.rollout_micro_batches == chosen.rollout_micro_batches
    assert config.round.update_micro_batches == chosen.update_micro_batches
    for role in ("policy", "generator"):
        assert config[role].lora.rank == chosen.lora_rank
    scale = 10 if chosen.lora_rank else 1
    assert config.optim.policy_lr == pytest.approx(paper.optim.policy_lr * scale)
    # What the papers set and no slice changes.
    for key in ("batch_size", "prompt_tokens"):
        assert config.data[key] == paper.data[key]
    assert config.round.num_responses == paper.round.num_responses


def test_an_unknown_slice_is_named_with_the_known_ones():
    with pytest.raises(ConfigFileError, match="no slice 'v4-8'.*v5p-8"):
        load_config(f"{RECIPE}:v4-8")


def test_a_saved_config_takes_no_slice(tmp_path):
    saved = tmp_path / "config.json"
    saved.write_text("{}")
    with pytest.raises(ConfigFileError, match="takes no ':v5p-8'"):
        load_config(f"{saved}:v5p-8")
