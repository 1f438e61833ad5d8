"""`jaxrubric train` end to end on the tiny config: checkpoints, exact resume, logs, export."""

from pathlib import Path

import jax
import numpy as np
import pytest
import torch
import transformers
from helpers import stopped_after
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import jaxrubric
from jaxrubric.cli import main
from jaxrubric.config import ConfigFileError, load_config
from jaxrubric.train import CoevolveTask
from jaxrubric.train_loop import restore_checkpoint

CONFIG = str(Path(__file__).parents[2] / "configs" / "tiny_dynamic_rubric.py")
SMALL = ["--config.round.response_tokens=8", "--config.rubric.max_items=2"]


def _train(workdir, rounds):
    return main(["train", "--config", CONFIG, f"--config.rounds={rounds}", "--workdir",
                 str(workdir), *SMALL])


def _final_state(workdir):
    config = load_config(CONFIG, [o.removeprefix("--config.") for o in SMALL])
    task = CoevolveTask(config)
    state, meta = restore_checkpoint(str(workdir), task.abstract_state())
    return jax.device_get(state), meta


@pytest.mark.slow
def test_train_resume_equals_uninterrupted_and_exports(tmp_path, capsys):
    """(Extending a finished run with more rounds: `test_genrubric_config_trains_and_resumes`.)"""
    assert _train(tmp_path / "straight", 2) == 0
    assert _train(stopped_after(tmp_path / "straight", tmp_path / "resumed", 1), 2) == 0
    assert "resumed from round 1" in capsys.readouterr().out
    straight, meta = _final_state(tmp_path / "straight")
    resumed, _ = _final_state(tmp_path / "resumed")
    assert meta["round"] == 2
    jax.tree.map(np.testing.assert_array_equal, straight, resumed)

    events = EventAccumulator(str(tmp_path / "straight" / "tensorboard"))
    events.Reload()
    tags = events.Tags()["scalars"]
    assert {"policy/reward", "generator/reward", "rubric/valid_rate"} <= set(tags)
    assert [e.step for e in events.Scalars("policy/reward")] == [1, 2]

    out = tmp_path / "exported"
    assert main(["export", "--workdir", str(tmp_path / "resumed"), "--role", "policy",
                 "--out", str(out)]) == 0
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, dtype="float32").eval()
    ours = jaxrubric.load_pretrained(out)
    ids = np.array([[5, 17, 42, 7]])
    with torch.no_grad():
        ref = hf(torch.as_tensor(ids)).logits.numpy()
    np.testing.assert_allclose(np.asarray(ours(ids))[..., :ref.shape[-1]], ref, atol=1e-4)
    assert transformers.AutoTokenizer.from_pretrained(out).chat_template


@pytest.mark.slow
def test_a_run_saved_in_the_earlier_config_layout_resumes_and_exports(saved_v1_workdir, capsys):
    """A workdir written before the round's per-role settings became records (`config.json`
    and the checkpoint's run config in the old layout, tests/data/README.md) resumes under
    its own config, read in today's layout, and exports its LoRA policy."""
    assert main(["train", "--config", str(saved_v1_workdir / "config.json"),
                 "--config.rounds=2", "--workdir", str(saved_v1_workdir)]) == 0
    assert "resumed from round 1" in capsys.readouterr().out
    assert main(["export", "--workdir", str(saved_v1_workdir), "--role", "policy",
                 "--out", str(saved_v1_workdir / "policy_hf")]) == 0
    assert "exported the policy's weights of round 2" in capsys.readouterr().out


def test_a_kl_reference_other_than_the_starting_weights(tmp_path):
    """`config.<role>.reference`: the KL term reads that checkpoint (here the policy's weights
    saved), not the weights the role starts from; another architecture, or a LoRA role, is
    refused naming the key."""
    from flax import nnx

    from jaxrubric.roles import Role

    task = CoevolveTask(load_config(CONFIG))
    assert task.frozen.generator_ref is not None  # its beta > 0: a reference is held
    started = nnx.to_pure_dict(task.frozen.generator_ref)
    jax.tree.map(np.testing.assert_array_equal, started, nnx.to_pure_dict(
        nnx.state(task.models[Role.GENERATOR], nnx.Param)))
    jaxrubric.save_pretrained(task.models[Role.POLICY], tmp_path / "other")
    task = CoevolveTask(load_config(CONFIG, [f"generator.reference={tmp_path / 'other'}"]))
    jax.tree.map(np.testing.assert_array_equal, nnx.to_pure_dict(task.frozen.generator_ref),
                 nnx.to_pure_dict(nnx.state(task.models[Role.POLICY], nnx.Param)))

    small = jaxrubric.tiny_config("qwen3", vocab_size=len(task.tokenizer), hidden_size=16,
                                  num_layers=1, num_heads=2, num_kv_heads=1, head_dim=8,
                                  intermediate_size=32)
    jaxrubric.save_pretrained(jaxrubric.init_model(small), tmp_path / "small")
    with pytest.raises(ValueError, match="config.generator.reference: .*small is not the "
                                         "architecture of config.generator.path"):
        CoevolveTask(load_config(CONFIG, [f"generator.reference={tmp_path / 'small'}"]))
    with pytest.raises(ConfigFileError, match="config.generator.reference: a LoRA role's KL"):
        load_config(CONFIG, [f"generator.reference={tmp_path / 'other'}",
                             "generator.lora.rank=4"])


def test_role_layers_unrolled_and_runtime_switches_from_the_config():
    """`config.<role>.scan_layers=false` builds that role with its layers unrolled; runtime
    switches reach the round's frozen inputs as this run's flags, and are refused on sub-meshes
    before any model loads."""
    from jaxrubric.roles import Role

    task = CoevolveTask(load_config(CONFIG, ["policy.scan_layers=false",
                                             "round.runtime_switches=true",
                                             "round.generator.freeze=true"]))
    assert not task.models[Role.POLICY].config.scan_layers  # a Python loop over the layers
    assert task.models[Role.GENERATOR].config.scan_layers
    assert jax.device_get(task.frozen.switches) == (True, False, False)
    assert task.frozen.generator_ref is not None  # kept: the program holds the update
    with pytest.raises(ValueError, match="config.round.runtime_switches needs every role on "
                                         "one mesh"):
        CoevolveTask(load_config(CONFIG, ["round.runtime_switches=true",
                                          "submeshes.policy=fsdp=4", "submeshes.generator=data=2",
                                          "submeshes.verifier=fsdp=-1"]))


def test_config_errors_name_the_key(tmp_path):
    with pytest.raises(ConfigFileError, match="config has no key 'round.nonsense'"):
        load_config(CONFIG, ["round.nonsense=1"])
    with pytest.raises(ConfigFileError, match="config.round.num_responses takes a int"):
        load_config(CONFIG, ["round.num_responses=many"])
    with pytest.raises(ConfigFileError, match="num_responses must be >= 2"):
        load_config(CONFIG, ["round.num_responses=1"])
    with pytest.raises(ConfigFileError, match="does not exist"):
        load_config(tmp_path / "missing.py")


def test_an_oracle_comes_with_the_config_that_names_it(tmp_path):
    """`config.oracle` names a ground-truth reward the caller hands in (`jaxrubric.toy.ORACLES`):
    training never imports a world. Both checks come before any model loads."""
    from jaxrubric.toy import ORACLES

    assert set(ORACLES) == {"toy_digits"}
    with pytest.raises(ValueError, match="config.oracle='toy_digits' needs its ground-truth"):
        CoevolveTask(load_config(CONFIG, ["oracle=toy_digits"]))
    with pytest.raises(ValueError, match="config.oracle='' needs its ground-truth"):
        CoevolveTask(load_config(CONFIG), oracle=ORACLES["toy_digits"])
    with pytest.raises(SystemExit, match="config.oracle 'nope' is not one of \\['toy_digits'\\]"):
        main(["train", "--config", CONFIG, "--config.oracle=nope", "--workdir", str(tmp_path)])


@pytest.mark.parametrize("name", ["qwen3_8b_dynamic_rubric", "llama31_8b_dynamic_rubric"])
def test_recipes_load_and_check(name):
    config = load_config(Path(CONFIG).parent / f"{name}.py")
    assert config.round.num_responses == 8 and config.round.policy.beta == 0.01
    assert (config.optim.policy_lr, config.optim.generator_lr) == (1e-6, 5e-6)
    assert config.policy.path and config.data.train


@pytest.mark.slow
def test_genrubric_config_trains_and_resumes(tmp_path, capsys):
    config = str(Path(CONFIG).parent / "tiny_genrubric.py")
    args = ["train", "--config", config, "--workdir", str(tmp_path), *SMALL]
    assert main([*args, "--config.rounds=1"]) == 0
    assert main([*args, "--config.rounds=2"]) == 0
    assert "resumed from round 1" in capsys.readouterr().out
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert {"generator/comprehensiveness", "rubric/negative_items"} <= set(
        events.Tags()["scalars"])
