"""What a real run meets: non-finite training never destroys good weights (the update step
skips, the loop stops, a non-finite state is never checkpointed), and one writer per workdir."""

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxrubric.rl import grpo
from jaxrubric.train_loop import (DamagedCheckpointError, NonFiniteError, restore_checkpoint,
                                  run_training)
from jaxrubric.workdir_lock import LOCK_FILE, WorkdirLock, WorkdirLockedError
from helpers import WalkTask

TESTS = str(Path(__file__).resolve().parents[1])  # where the processes below import helpers from


def test_a_non_finite_step_leaves_params_and_optimizer_state_unchanged():
    params = {"w": jnp.arange(3.0)}
    optimizer = optax.adam(0.1)
    opt_state = optimizer.init(params)

    def loss_fn(p, batch):
        return jnp.sum(p["w"] * batch), {}

    new, new_opt, metrics = grpo.grpo_update(params, opt_state, jnp.array([1.0, jnp.nan, 1.0]),
                                             loss_fn, optimizer, num_updates=2)
    np.testing.assert_array_equal(new["w"], params["w"])
    for a, b in zip(jax.tree.leaves(new_opt), jax.tree.leaves(opt_state)):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(metrics["skipped"], [1.0, 1.0])
    # A finite batch moves them, and is not counted as skipped.
    new, _, metrics = grpo.grpo_update(params, opt_state, jnp.ones(3), loss_fn, optimizer)
    assert not np.allclose(new["w"], params["w"]) and float(metrics["skipped"][0]) == 0.0


def test_the_log_ratio_is_bounded_before_exp():
    logp = jnp.array([[0.0, -1.0]])
    far = logp - 200.0  # the policy moved e^200 away from the sampler: exp overflows float32
    loss, metrics = grpo.grpo_loss(logp, far, jnp.array([-1.0]), jnp.ones((1, 2), bool),
                                   ref_logp=far, beta=0.1)
    assert np.isfinite(float(loss)) and np.isfinite(float(metrics["kl"]))
    grads = jax.grad(lambda lp: grpo.grpo_loss(lp, far, jnp.array([-1.0]),
                                               jnp.ones((1, 2), bool))[0])(logp)
    assert np.isfinite(np.asarray(grads)).all()


class _Task:
    """A scalar 'model' whose update reports `skips[r]` skipped updates in round r and whose
    state turns NaN from round `nan_from` on."""

    def __init__(self, skips=(), nan_from=None):
        self.skips, self.nan_from = dict(skips), nan_from

    def init_state(self, rng):
        return {"w": jnp.ones(()), "round": jnp.zeros((), jnp.int32)}

    def abstract_state(self):
        return jax.eval_shape(lambda: self.init_state(None))

    def round_step(self, state, batch, rng):
        r = int(state["round"]) + 1
        w = jnp.nan if self.nan_from is not None and r >= self.nan_from else state["w"] + 1
        return ({"w": jnp.asarray(w, jnp.float32), "round": state["round"] + 1},
                {"policy/skipped_updates": float(self.skips.get(r, 0)), "policy/reward": 0.0})

    def batch(self, position):
        return jnp.zeros(())


def _checkpoints(workdir):
    return sorted(int(d) for d in os.listdir(workdir / "checkpoints") if d.isdigit())


def test_consecutive_skipped_updates_stop_the_run_naming_the_role(tmp_path):
    task = _Task(skips={2: 1, 4: 1, 5: 1, 6: 1})  # one skip, then three in a row
    with pytest.raises(NonFiniteError, match=r"round 6: the policy update was skipped 3 rounds"
                                              r" in a row.*Last checkpoint: round 5"):
        run_training(task, workdir=tmp_path, rounds=10, checkpoint_every=1,
                     max_skipped_rounds=3)
    # The skipped rounds kept the weights finite, so their checkpoints are good ones.
    assert _checkpoints(tmp_path) == [1, 2, 3, 4, 5]


def test_a_non_finite_state_is_never_saved_and_good_checkpoints_stay(tmp_path):
    with pytest.raises(NonFiniteError, match="round 4: the state holds non-finite values; not "
                                             "saved. Last checkpoint: round 3"):
        run_training(_Task(nan_from=4), workdir=tmp_path, rounds=8, checkpoint_every=1,
                     keep_checkpoints=2)
    assert _checkpoints(tmp_path) == [2, 3]


def test_a_second_run_on_a_locked_workdir_is_refused_naming_the_owner(tmp_path):
    held = WorkdirLock.acquire(str(tmp_path))
    try:
        with pytest.raises(WorkdirLockedError, match=f"in use by another training run "
                                                     f"\\(host .* pid {os.getpid()}\\)"):
            run_training(_Task(), workdir=tmp_path, rounds=2, checkpoint_every=1)
        assert not (tmp_path / "checkpoints").exists()
    finally:
        held.release()
    # Released: the run goes, and leaves the workdir unlocked behind it.
    assert run_training(_Task(), workdir=tmp_path, rounds=2, checkpoint_every=1)[
        "final_round"] == 2
    WorkdirLock.acquire(str(tmp_path)).release()


def test_a_stale_lock_of_a_dead_process_is_taken_over_and_reported(tmp_path):
    # A process that takes the lock and dies without releasing it (kill -9 leaves the file).
    code = ("import os, sys; from jaxrubric.workdir_lock import WorkdirLock; "
            "WorkdirLock.acquire(sys.argv[1]); os._exit(0)")
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=True)
    assert "pid" in (tmp_path / LOCK_FILE).read_text()
    lock = WorkdirLock.acquire(str(tmp_path))
    assert lock.stale_owner and "pid" in lock.stale_owner
    lock.release()


def _largest_data_file(checkpoint):
    files = [p for p in (checkpoint / "state").rglob("*") if p.is_file() and "/d/" in str(p)]
    return max(files, key=lambda p: p.stat().st_size)


def _flip_bytes(path):
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 16] = np.random.default_rng(0).integers(0, 256, 16, np.uint8).tobytes()
    path.write_bytes(bytes(data))


DAMAGE = {
    "random bytes in the data": lambda c: _flip_bytes(_largest_data_file(c)),
    "a truncated data file": lambda c: _largest_data_file(c).write_bytes(
        _largest_data_file(c).read_bytes()[:20]),
    "a deleted meta/metadata": lambda c: (c / "meta" / "metadata").unlink(),
}


@pytest.mark.slow
@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_newest_checkpoint_is_moved_aside_and_the_run_falls_back(
        tmp_path, damage, capsys):
    reference = run_training(WalkTask(), workdir=tmp_path / "ref", rounds=6, checkpoint_every=1)
    restored_ref, _ = restore_checkpoint(tmp_path / "ref", WalkTask().abstract_state())
    workdir = tmp_path / "run"
    run_training(WalkTask(), workdir=workdir, rounds=4, checkpoint_every=1)
    DAMAGE[damage](workdir / "checkpoints" / "4")
    capsys.readouterr()
    summary = run_training(WalkTask(), workdir=workdir, rounds=6, checkpoint_every=1)
    said = capsys.readouterr().out
    assert "checkpoint of round 4 is damaged" in said and "resuming from round 3" in said, said
    assert summary["resumed_from"] == 3 and summary["final_round"] == reference["final_round"]
    assert (workdir / "checkpoints" / "4.corrupt").is_dir()  # kept for a person to look at
    state, _ = restore_checkpoint(workdir, WalkTask().abstract_state())
    np.testing.assert_array_equal(state["w"], restored_ref["w"])


_QUIET_RUN = """
import gc, logging, os, sys
sys.path.insert(0, sys.argv[2])
import orbax.checkpoint as ocp
from helpers import WalkTask
from jaxrubric import fault_log
from jaxrubric.train_loop import run_training


class Pending:
    def __await__(self):
        yield


# Orbax's own read coroutines live in its files: this one is named as one of them.
exec(compile("async def read_shard():\\n    try:\\n        await Pending()\\n    finally:\\n"
             "        raise ValueError('unawaited read failed')\\n",
             os.path.join(os.sep, "site-packages", "orbax", "checkpoint", "serialization.py"),
             "exec"))


real_restore = ocp.CheckpointManager.restore


def loud_restore(self, *args, **kwargs):
    # A failed read, with a message on each channel orbax and TensorStore use: their own depend
    # on timing (which reads were still pending when one failed: 0 or 1500 lines, run to run).
    try:
        return real_restore(self, *args, **kwargs)
    except Exception:
        os.write(2, b"E0000 tensorstore.cc:1] C++ log line\\n")
        logging.getLogger("absl").error("absl log line")
        coroutine = read_shard()
        coroutine.send(None)
        cycle = [coroutine]
        cycle.append(cycle)  # collected by the garbage collector, whenever it runs
        raise


ocp.CheckpointManager.restore = loud_restore
fault_log.show_library_output(sys.argv[3] == "--debug")  # as `jaxrubric --debug` sets it
print("--- resuming")
run_training(WalkTask(), workdir=sys.argv[1], rounds=6, checkpoint_every=1)
gc.collect()  # a long run collects sooner or later: whatever was left prints then
print("--- trained")
"""


def _flip_one_bit(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))


LOUD_DAMAGE = {
    "truncated": lambda f: f.write_bytes(f.read_bytes()[:20]),
    "garbage": lambda f: f.write_bytes(np.random.default_rng(1).integers(
        0, 256, f.stat().st_size, np.uint8).tobytes()),
    "a flipped bit": _flip_one_bit,
}


@pytest.fixture(scope="module")
def four_rounds(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("four_rounds")
    run_training(WalkTask(), workdir=workdir, rounds=4, checkpoint_every=1)
    return workdir


@pytest.mark.slow
@pytest.mark.parametrize("damage, debug", [(damage, False) for damage in LOUD_DAMAGE]
                         + [("truncated", True)])
def test_a_handled_damaged_checkpoint_prints_one_line_and_logs_the_details(
        tmp_path, four_rounds, damage, debug):
    """What a terminal shows from the fault to the resume: jaxrubric's lines alone (orbax's
    tracebacks of coroutines that a failed read left unawaited, TensorStore's errors: in the
    workdir's fault_details.log), unless --debug."""
    workdir = tmp_path / "run"
    shutil.copytree(four_rounds, workdir)
    LOUD_DAMAGE[damage](_largest_data_file(workdir / "checkpoints" / "4"))
    out = subprocess.run(
        [sys.executable, "-c", _QUIET_RUN, str(workdir), TESTS,
         "--debug" if debug else ""], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, timeout=300, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert out.returncode == 0 and "--- trained" in out.stdout, out.stdout[-3000:]
    lines = out.stdout.split("--- resuming\n", 1)[1].splitlines()
    resumed = lines.index("resumed from round 3")
    said = lines[:resumed + 1]
    assert said[-2].startswith("resuming from round 3, the newest good checkpoint"), said
    if debug:
        assert "Traceback" in out.stdout and "OUT_OF_RANGE" in out.stdout
    else:
        assert len(said) <= 3 and "Traceback" not in out.stdout, out.stdout
        assert said[0].startswith("checkpoint of round 4 is damaged: ")
        details = (workdir / "fault_details.log").read_text()
        assert details.startswith("=== ") and "checkpoint of round 4: " in details
        if "unreadable" in said[0]:
            for line in ("Error reading", "C++ log line", "absl log line", "Exception ignored",
                         "unawaited read failed"):
                assert line in details, details


def test_without_fallback_a_damaged_checkpoint_stops_the_run(tmp_path):
    run_training(WalkTask(), workdir=tmp_path, rounds=3, checkpoint_every=1)
    _flip_bytes(_largest_data_file(tmp_path / "checkpoints" / "3"))
    with pytest.raises(DamagedCheckpointError, match="round 3 is damaged: content digest mismatch"
                       "|round 3 is damaged: unreadable"):
        run_training(WalkTask(), workdir=tmp_path, rounds=5, checkpoint_every=1, fallback=False)
    with pytest.raises(DamagedCheckpointError, match="checkpoint of round 3 .* is damaged"):
        restore_checkpoint(tmp_path, WalkTask().abstract_state())
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["1", "2", "3"]  # nothing moved


def test_when_no_checkpoint_restores_nothing_is_moved(tmp_path):
    run_training(WalkTask(), workdir=tmp_path, rounds=2, checkpoint_every=1)
    for step in ("1", "2"):
        (tmp_path / "checkpoints" / step / "meta" / "metadata").unlink()
    with pytest.raises(DamagedCheckpointError, match="no checkpoint .* can be restored: round 2: .*"
                                              "round 1: "):
        run_training(WalkTask(), workdir=tmp_path, rounds=4, checkpoint_every=1)
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["1", "2"]


_WALK_RUN = """
import sys, time
sys.path.insert(0, sys.argv[3])
import jax
from helpers import WalkTask
from jaxrubric.train_loop import run_training


class Slow(WalkTask):
    def round_step(self, state, batch, rng):
        time.sleep(float(sys.argv[2]))
        return super().round_step(state, batch, rng)


run_training(Slow(), workdir=sys.argv[1], rounds=8, checkpoint_every=1, keep_checkpoints=3)
"""


@pytest.mark.slow
def test_kill_9_mid_run_then_resume_equals_the_uninterrupted_run(tmp_path):
    """SIGKILL leaves whatever was being written half done (and the workdir's lock file
    behind); the rerun discards the half-written checkpoint, takes over the stale lock and ends
    bit-identical to a run that was never interrupted."""
    run_training(WalkTask(), workdir=tmp_path / "ref", rounds=8, checkpoint_every=1,
                 keep_checkpoints=3)
    workdir = tmp_path / "run"
    process = subprocess.Popen([sys.executable, "-c", _WALK_RUN, str(workdir), "0.3", TESTS])
    try:
        deadline = time.monotonic() + 120
        while not (workdir / "checkpoints" / "3").is_dir():
            assert process.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        process.kill()
        process.wait()
    assert process.returncode == -9
    summary = run_training(WalkTask(), workdir=workdir, rounds=8, checkpoint_every=1,
                           keep_checkpoints=3)
    assert summary["resumed_from"] is not None and summary["final_round"] == 8
    want, _ = restore_checkpoint(tmp_path / "ref", WalkTask().abstract_state())
    got, _ = restore_checkpoint(workdir, WalkTask().abstract_state())
    np.testing.assert_array_equal(got["w"], want["w"])
