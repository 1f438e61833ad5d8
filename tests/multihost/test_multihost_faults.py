"""Faults of a multi-process run as a TPU pod meets them, with two CPU processes on this machine
(`fault_worker.py`, the `jax.distributed` set-up of `test_multihost.py`): a preemption notice
to one host, a lost host, a host lost while writing a checkpoint, a checkpoint file damaged
where only one host reads it. Every relaunch must end bit-identical to an uninterrupted run:
the same state digest at every round both saved, the same metrics."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import start_processes, stopped_after, wait_processes
from test_multihost import ENV_VARS, _free_port
from xla_flags import COLLECTIVE_TIMEOUT, with_devices

from jaxrubric.peer_watch import LOST_PEER_EXIT

pytestmark = pytest.mark.slow  # every test launches two training processes

WORKER = Path(__file__).with_name("fault_worker.py")
ROUNDS = 6
# JAXRUBRIC_HEARTBEAT_TIMEOUT of these runs: 10 s unless set (to measure another, e.g. the
# default 60 s).
HEARTBEAT_TIMEOUT_S = float(os.environ.get("JAXRUBRIC_HEARTBEAT_TIMEOUT", 10))
# A survivor exits within the timeout and two polls of the watch (timeout / 4, at most 5 s
# apart), plus the time its thread waits for a core on a loaded 2-core machine.
EXIT_BOUND_S = HEARTBEAT_TIMEOUT_S + 2 * min(5, HEARTBEAT_TIMEOUT_S / 4) + 10
TIMEOUT_S = 240  # one launch: two processes importing jax and compiling side by side


def _launch(workdir: Path, logs: Path, *options: str, rounds: int = ROUNDS
            ) -> list[subprocess.Popen]:
    """Both processes of one launch, 2 CPU devices each."""
    logs.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "XLA_FLAGS": f"{with_devices(2)} {COLLECTIVE_TIMEOUT}",
           "JAX_PLATFORMS": "cpu", "JAXRUBRIC_HEARTBEAT_TIMEOUT": str(HEARTBEAT_TIMEOUT_S)}
    for name in ENV_VARS:
        env.pop(name, None)
    coordinator = f"127.0.0.1:{_free_port()}"
    return start_processes(
        [[sys.executable, str(WORKER), "--workdir", str(workdir), "--rounds", str(rounds),
          "--report", str(logs / f"report{i}.json"), "--coordinator", coordinator,
          "--num-processes", "2", "--process-id", str(i), *options] for i in range(2)],
        env, logs)


def _run(workdir: Path, logs: Path, *options: str, rounds: int = ROUNDS) -> list[dict]:
    """One launch to its end (both exit 0): each process's summary."""
    wait_processes(_launch(workdir, logs, *options, rounds=rounds), logs, TIMEOUT_S)
    return [json.loads((logs / f"report{i}.json").read_text()) for i in range(2)]


def _wait_for(path: Path, processes: list[subprocess.Popen]) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not path.exists():
        assert all(p.poll() is None for p in processes), "a process ended early"
        assert time.monotonic() < deadline, f"no {path} after {TIMEOUT_S} s"
        time.sleep(0.05)


def _saved(workdir: Path) -> dict[int, dict]:
    """The meta of every complete checkpoint (orbax renames a checkpoint to its round's number
    only once every process has written its part)."""
    folder = workdir / "checkpoints"
    return {int(d.name): json.loads((d / "meta" / "metadata").read_text())
            for d in folder.iterdir() if d.name.isdigit()}


def _assert_equal_to(reference: Path, workdir: Path) -> None:
    """Every checkpoint of `workdir` holds the state of the same round of `reference`, and the
    last one the same metrics."""
    expected, saved = _saved(reference), _saved(workdir)
    assert saved and max(saved) == ROUNDS
    for round_, meta in saved.items():
        assert meta["digest"] == expected[round_]["digest"], f"round {round_}"
    assert saved[ROUNDS]["metrics"] == expected[ROUNDS]["metrics"]


def _log(logs: Path, process: int) -> str:
    return (logs / f"process{process}.log").read_text()


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """The workdir of an uninterrupted run, with a checkpoint of every round."""
    folder = tmp_path_factory.mktemp("reference")
    reports = _run(folder / "run", folder / "logs")
    assert [r["final_round"] for r in reports] == [ROUNDS, ROUNDS]
    assert sorted(_saved(folder / "run")) == list(range(1, ROUNDS + 1))
    return folder / "run"


def _kill_and_time(processes: list[subprocess.Popen], victim: int) -> tuple[int, float]:
    """SIGKILL to `victim`: the other's exit status and how long after the kill it came."""
    processes[victim].kill()
    killed = time.monotonic()
    try:
        code = processes[1 - victim].wait(timeout=EXIT_BOUND_S + 60)
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
            process.wait()
    return code, time.monotonic() - killed


def test_a_preemption_notice_to_one_process_stops_all_at_one_round(tmp_path, reference):
    """SIGTERM to process 1 alone: both agree to stop after the same round, save it whole (a
    round that is not a multiple of checkpoint_every: saved because of the notice), exit 0;
    the relaunch ends as the uninterrupted run."""
    workdir, logs = tmp_path / "run", tmp_path / "logs"
    processes = _launch(workdir, logs, "--checkpoint-every", "4", "--round-seconds", "1")
    _wait_for(workdir / "tensorboard", processes)  # the loop has started: rounds take 1 s
    time.sleep(1.5)
    processes[1].send_signal(signal.SIGTERM)
    wait_processes(processes, logs, TIMEOUT_S)
    reports = [json.loads((logs / f"report{i}.json").read_text()) for i in range(2)]
    assert [r["preempted"] for r in reports] == [True, True]
    stopped = reports[0]["final_round"]
    assert reports[1]["final_round"] == stopped < ROUNDS
    assert sorted(os.listdir(workdir / "checkpoints")) == sorted(
        str(r) for r in {4, stopped} if r <= stopped)  # nothing half-written beside it
    assert _saved(workdir)[stopped]["digest"] == _saved(reference)[stopped]["digest"]
    assert f"SIGTERM: saved the checkpoint of round {stopped}, stopping" in _log(logs, 0)

    reports = _run(workdir, tmp_path / "relaunch", "--checkpoint-every", "4")
    assert [r["resumed_from"] for r in reports] == [stopped, stopped]
    _assert_equal_to(reference, workdir)


@pytest.mark.parametrize("victim", [1, 0])
def test_a_lost_process_ends_the_others_in_bounded_time(tmp_path, reference, victim):
    """SIGKILL to one process: the other exits within the bound, naming it in one line (process
    1 lost: the watch; process 0 lost, which hosts jax's coordination service: jax ends the
    survivor at once with its own message). No checkpoint is left half-written under a round's
    name, and the relaunch resumes from the last complete one and ends as the uninterrupted
    run."""
    workdir, logs = tmp_path / "run", tmp_path / "logs"
    processes = _launch(workdir, logs, "--round-seconds", "0.5")
    _wait_for(workdir / "checkpoints" / "2", processes)
    code, seconds = _kill_and_time(processes, victim)
    print(f"survivor of a lost process {victim} exited {code} after {seconds:.1f} s")
    assert seconds < EXIT_BOUND_S
    said = _log(logs, 1 - victim)
    if victim == 1:
        assert code == LOST_PEER_EXIT
        lines = [line for line in said.splitlines() if "heartbeat" in line]
        assert len(lines) == 1 and re.fullmatch(
            r"jaxrubric: process 1 of 2 sent no heartbeat for \d+ s \(host lost, killed or "
            r"hung\); process 0 stops too .*", lines[0]), said[-2000:]
        assert "Traceback" not in said
    else:
        assert code != 0 and "coordination service" in said
    complete = _saved(workdir)
    for round_, meta in complete.items():
        assert meta["digest"] == _saved(reference)[round_]["digest"], f"round {round_}"

    reports = _run(workdir, tmp_path / "relaunch")
    assert [r["resumed_from"] for r in reports] == [max(complete)] * 2
    _assert_equal_to(reference, workdir)


def test_a_process_lost_while_writing_a_checkpoint(tmp_path, reference):
    """SIGKILL to process 1 while it writes its part of round 4's checkpoint: process 0 exits
    within the bound, round 4 is never marked complete, and the relaunch falls back to round 3
    on both processes alike."""
    workdir, logs = tmp_path / "run", tmp_path / "logs"
    processes = _launch(workdir, logs, "--hold-save", "4")
    _wait_for(workdir / "holding", processes)
    code, seconds = _kill_and_time(processes, 1)
    print(f"survivor of a process lost mid-write exited {code} after {seconds:.1f} s")
    assert code == LOST_PEER_EXIT and seconds < EXIT_BOUND_S
    assert sorted(_saved(workdir)) == [1, 2, 3]

    reports = _run(workdir, tmp_path / "relaunch")
    assert [r["resumed_from"] for r in reports] == [3, 3]
    _assert_equal_to(reference, workdir)


def test_a_shard_damaged_where_one_process_reads_it(tmp_path, reference):
    """A run stopped after round 5 whose checkpoint has process 1's data file truncated: only
    process 1's read fails, yet both call it damaged and resume from round 4 (each acting
    alone, they would resume from different rounds, or hang in a collective the other skips)."""
    run = stopped_after(reference, tmp_path / "run", ROUNDS - 1)
    newest = run / "checkpoints" / str(ROUNDS - 1)
    data = max((newest / "state" / "ocdbt.process_1" / "d").iterdir(),
               key=lambda p: p.stat().st_size)
    data.write_bytes(data.read_bytes()[:20])
    logs = tmp_path / "logs"
    reports = _run(run, logs)
    assert [r["resumed_from"] for r in reports] == [ROUNDS - 2] * 2
    said = _log(logs, 0)
    assert (f"checkpoint of round {ROUNDS - 1} is damaged: unreadable on process 1 of 2" in said
            and f"resuming from round {ROUNDS - 2}" in said), said[-2000:]
    assert "OUT_OF_RANGE" in (run / "fault_details.process1.log").read_text()
    assert (run / "checkpoints" / f"{ROUNDS - 1}.corrupt").is_dir()
    _assert_equal_to(reference, run)
