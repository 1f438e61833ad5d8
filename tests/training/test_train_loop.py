"""The host loop on a toy task: checkpoints, exact resume, crash and SIGTERM, TensorBoard, rubric
cards and the watch."""

import json
import os
import signal
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding, PartitionSpec
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from jaxrubric import sharding as shd
from jaxrubric.logging_utils import CardLog
from jaxrubric.train_loop import (ConfigMismatchError, read_eval_history, restore_checkpoint,
                                  run_training)
from jaxrubric.watch import WatchSettings

DIM, BATCH = 16, 32
MESH = shd.make_mesh({"fsdp": -1})
REPLICATED = NamedSharding(MESH, PartitionSpec())
PARAM_SHARDINGS = {"w": NamedSharding(MESH, PartitionSpec("fsdp")), "b": REPLICATED}
OPTIMIZER = optax.adam(0.05)


def _init(rng):
    params = {"w": 0.1 * jax.random.normal(rng, (DIM,)), "b": jnp.zeros(())}
    return {"params": params, "opt_state": OPTIMIZER.init(params),
            "step": jnp.zeros((), jnp.int32)}


def _state_shardings():
    abstract = jax.eval_shape(_init, jax.random.key(0))
    adam, rest = jax.tree.map(lambda _: REPLICATED, abstract["opt_state"])
    adam = adam._replace(mu=PARAM_SHARDINGS, nu=PARAM_SHARDINGS)  # moments mirror the params
    return {"params": PARAM_SHARDINGS, "opt_state": (adam, rest), "step": REPLICATED}


STATE_SHARDINGS = _state_shardings()
INIT = jax.jit(_init, out_shardings=STATE_SHARDINGS)


def _round(state, batch, rng):
    x, y = batch
    keep = jax.random.bernoulli(rng, 0.8, x.shape)  # the round's rng enters the update

    def loss_fn(params):
        return jnp.mean(((x * keep) @ params["w"] + params["b"] - y) ** 2)

    loss, grads = jax.value_and_grad(loss_fn)(state["params"])
    updates, opt_state = OPTIMIZER.update(grads, state["opt_state"], state["params"])
    new = {"params": optax.apply_updates(state["params"], updates), "opt_state": opt_state,
           "step": state["step"] + 1}
    return new, {"loss": loss, "policy/reward": -loss, "residuals": (x @ new["params"]["w"])[:4]}


ROUND = jax.jit(_round, donate_argnums=0, out_shardings=(STATE_SHARDINGS, REPLICATED))


class ToyTask:
    """Linear regression with Adam; `crash_at` / `sigterm_at` hit the n-th round of this task."""

    def __init__(self, crash_at=None, sigterm_at=None):
        self.crash_at, self.sigterm_at, self.calls = crash_at, sigterm_at, 0

    def init_state(self, rng):
        return INIT(rng)

    def abstract_state(self):
        return jax.eval_shape(INIT, jax.random.key(0))

    def round_step(self, state, batch, rng):
        self.calls += 1
        if self.calls == self.crash_at:
            raise RuntimeError("boom")
        if self.calls == self.sigterm_at:
            os.kill(os.getpid(), signal.SIGTERM)
        return ROUND(state, batch, rng)

    def batch(self, position):
        gen = np.random.default_rng([1234, position])
        x = gen.normal(size=(BATCH, DIM)).astype(np.float32)
        y = (x @ np.linspace(-1, 1, DIM) + 0.5 + 0.01 * gen.normal(size=BATCH)).astype(np.float32)
        return jax.device_put((x, y), NamedSharding(MESH, PartitionSpec("fsdp")))

    def text_samples(self, state, batch, metrics):
        return {"sample": f"residuals `{np.round(metrics['residuals'], 3).tolist()}`"}


class Result(NamedTuple):
    """A round's result as the co-evolution tasks return it (`methods.data.RoundResult`)."""

    scalars: dict
    outputs: dict


class ResultTask(ToyTask):
    """The toy task returning its scalars beside outputs that stay on the device; records every
    output array it returned."""

    def __init__(self):
        super().__init__()
        self.outputs = []

    def round_step(self, state, batch, rng):
        state, metrics = super().round_step(state, batch, rng)
        outputs = {"residuals": metrics.pop("residuals")}
        self.outputs.append(outputs["residuals"])
        return state, Result(metrics, outputs)

    def text_samples(self, state, batch, result):
        return super().text_samples(state, batch, result.outputs)


def _run(workdir, rounds, task=None, **kwargs):
    kwargs = {"seed": 7, "checkpoint_every": 2, "log_every": 2, **kwargs}
    return run_training(task or ToyTask(), workdir=workdir, rounds=rounds, **kwargs)


def _checkpoints(workdir):
    return sorted(int(d) for d in os.listdir(workdir / "checkpoints") if d.isdigit())


def _restore(workdir, round_=None):
    return restore_checkpoint(workdir, ToyTask().abstract_state(), round_)


def _assert_same_state(a, b):
    leaves_a, tree_a = jax.tree.flatten(a)
    leaves_b, tree_b = jax.tree.flatten(b)
    assert tree_a == tree_b
    for x, y in zip(leaves_a, leaves_b, strict=True):
        assert x.dtype == y.dtype and x.sharding == y.sharding
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y), strict=True)


def _events(workdir):
    acc = EventAccumulator(str(workdir / "tensorboard"),
                           size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("uninterrupted")
    return workdir, _run(workdir, 5)


def test_uninterrupted_run_checkpoints_and_summary(uninterrupted):
    workdir, summary = uninterrupted
    assert _checkpoints(workdir) == [2, 4, 5]  # every 2nd round, plus the final one
    assert summary["final_round"] == 5 and summary["resumed_from"] is None
    assert not summary["preempted"]
    assert set(summary["metrics"]) == {"loss", "policy/reward"}  # scalars only
    state, meta = _restore(workdir)
    assert int(state["step"]) == 5
    assert meta["round"] == 5 and meta["position"] == 5
    assert jax.random.wrap_key_data(np.asarray(meta["rng_key_data"], np.uint32),
                                    impl=meta["rng_impl"]) == jax.random.key(7)
    assert meta["metrics"] == summary["metrics"]


def test_resume_equals_uninterrupted_run(tmp_path, uninterrupted, capsys):
    first = _run(tmp_path, 3)
    assert first["final_round"] == 3 and _checkpoints(tmp_path) == [2, 3]
    capsys.readouterr()
    second = _run(tmp_path, 5)
    assert "resumed from round 3" in capsys.readouterr().out
    assert second["resumed_from"] == 3 and second["final_round"] == 5
    assert second["metrics"] == uninterrupted[1]["metrics"]
    _assert_same_state(_restore(tmp_path)[0], _restore(uninterrupted[0])[0])

    again = _run(tmp_path, 4)
    assert "nothing to do" in capsys.readouterr().out
    assert again["final_round"] == 5 and again["metrics"] == second["metrics"]
    assert _checkpoints(tmp_path) == [2, 3, 4, 5]


def test_saved_state_survives_donation(tmp_path):
    """The async save of round 2 must hold round 2's state although round 3 donates it."""
    _run(tmp_path, 3)
    task, key = ToyTask(), jax.random.key(7)
    state = task.init_state(jax.random.fold_in(key, 0))
    for round_ in (1, 2):
        state, _ = task.round_step(state, task.batch(round_ - 1), jax.random.fold_in(key, round_))
    _assert_same_state(_restore(tmp_path, 2)[0], state)


def test_tensorboard_scalars_and_text(uninterrupted):
    workdir, summary = uninterrupted
    acc = _events(workdir)
    loss = acc.Scalars("loss")
    assert [e.step for e in loss] == [2, 4, 5]  # every log_every rounds and the final round
    assert loss[-1].value == pytest.approx(summary["metrics"]["loss"], rel=1e-6)
    assert [e.step for e in acc.Scalars("time/round_s")] == [2, 4, 5]
    assert "residuals" not in acc.Tags()["scalars"]
    texts = acc.Tensors("sample")
    assert [e.step for e in texts] == [2, 4, 5]
    assert texts[0].tensor_proto.string_val[0].decode().startswith("residuals `[")


def test_crash_keeps_checkpoint_and_resume_drops_orphaned_logs(tmp_path, uninterrupted):
    with pytest.raises(RuntimeError, match="boom"):
        _run(tmp_path, 5, ToyTask(crash_at=4), log_every=1)
    assert _checkpoints(tmp_path) == [2]  # round 3 was logged but not saved
    summary = _run(tmp_path, 5, log_every=1)
    assert summary["resumed_from"] == 2
    _assert_same_state(_restore(tmp_path)[0], _restore(uninterrupted[0])[0])
    assert [e.step for e in _events(tmp_path).Scalars("loss")] == [1, 2, 3, 4, 5]


def test_sigterm_saves_the_round_and_stops(tmp_path, uninterrupted):
    previous = signal.getsignal(signal.SIGTERM)
    summary = _run(tmp_path, 5, ToyTask(sigterm_at=2), checkpoint_every=10)
    assert summary["preempted"] and summary["final_round"] == 2
    assert _checkpoints(tmp_path) == [2]
    assert signal.getsignal(signal.SIGTERM) is previous  # handler restored
    assert _run(tmp_path, 5)["resumed_from"] == 2
    _assert_same_state(_restore(tmp_path)[0], _restore(uninterrupted[0])[0])


def test_keep_checkpoints_and_eval(tmp_path):
    calls = []

    def eval_fn(state, round_):
        calls.append(round_)
        return {"w_norm": jnp.linalg.norm(state["params"]["w"]), "eval/step": state["step"]}

    summary = _run(tmp_path, 5, checkpoint_every=1, keep_checkpoints=2, eval_fn=eval_fn,
                   eval_every=2)
    assert _checkpoints(tmp_path) == [4, 5]
    assert calls == [0, 2, 4, 5]  # a fresh run is evaluated before its first round too
    assert summary["eval"]["eval/step"] == 5 and "eval/w_norm" in summary["eval"]
    assert [e.step for e in _events(tmp_path).Scalars("eval/w_norm")] == [0, 2, 4, 5]
    history = read_eval_history(tmp_path)
    assert [h["round"] for h in history] == [0, 2, 4, 5]
    assert history[-1]["eval/step"] == 5


def test_config_change_is_refused(tmp_path, capsys):
    _run(tmp_path, 1, config={"optim": {"lr": 0.05}})
    with pytest.raises(ConfigMismatchError, match="config.optim.lr"):
        _run(tmp_path, 2, config={"optim": {"lr": 0.1}})
    with pytest.raises(ConfigMismatchError, match="seed"):
        _run(tmp_path, 2, config={"optim": {"lr": 0.05}}, seed=8)
    summary = _run(tmp_path, 2, config={"optim": {"lr": 0.1}}, allow_config_change=True)
    assert summary["final_round"] == 2 and "resuming anyway" in capsys.readouterr().out


def test_keys_added_since_at_their_defaults_are_not_a_change(tmp_path):
    """A run checkpointed before a key existed resumes when the key has its default now; the
    same key at another value is still a change."""
    defaults = {"optim": {"lr": 0.1, "warmup": 0}}
    _run(tmp_path, 1, config={"optim": {"lr": 0.05}})
    with pytest.raises(ConfigMismatchError, match="config.optim.warmup"):
        _run(tmp_path, 2, config={"optim": {"lr": 0.05, "warmup": 3}}, config_defaults=defaults)
    summary = _run(tmp_path, 2, config={"optim": {"lr": 0.05, "warmup": 0}},
                   config_defaults=defaults)
    assert summary["final_round"] == 2


def test_rejects_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="checkpoint_every"):
        _run(tmp_path, 3, checkpoint_every=0)


def test_round_results_fetch_only_their_scalars(tmp_path, uninterrupted, monkeypatch):
    """A task returning `(state, result)` with `result.scalars` and `result.outputs`: the loop
    fetches the scalars every round, the outputs never (a text sample reads what it writes)."""
    fetched = []
    device_get = jax.device_get
    monkeypatch.setattr(jax, "device_get", lambda tree: fetched.append(tree) or device_get(tree))
    task = ResultTask()
    summary = _run(tmp_path, 5, task)
    monkeypatch.undo()
    assert summary["metrics"] == uninterrupted[1]["metrics"]
    assert len(task.outputs) == 5
    assert sum(isinstance(t, dict) and "loss" in t for t in fetched) >= 5  # each round's scalars
    returned = {id(x) for x in task.outputs}
    assert not returned & {id(x) for tree in fetched for x in jax.tree.leaves(tree)}
    texts = _events(tmp_path).Tensors("sample")
    assert [e.step for e in texts] == [2, 4, 5]
    assert texts[-1].tensor_proto.string_val[0] == _events(uninterrupted[0]).Tensors(
        "sample")[-1].tensor_proto.string_val[0]


class CardTask(ResultTask):
    """`ResultTask` with rubric cards: a card reads the round's outputs, as the co-evolution
    task's does."""

    def cards(self, state, batch, result, round_):
        residuals = np.round(jax.device_get(result.outputs["residuals"]), 3).tolist()
        record = {"round": round_, "row": 0, "residuals": residuals}
        return CardLog([record], {"cards/prompt_0": str(residuals)}, (["round"], [[round_]]))


def test_outputs_leave_the_device_only_on_card_rounds(tmp_path, monkeypatch):
    fetched = []
    device_get = jax.device_get
    monkeypatch.setattr(jax, "device_get", lambda tree: fetched.append(tree) or device_get(tree))
    task = CardTask()
    _run(tmp_path, 5, task, card_every=2)
    monkeypatch.undo()
    ids = {id(x) for tree in fetched for x in jax.tree.leaves(tree)}
    assert [id(x) in ids for x in task.outputs] == [False, True, False, True, False]
    lines = [json.loads(line) for line in open(tmp_path / "cards.jsonl", encoding="utf-8")]
    assert [line["round"] for line in lines] == [2, 4]
    assert [e.step for e in _events(tmp_path).Tensors("cards/prompt_0")] == [2, 4]
    # Every logged round's scalars also go to metrics.jsonl (what `jaxrubric inspect` reads).
    logged = [json.loads(line) for line in open(tmp_path / "metrics.jsonl", encoding="utf-8")]
    assert [line["round"] for line in logged] == [2, 4, 5]
    assert logged[-1]["loss"] == pytest.approx(_events(tmp_path).Scalars("loss")[-1].value)


@pytest.mark.parametrize("stop", [False, True])
def test_the_watch_warns_when_the_reward_rises_and_the_gold_metric_falls(tmp_path, capsys,
                                                                         stop):
    """The toy task's reward (-loss) rises every round; here its gold metric falls."""
    summary = _run(tmp_path, 5, eval_fn=lambda state, round_: {"quality": 1.0 - 0.1 * round_},
                   eval_every=1, watch=WatchSettings(window=3, stop=stop))
    out = capsys.readouterr().out
    assert out.count("watch: round 3:") == 1 and "eval/quality fell" in out
    alarms = [json.loads(line) for line in open(tmp_path / "watch.jsonl", encoding="utf-8")]
    assert [(a["round"], a["kind"]) for a in alarms][0] == (3, "reward_hacking")
    assert _events(tmp_path).Scalars("watch/reward_hacking")[0].step == 3
    if stop:  # saved and stopped at the alarm's round
        assert summary["final_round"] == 3 and summary["preempted"]
        assert _checkpoints(tmp_path)[-1] == 3 and "watch.stop: saved" in out
    else:
        assert summary["final_round"] == 5 and len(summary["alarms"]) == 3  # rounds 3, 4, 5


def test_the_watch_is_quiet_when_the_gold_metric_rises_too(tmp_path, capsys):
    summary = _run(tmp_path, 5, eval_fn=lambda state, round_: {"quality": 0.1 * round_},
                   eval_every=1, watch=WatchSettings(window=3))
    assert summary["alarms"] == [] and "watch:" not in capsys.readouterr().out
    assert not (tmp_path / "watch.jsonl").exists()
