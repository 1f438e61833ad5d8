"""The starts shipped with the package: installed in a workdir only for the config and
tokenizer they were made with (else the world trains them, saying why in one line), never
mixed with a workdir's own, refused by `from_scratch`; the shipped ones are the defaults'."""

from __future__ import annotations

import json

import pytest

import jaxrubric
from jaxrubric.toy import config_tree, genrubric_world, stages, warm_starts, world
from jaxrubric.toy import digits_task as task
from jaxrubric.toy.genrubric_config import GenRubricWorldConfig
from jaxrubric.toy.workdir import prepare_workdir
from jaxrubric.toy.world_config import ToyWorldConfig
from jaxrubric.train_loop import ConfigMismatchError

WORLDS = {"dynamic_rubric": (world, ToyWorldConfig),
          "genrubric": (genrubric_world, GenRubricWorldConfig)}


@pytest.fixture
def shipped(tmp_path, monkeypatch):
    """A package whose assets hold seed 0's DynamicRubric starts: one file, made with the
    default config and the toy tokenizer."""
    assets = tmp_path / "assets"
    source = assets / "dynamic_rubric-seed0"
    (source / "models" / "policy").mkdir(parents=True)
    (source / "models" / "policy" / "config.json").write_text("{}")
    tokenizer = jaxrubric.load_tokenizer(task.build_tokenizer(tmp_path / "tokenizer"))
    manifest = {"settings": ToyWorldConfig().start_settings(),
                "tokenizer": warm_starts.tokenizer_fingerprint(tokenizer),
                "files": {"models/policy/config.json": "sha"},
                "made_by": {"command": "python -m jaxrubric.toy.warm_starts ..."}}
    (source / warm_starts.MANIFEST).write_text(json.dumps(manifest))
    monkeypatch.setattr(warm_starts, "ASSETS", assets)
    return tmp_path


def _provide(workdir, cfg, from_scratch=False):
    workdir, tokenizer = prepare_workdir(workdir, cfg)
    used = warm_starts.provide(workdir, tokenizer, world.METHOD, cfg, world.START_OUTPUTS,
                               from_scratch)
    return used, (workdir / "models" / "policy" / "config.json").exists()


def test_shipped_starts_serve_only_the_config_they_were_made_with(shipped, capsys):
    assert _provide(shipped / "default", ToyWorldConfig()) == (True, True)
    assert "shipped with the package" in capsys.readouterr().out
    # The compared runs' settings are not the starts': other rounds still use them.
    assert _provide(shipped / "rounds", ToyWorldConfig(rounds=30, runs=("oracle",))) == (
        True, True)
    capsys.readouterr()
    # Any setting the starts read: trained from scratch, the line says why.
    assert _provide(shipped / "other", ToyWorldConfig(policy_steps=250)) == (False, False)
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and "policy_steps: 1000 there, 250 now" in out[0], out
    assert _provide(shipped / "seed", ToyWorldConfig(seed=1)) == (False, False)
    assert "none shipped for seed 1" in capsys.readouterr().out


def test_another_tokenizer_or_a_workdirs_own_starts_are_not_mixed(shipped, monkeypatch,
                                                                  capsys):
    own = shipped / "own" / "models" / "policy"
    own.mkdir(parents=True)
    (own / "config.json").write_text('{"own": true}')
    assert _provide(shipped / "own", ToyWorldConfig()) == (False, True)
    assert json.loads((own / "config.json").read_text()) == {"own": True}
    assert "this workdir's own" in capsys.readouterr().out
    monkeypatch.setattr(warm_starts, "tokenizer_fingerprint", lambda tokenizer: "another")
    assert _provide(shipped / "tokenizer", ToyWorldConfig()) == (False, False)
    assert "the toy tokenizer" in capsys.readouterr().out


def test_from_scratch_trains_them_and_refuses_a_workdir_that_holds_the_shipped_ones(shipped):
    assert _provide(shipped / "scratch", ToyWorldConfig(), from_scratch=True) == (False, False)
    assert _provide(shipped / "shipped", ToyWorldConfig()) == (True, True)
    with pytest.raises(ConfigMismatchError, match="holds the shipped warm starts"):
        _provide(shipped / "shipped", ToyWorldConfig(), from_scratch=True)


def test_the_genrubric_starts_read_only_their_settings():
    cfg = GenRubricWorldConfig(rounds=7, eval_queries=64, bootstrap=10, generator_lr=1e-3)
    assert cfg.starts_only() == GenRubricWorldConfig()
    assert cfg.start_settings() == GenRubricWorldConfig().start_settings()
    assert GenRubricWorldConfig(answerer_steps=5).start_settings() != cfg.start_settings()
    # Of the round, the starts read the answerer's temperature (its rubric-following check).
    hotter = config_tree.replace(cfg, {"round.policy.temperature": 0.9,
                                       "round.num_rubrics": 4})
    assert hotter.starts_only() == config_tree.replace(
        GenRubricWorldConfig(), {"round.policy.temperature": 0.9})
    assert hotter.start_settings() == {**cfg.start_settings(), "round.policy.temperature": 0.9}


def _write_start(workdir, cfg):
    (workdir / "models" / "policy").mkdir(parents=True)
    (workdir / "models" / "policy" / "config.json").write_text('{"seed": %d}' % cfg.seed)


def test_make_ships_what_the_start_stages_wrote(tmp_path, monkeypatch):
    monkeypatch.setattr(world, "start_stages", lambda workdir, cfg: [
        stages.Stage("warm start: policy", _write_start, (workdir, cfg))])
    out = tmp_path / "out"
    manifest = warm_starts.make("dynamic_rubric", 3, out, tmp_path / "work")
    assert manifest["settings"] == ToyWorldConfig(seed=3).start_settings()
    assert list(manifest["files"]) == ["models/policy/config.json"]
    assert json.loads((out / "models" / "policy" / "config.json").read_text()) == {"seed": 3}
    assert json.loads((out / warm_starts.MANIFEST).read_text())["files"] == manifest["files"]
    assert manifest["made_by"]["command"].startswith(
        "python -m jaxrubric.toy.warm_starts --method dynamic_rubric --seed 3")


@pytest.mark.parametrize("method", sorted(WORLDS))
def test_the_shipped_starts_are_the_defaults(method, tmp_path):
    """The package's starts were made with the current defaults and tokenizer, are whole, and
    small; a default changed since fails here (remake them: `toy/warm_starts.py`)."""
    module, config = WORLDS[method]
    source = warm_starts.asset_dir(method, 0)
    manifest = json.loads((source / warm_starts.MANIFEST).read_text())
    assert manifest["settings"] == json.loads(json.dumps(config().start_settings()))
    tokenizer = jaxrubric.load_tokenizer(task.build_tokenizer(tmp_path / "tokenizer"))
    assert manifest["tokenizer"] == warm_starts.tokenizer_fingerprint(tokenizer)
    for name, digest in manifest["files"].items():
        assert warm_starts.file_hash(source / name) == digest, name
    roles = {name.split("/")[1] for name in manifest["files"] if name.startswith("models/")}
    made = {s.name.removeprefix("warm start: ") for s in module.start_stages(tmp_path, config())
            if s.name.startswith("warm start: ")}
    assert made <= roles
    assert sum((source / name).stat().st_size for name in manifest["files"]) < 5e6


@pytest.mark.slow
def test_every_warm_start_trains_and_saves_its_role(tmp_path):
    """The DynamicRubric world's warm starts and the verifier both worlds use, two tiny steps
    each: the path the world takes without shipped starts (`--from-scratch`)."""
    import jax
    import numpy as np

    from jaxrubric import sharding as shd
    from jaxrubric.toy import world_warm_starts

    cfg = ToyWorldConfig(verifier_steps=2, policy_steps=2, generator_steps=2, sft_batch=4,
                         verifier_items=2, hidden_size=16, num_layers=1,
                         verifier_hidden_size=16, verifier_layers=1)
    workdir, tokenizer = prepare_workdir(tmp_path, cfg)
    mesh = shd.make_mesh({"fsdp": 1}, devices=jax.devices()[:1])
    for role in world_warm_starts.ROLES:
        out = world_warm_starts.warm_start(role, workdir, tokenizer, mesh, cfg)
        assert out == workdir / "models" / role
        history = json.loads((out / "sft_history.json").read_text())
        assert history[-1]["step"] == 2 and np.isfinite(history[-1]["loss"]), (role, history)
        assert jaxrubric.load_pretrained(out).config.hidden_size == 16
