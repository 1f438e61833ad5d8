"""Roles on sub-meshes of their own (`jaxrubric.placement`): the round runs as one program per
stage on each role's devices and gives what the colocated round (one program) gives.

The DynamicRubric case also turns on the memory options (micro-batched rollouts and updates,
attention over query blocks): a whole round with them equals the plain round, which each
option's own tests check on its part alone (tests/methods/test_microbatch.py, tests/models/test_attention.py).
"""

from pathlib import Path

import jax
import numpy as np
import pytest
from helpers import CONFIGS, flat, named_leaves, update_error
from jax.sharding import NamedSharding, PartitionSpec

from jaxrubric import placement
from jaxrubric import sharding as shd
from jaxrubric.config import ConfigFileError, load_config
from jaxrubric.methods.data import RoundResult
from jaxrubric.roles import Role
from jaxrubric.train import CoevolveTask

# Three disjoint meshes over the 8 test devices, each splitting the batch its own way.
SUBMESHES = ["--config.submeshes.policy=fsdp=4", "--config.submeshes.generator=data=2",
             "--config.submeshes.verifier=fsdp=-1"]
# Soft verdicts and advantages without the std keep the update well conditioned (see
# tests/multihost/test_multihost.py, OVERRIDES); the held-out batch exercises the evaluation's stages.
SMALL = ["--config.round.response_tokens=8", "--config.rubric.max_items=2",
         "--config.round.soft_verdicts=true", "--config.round.policy.advantage_mode=no_std",
         "--config.round.generator.advantage_mode=no_std",
         "--config.optim.policy_lr=1e-3", "--config.optim.generator_lr=1e-3"]
MEMORY_SAVING = ["--config.round.rollout_micro_batches=2", "--config.round.update_micro_batches=2",
                 *(f"--config.{role}.attention_chunk=8" for role in placement.ROLES)]
LORA = [f"--config.{role}.lora.{key}={value}" for role in ("policy", "generator")
        for key, value in (("rank", 4), ("dropout", 0.1), ("targets", "q_proj,v_proj,up_proj"))]
UPDATE_RTOL = {Role.POLICY: 1e-3, Role.GENERATOR: 1e-2}  # as tests/methods/test_mesh_equivalence.py
STAGES = {"dynamic_rubric": 6, "genrubric": 6}  # rollout stages, judge, reward, both updates
EVAL_STAGES = {"dynamic_rubric": 1, "genrubric": 2}  # the held-out evaluation's programs
HEALTHBENCH = Path(__file__).parents[1] / "data" / "healthbench_oss_eval_30examples.jsonl"


def test_resolve_submeshes_fills_the_open_mesh_and_shares_by_name():
    resolved = placement.resolve_submeshes(
        {"policy": "fsdp=4", "generator": "policy", "verifier": "data=2,fsdp=-1"}, 8)
    assert resolved["policy"] == ({"data": 1, "fsdp": 4, "tensor": 1}, "policy")
    assert resolved["generator"] == resolved["policy"]
    assert resolved["verifier"] == ({"data": 2, "fsdp": 2, "tensor": 1}, "verifier")
    meshes = placement.make_submeshes(
        {"policy": "fsdp=4", "generator": "policy", "verifier": "data=2,fsdp=-1"})
    assert meshes["generator"] is meshes["policy"]
    assert set(meshes["policy"].devices.flat).isdisjoint(meshes["verifier"].devices.flat)
    assert len(set(meshes["policy"].devices.flat) | set(meshes["verifier"].devices.flat)) == 8


@pytest.mark.parametrize("specs, message", [
    ({"policy": "fsdp=4", "generator": "", "verifier": "fsdp=4"}, "submeshes.generator is empty"),
    ({"policy": "generator", "generator": "fsdp=4", "verifier": "fsdp=4"},
     "only an earlier role's mesh"),
    ({"policy": "fsdp=4", "generator": "pipe=2", "verifier": "fsdp=2"}, "AXIS=SIZE"),
    ({"policy": "fsdp=x", "generator": "policy", "verifier": "fsdp=4"},
     "SIZE a positive integer"),
    ({"policy": "fsdp=-1", "generator": "policy", "verifier": "data=-1"}, "only one mesh"),
    ({"policy": "fsdp=4", "generator": "fsdp=2", "verifier": "fsdp=4"}, "cover 10 devices"),
    ({"policy": "fsdp=3", "generator": "policy", "verifier": "data=2,fsdp=-1"},
     "5 devices are left"),
])
def test_bad_submeshes_are_errors_naming_the_role(specs, message):
    with pytest.raises(ValueError, match=message):
        placement.resolve_submeshes(specs, 8)


def test_config_checks_submeshes_before_loading_models():
    config = CONFIGS / "tiny_dynamic_rubric.py"
    with pytest.raises(ConfigFileError, match="submeshes.verifier is empty"):
        load_config(config, ["submeshes.policy=fsdp=4", "submeshes.generator=policy"])
    load_config(config, ["submeshes.policy=fsdp=4", "submeshes.generator=policy",
                         "submeshes.verifier=fsdp=4"])


def test_to_mesh_moves_only_what_is_elsewhere():
    meshes = placement.make_submeshes({"policy": "fsdp=4", "generator": "policy",
                                       "verifier": "data=2,fsdp=2"})
    here, there = meshes["policy"], meshes["verifier"]
    rows = jax.device_put(np.arange(8 * 3).reshape(8, 3), shd.batch_sharding(here, 2))
    odd = jax.device_put(np.arange(3), NamedSharding(here, PartitionSpec()))
    moved = placement.to_mesh({"rows": rows, "odd": odd, "n": 3}, there)
    assert moved["rows"].sharding == shd.batch_sharding(there, 2)
    assert moved["odd"].sharding == NamedSharding(there, PartitionSpec())  # 3 rows on 4 ways
    assert moved["n"] == 3
    np.testing.assert_array_equal(moved["rows"], rows)
    assert placement.to_mesh(rows, here) is rows


def _rounds(config_name: str, placement_args: list[str], rounds: int = 2) -> dict:
    config = load_config(CONFIGS / config_name,
                         [o.removeprefix("--config.") for o in (*SMALL, *placement_args)])
    # Held-out data: anchor lists for DynamicRubric, expert-rubric rows for GenRubric.
    config.data.eval = (config.data.train if config.method == "dynamic_rubric"
                        else str(HEALTHBENCH))
    config.data.eval_batch_size = 8
    task = CoevolveTask(config)
    state = task.init_state(jax.random.key(0))
    expected = jax.tree.map(lambda x: x.sharding, task.abstract_state())
    result = {"initial": {r: flat(jax.device_get(state.role(r).params)) for r in UPDATE_RTOL}}
    for r in range(rounds):
        state, out = task.round_step(state, task.batch(r), jax.random.key(r))
        assert isinstance(out, RoundResult)
        result[f"outputs{r}"] = named_leaves(jax.device_get(out.outputs))
    assert jax.tree.map(lambda x: x.sharding, state) == expected
    result["final"] = {r: flat(jax.device_get(state.role(r).params)) for r in UPDATE_RTOL}
    result["metrics"] = {k: float(v) for k, v in out.scalars.items()}
    if task._evaluate is not None:
        result["eval"] = jax.device_get(task.evaluate(state, rounds))
    result["task"] = task
    return result


@pytest.mark.slow
@pytest.mark.parametrize("config_name, common, options, rounds", [
    ("tiny_dynamic_rubric.py", [], MEMORY_SAVING, 2),
    # The GenRubric config freezes its answering policy: train it, so both updates are compared;
    # both roles through LoRA adapters (the base on each role's mesh, dropout keys per row).
    ("tiny_genrubric.py", ["--config.round.policy.freeze=false", *LORA], [], 1)],
    ids=["dynamic_rubric-micro-batched-chunked", "genrubric-lora"])
def test_submesh_round_equals_the_colocated_round(config_name, common, options, rounds):
    """Two DynamicRubric rounds (the second starts from the state the first left on the
    sub-meshes); one GenRubric round, whose stages differ, with LoRA roles, to keep the suite
    short."""
    colocated = _rounds(config_name, common, rounds)
    split = _rounds(config_name, [*common, *SUBMESHES, *options], rounds)
    task = split["task"]
    # Each role's weights stay on its own devices; each stage compiled once.
    for role, params in ((Role.POLICY, task.init_state(jax.random.key(0)).policy.params),
                         (Role.VERIFIER, task.frozen.verifier)):
        devices = set(task.meshes[role].devices.flat)
        assert all(x.sharding.device_set == devices for x in jax.tree.leaves(params)), role
    assert task._round.placement.compiled_programs() == STAGES[task.config.method] + (
        EVAL_STAGES[task.config.method] if task._evaluate is not None else 0)
    for r in range(rounds):
        for key, want in colocated[f"outputs{r}"].items():
            if np.issubdtype(np.asarray(want).dtype, np.floating):
                np.testing.assert_allclose(split[f"outputs{r}"][key], want, rtol=1e-4,
                                           atol=1e-6, err_msg=f"round {r}: {key}")
            else:  # sampled tokens and lengths: the same key draws the same tokens
                np.testing.assert_array_equal(split[f"outputs{r}"][key], want,
                                              err_msg=f"round {r}: {key}")
    # abs 1e-5: a GRPO loss over centred advantages sums to ~0 (1e-6 here), where another
    # reduction order moves it by its rounding.
    for name, want in colocated["metrics"].items():
        assert split["metrics"][name] == pytest.approx(want, rel=1e-3, abs=1e-5), name
    for role, rtol in UPDATE_RTOL.items():
        np.testing.assert_array_equal(split["initial"][role], colocated["initial"][role])
        error = update_error(split["final"][role], colocated["final"][role],
                             colocated["initial"][role])
        assert error < rtol, f"the {role} updates differ by {error:.3g} of their size"
    for name, want in colocated.get("eval", {}).items():
        assert float(split["eval"][name]) == pytest.approx(float(want), rel=1e-4, abs=1e-6), name


def test_stage_programs_put_each_stage_in_a_program_of_its_own_on_the_one_mesh():
    """`config.stage_programs`: every role on `config.mesh`, the round run as `SubMeshes` runs
    it (a program per stage, nothing moved: one mesh), which the one-program-vs-separate
    benchmark's test holds equal to the round as one program
    (tests/benchmarks/test_benchmark_tables.py); it cannot keep runtime switches."""
    config = CONFIGS / "tiny_dynamic_rubric.py"
    task = CoevolveTask(load_config(config, ["stage_programs=true"]))
    assert not task.colocated
    assert isinstance(task._round.placement, placement.SubMeshes)
    assert {id(mesh) for mesh in task._round.placement.meshes.values()} == {id(task.mesh)}
    with pytest.raises(ConfigFileError, match="runtime_switches needs the round as one program"):
        load_config(config, ["stage_programs=true", "round.runtime_switches=true"])
