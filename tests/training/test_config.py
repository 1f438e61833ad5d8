"""A training config is checked once, before any model loads: keys at every depth, each value
by its key's declared type, each string option against its registry, the method's own checks;
every error names the key. Dtypes may be given as JAX / NumPy dtypes and are stored as names."""

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

import jaxrubric
from jaxrubric.config import ConfigFileError, load_config, round_config
from jaxrubric.models.config import ConfigError

ROOT = Path(__file__).parents[2]
CONFIG = ROOT / "configs" / "tiny_dynamic_rubric.py"
GENRUBRIC = ROOT / "configs" / "tiny_genrubric.py"
TRAIN_DATA = ROOT / "configs" / "assets" / "tiny_anchors.jsonl"


def _raises(message: str):
    return pytest.raises(ConfigFileError, match=re.escape(message))


def _config_file(tmp_path: Path, *lines: str) -> Path:
    """A config file building on base_config(), with `lines` in its get_config()."""
    body = "".join(f"    {line}\n" for line in lines)
    path = tmp_path / "config.py"
    path.write_text(
        "import jax.numpy as jnp\nimport numpy as np\n\nfrom jaxrubric.config import base_config"
        f"\n\n\ndef get_config():\n    config = base_config()\n"
        f"    config.data.train = {str(TRAIN_DATA)!r}\n{body}    return config\n")
    return path


@pytest.mark.parametrize("override, message", [
    ("round.top_pp=0.9", "config has no key 'round.top_pp' (did you mean 'round.top_p'?)"),
    ("rounds.top_p=0.9", "config has no key 'rounds.top_p' (did you mean 'round.top_p'?)"),
    ("round.kl_estimator=k9", "config.round.kl_estimator 'k9' is not one of ['k1', 'k2', 'k3']"),
    ("round.aggregation=foo", "config.round.aggregation 'foo' is not one of ["),
    ("round.aggregation=token_mean", "(did you mean 'token-mean'?)"),
    ("method=foo", "config.method 'foo' is not one of ['dynamic_rubric', 'genrubric']"),
    ("round.top_p=high", "config.round.top_p takes a float or None, got 'high'"),
    ("policy.dtype=bf16", "config.policy.dtype 'bf16' is not one of ['float32', 'bfloat16', "
                          "'float16'] (did you mean 'bfloat16'?)"),
    ("round=3", "config.round is a section"),
    ("optim.lr_schedule=linear", "config.optim.lr_schedule 'linear' is not one of "
                                 "['constant', 'cosine']"),
    ("optim.warmup_steps=-1", "config.optim.warmup_steps must be >= 0, got -1"),
    ("optim.final_lr_fraction=1.5", "config.optim.final_lr_fraction must be in [0, 1], got 1.5"),
])
def test_bad_override_names_the_key(override, message):
    with _raises(message):
        load_config(CONFIG, [override])


@pytest.mark.parametrize("key", [
    "round.kl_estimator", "round.aggregation", "round.generator.advantage_mode",
    "round.disc_mode", "round.policy_score", "round.rubric_source", "round.policy_reward",
    "round.policy.kl", "round.generator.kl", "round.policy.advantage_mode", "policy.remat",
    "generator.attention_impl",
    "verifier.param_dtype", "rubric.template_style"])
def test_every_string_option_is_checked_against_its_registry(key):
    with _raises(f"config.{key} 'nonsense' is not one of"):
        load_config(CONFIG, [f"{key}=nonsense"])


def test_overrides_take_the_declared_type():
    config = load_config(CONFIG, ["round.top_p=0.95", "chat_template_kwargs.enable_thinking=false"])
    assert isinstance(config.round.top_p, float) and round_config(config).top_p == 0.95
    assert config.chat_template_kwargs.enable_thinking is False  # a free-form section
    assert load_config(CONFIG, ["round.top_p=0.95", "round.top_p=none"]).round.top_p is None


def test_the_method_checks_run_with_the_rest():
    with _raises("config.round.num_rubrics"):
        load_config(GENRUBRIC, ["round.num_rubrics=1"])


@pytest.mark.parametrize("path, overrides, message", [
    (GENRUBRIC, ["round.induced_responses=2", "method=dynamic_rubric"],
     "config.round.induced_responses is a genrubric setting; dynamic_rubric has no such key "
     "(did you mean 'round.num_responses'?)"),
    (CONFIG, ["round.induced_responses=2"], "config.round.induced_responses is a genrubric"),
    (CONFIG, ["method=genrubric"], "config.round.num_responses is a dynamic_rubric setting"),
    (GENRUBRIC, ["round.item_credit=0.5"], "config.round.item_credit is a dynamic_rubric"),
])
def test_a_setting_of_the_other_method_is_refused_by_the_round_type(path, overrides, message):
    """Each method's round is its own config type (`Method.round_config`): another method's
    key is refused, named with the closest of this method's; left at its default (a config
    built for one method and switched to the other) it is dropped."""
    with _raises(message):
        load_config(path, overrides)
    switched = load_config(GENRUBRIC, ["method=dynamic_rubric"]).round
    assert "induced_responses" not in switched and switched.num_responses == 8


@pytest.mark.parametrize("override", ["round.verifier.beta=0.1", "verifier.temperature=0.5"])
def test_a_per_role_setting_is_the_trained_roles(override):
    key = override.partition("=")[0]
    name = key.rpartition(".")[2]
    with _raises(f"config has no key {key!r}: the round's per-role settings are the trained "
                 f"roles' (config.round.generator.{name}, config.round.policy.{name})"):
        load_config(CONFIG, [override])


@pytest.mark.parametrize("override, message", [
    ("round.policy_beta=0.1", "config.round.policy_beta is config.round.policy.beta now"),
    ("round.freeze_generator=true", "config.round.freeze_generator is "
                                    "config.round.generator.freeze now"),
    ("round.advantage_mode=no_std", "config.round.advantage_mode is "
                                    "config.round.policy.advantage_mode and "
                                    "config.round.generator.advantage_mode now"),
])
def test_a_key_of_the_earlier_layout_names_its_new_home(override, message):
    with _raises(message):
        load_config(CONFIG, [override])


def test_a_config_saved_in_the_earlier_layout_loads_in_todays(saved_v1_workdir):
    """A workdir's `config.json` from before the per-role records: each old key lands in its
    role's record, and the shared advantage mode is each role's unless the policy had its
    own (`config_layouts`)."""
    saved = saved_v1_workdir / "config.json"
    rc = round_config(load_config(saved))
    assert (rc.policy.temperature, rc.generator.beta) == (0.9, 0.02)
    assert (rc.policy.advantage_mode, rc.generator.advantage_mode) == ("no_std", "group_std")
    assert rc == round_config(load_config(CONFIG, [
        "round.policy.temperature=0.9", "round.generator.beta=0.02",
        "round.policy.advantage_mode=no_std"]))
    data = json.loads(saved.read_text())
    data["round"].update(advantage_mode="batch_std", policy_advantage_mode="", freeze_policy=True)
    saved.write_text(json.dumps(data))
    rc = round_config(load_config(saved))
    assert (rc.policy.advantage_mode, rc.generator.advantage_mode) == ("batch_std", "batch_std")
    assert rc.policy.freeze and not rc.generator.freeze


def test_config_file_keys_and_values_are_checked(tmp_path):
    with _raises("config has no key 'data.batchsize' (did you mean 'data.batch_size'?)"):
        load_config(_config_file(tmp_path, "config.data.batchsize = 3"))
    with _raises("config.round.top_p takes a float or None, got '0.95' (str)"):
        load_config(_config_file(tmp_path, "config.round.top_p = '0.95'"))
    with _raises("config.round.disc_mode 'item_varience' is not one of ['item_variance', "
                 "'score_variance'] (did you mean 'item_variance'?)"):
        load_config(_config_file(tmp_path, "config.round.disc_mode = 'item_varience'"))


def test_config_file_may_give_dtype_objects(tmp_path):
    config = load_config(_config_file(
        tmp_path, "config.policy.dtype = jnp.bfloat16", "config.generator.param_dtype = np.float16",
        "config.verifier.dtype = jnp.dtype('bfloat16')"))
    assert (config.policy.dtype, config.generator.param_dtype, config.verifier.dtype) == (
        "bfloat16", "float16", "bfloat16")
    assert json.loads(config.to_json())["policy"]["dtype"] == "bfloat16"
    with _raises("config.policy.param_dtype <class 'jax.numpy.int8'> is not one of"):
        load_config(_config_file(tmp_path, "config.policy.param_dtype = jnp.int8"))


def test_saved_config_json_is_checked_like_a_file(tmp_path):
    saved = tmp_path / "config.json"
    data = json.loads(load_config(CONFIG).to_json())
    saved.write_text(json.dumps(data))
    assert load_config(saved).to_dict() == load_config(CONFIG).to_dict()
    data["data"]["batchsize"] = 3
    saved.write_text(json.dumps(data))
    with _raises("config has no key 'data.batchsize' (did you mean 'data.batch_size'?)"):
        load_config(saved)
    # A run saved before keys and whole sections were added still loads (and exports), with
    # their defaults.
    del data["data"]["batchsize"], data["logging"], data["policy"]["lora"]
    del data["data"]["skip_bad_rows"]
    saved.write_text(json.dumps(data))
    assert load_config(saved).to_dict() == load_config(CONFIG).to_dict()


def test_model_dtypes_may_be_jax_or_numpy_dtypes(tmp_path):
    cfg = jaxrubric.tiny_config("qwen3", num_layers=1, dtype=jnp.bfloat16, param_dtype=np.float32)
    assert (cfg.dtype, cfg.param_dtype) == ("bfloat16", "float32")
    assert cfg == jaxrubric.tiny_config("qwen3", num_layers=1, dtype="bfloat16")
    path = jaxrubric.save_pretrained(jaxrubric.init_model(cfg), tmp_path / "hf",
                                     dtype=jnp.dtype("float16"))
    assert json.loads((path / "config.json").read_text())["torch_dtype"] == "float16"
    model = jaxrubric.load_pretrained(path, dtype=jnp.bfloat16, param_dtype=np.float32)
    assert (model.config.dtype, model.config.param_dtype) == ("bfloat16", "float32")
    assert model.embed[...].dtype == jnp.float32
    with pytest.raises(ConfigError, match=re.escape("param_dtype <class 'jax.numpy.int8'>")):
        jaxrubric.load_pretrained(path, param_dtype=jnp.int8)


@pytest.mark.slow
@pytest.mark.parametrize("config, overrides, message", [
    (CONFIG, ["--config.round.top_pp=0.9"],
     "config has no key 'round.top_pp' (did you mean 'round.top_p'?)"),
    (GENRUBRIC, ["--config.round.induced_responses=2", "--config.method=dynamic_rubric"],
     "config.round.induced_responses is a genrubric setting; dynamic_rubric has no such key"),
    (CONFIG, ["--config.round.verifier.beta=0.1"], "config has no key 'round.verifier.beta'"),
])
def test_cli_train_fails_on_a_bad_key_before_loading(tmp_path, config, overrides, message):
    workdir = tmp_path / "workdir"
    start = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "jaxrubric.cli", "train", "--config", str(config), *overrides,
         "--workdir", str(workdir)],
        capture_output=True, text=True, timeout=120, cwd=ROOT)
    elapsed = time.monotonic() - start
    assert result.returncode != 0
    assert message in result.stderr
    assert not workdir.exists()  # train() never started
    assert elapsed < 10, f"the error took {elapsed:.1f} s"
