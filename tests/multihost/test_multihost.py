"""Multi-process runs: `jaxrubric.distributed` settings, and two CPU processes (4 devices each)
training exactly like one process with 8 devices."""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import jax
import pytest
from helpers import CONFIGS, flat, start_processes, update_error, wait_processes
from xla_flags import with_devices

from jaxrubric import distributed
from jaxrubric.config import load_config
from jaxrubric.distributed import DistributedConfigError, resolve
from jaxrubric.roles import Role
from jaxrubric.train import CoevolveTask, train
from jaxrubric.train_loop import restore_checkpoint

WORKER = Path(__file__).with_name("multihost_worker.py")
CONFIG = CONFIGS / "tiny_dynamic_rubric.py"
ENV_VARS = (distributed.COORDINATOR_ENV, distributed.NUM_PROCESSES_ENV, distributed.PROCESS_ID_ENV,
            "TPU_WORKER_HOSTNAMES", "TPU_PROCESS_ADDRESSES", "MEGASCALE_COORDINATOR_ADDRESS",
            "MEGASCALE_NUM_SLICES")


# ------------------------------------------------------------------ settings (no processes)
def test_nothing_set_is_a_single_process():
    assert resolve(environ={}) is None
    assert resolve(environ={"TPU_WORKER_HOSTNAMES": "only-host"}) is None  # a one-host slice


def test_settings_come_from_the_environment_and_arguments_win():
    env = {"JAXRUBRIC_COORDINATOR_ADDRESS": "10.0.0.1:1234", "JAXRUBRIC_NUM_PROCESSES": "4",
           "JAXRUBRIC_PROCESS_ID": "3"}
    assert resolve(environ=env) == {"coordinator_address": "10.0.0.1:1234", "num_processes": 4,
                                    "process_id": 3}
    assert resolve("[::1]:99", 2, 0, local_device_ids=[1], environ=env) == {
        "coordinator_address": "[::1]:99", "num_processes": 2, "process_id": 0,
        "local_device_ids": [1]}


@pytest.mark.parametrize("env, missing", [
    ({"JAXRUBRIC_COORDINATOR_ADDRESS": "h:1"}, "--num-processes (JAXRUBRIC_NUM_PROCESSES) and "
                                               "--process-id (JAXRUBRIC_PROCESS_ID)."),
    ({"JAXRUBRIC_NUM_PROCESSES": "2", "JAXRUBRIC_PROCESS_ID": "0"},
     "--coordinator (JAXRUBRIC_COORDINATOR_ADDRESS)."),
])
def test_partial_settings_name_what_is_missing(env, missing):
    with pytest.raises(DistributedConfigError, match=re.escape(f"missing: {missing} ")):
        resolve(environ=env)


@pytest.mark.parametrize("kwargs, env, message", [
    ({}, {"JAXRUBRIC_NUM_PROCESSES": "two"}, "JAXRUBRIC_NUM_PROCESSES='two' is not an integer"),
    ({"coordinator_address": "localhost", "num_processes": 2, "process_id": 0}, {},
     "'localhost' must be HOST:PORT"),
    ({"coordinator_address": "h:1", "num_processes": 2, "process_id": 2}, {},
     r"process id 2 is not in 0\.\.1"),
    ({"coordinator_address": "h:1", "num_processes": 0, "process_id": 0}, {},
     "the number of processes must be >= 1, got 0"),
    ({"local_device_ids": [0]}, {}, "local_device_ids is only used by a multi-process run"),
])
def test_malformed_settings_are_refused(kwargs, env, message):
    with pytest.raises(DistributedConfigError, match=message):
        resolve(**kwargs, environ=env)


def test_auto_and_tpu_pods_let_jax_detect_the_rest():
    assert resolve("auto", environ={}) == {}
    assert resolve(environ={"JAXRUBRIC_COORDINATOR_ADDRESS": "auto",
                            "JAXRUBRIC_PROCESS_ID": "1"}) == {"process_id": 1}
    for env in ({"TPU_WORKER_HOSTNAMES": "t-0,t-1"}, {"TPU_PROCESS_ADDRESSES": "a:1,b:1"},
                {"MEGASCALE_COORDINATOR_ADDRESS": "10.0.0.2"}, {"MEGASCALE_NUM_SLICES": "2"}):
        assert resolve(environ=env) == {}, env


@pytest.fixture
def fake_jax_distributed(monkeypatch):
    """Records `jax.distributed.initialize` calls instead of starting a runtime; clears the
    environment of multi-process settings."""
    for name in (*ENV_VARS, distributed.HEARTBEAT_TIMEOUT_ENV):
        monkeypatch.delenv(name, raising=False)
    calls: list[dict] = []
    monkeypatch.setattr(jax.distributed, "is_initialized", lambda: bool(calls))
    monkeypatch.setattr(jax.distributed, "initialize", lambda **kwargs: calls.append(kwargs))
    return calls


def test_initialize_calls_jax_only_when_asked(fake_jax_distributed, monkeypatch):
    assert distributed.initialize() is False
    assert fake_jax_distributed == []
    monkeypatch.setenv("JAXRUBRIC_COORDINATOR_ADDRESS", "10.0.0.1:1234")
    monkeypatch.setenv("JAXRUBRIC_NUM_PROCESSES", "2")
    monkeypatch.setenv("JAXRUBRIC_PROCESS_ID", "1")
    assert distributed.initialize() is True
    assert distributed.initialize() is True  # already joined: not called twice
    assert fake_jax_distributed == [
        {"coordinator_address": "10.0.0.1:1234", "num_processes": 2, "process_id": 1,
         "heartbeat_timeout_seconds": 121}]  # twice jaxrubric's 60 s: a backstop


def test_initialize_selects_gloo_where_jax_has_no_cpu_collectives(fake_jax_distributed):
    previous = jax.config.jax_cpu_collectives_implementation
    jax.config.update("jax_cpu_collectives_implementation", None)
    try:
        assert distributed.initialize("auto")
        assert jax.config.jax_cpu_collectives_implementation == "gloo"
    finally:
        jax.config.update("jax_cpu_collectives_implementation", previous)


def test_command_line_flags(fake_jax_distributed):
    parser = argparse.ArgumentParser()
    distributed.add_arguments(parser)
    assert distributed.initialize_from_args(parser.parse_args([])) is False
    args = parser.parse_args(["--coordinator", "h:7", "--num-processes", "3", "--process-id", "2"])
    assert distributed.initialize_from_args(args) is True
    assert fake_jax_distributed == [{"coordinator_address": "h:7", "num_processes": 3,
                                     "process_id": 2, "heartbeat_timeout_seconds": 121}]


def test_the_heartbeat_timeout_comes_from_the_environment(fake_jax_distributed, monkeypatch):
    monkeypatch.setenv(distributed.HEARTBEAT_TIMEOUT_ENV, "10")
    assert distributed.initialize("auto")
    assert fake_jax_distributed == [{"heartbeat_timeout_seconds": 21}]
    for bad in ("soon", "0", "-5"):
        with pytest.raises(DistributedConfigError, match=f"JAXRUBRIC_HEARTBEAT_TIMEOUT='{bad}' "
                                                         "must be a positive number of seconds"):
            distributed.heartbeat_timeout({distributed.HEARTBEAT_TIMEOUT_ENV: bad})


# ------------------------------------------------------------------ two real processes
# Soft verdicts: an untrained verifier says "no" to everything, so 0/1 verdicts would give
# equal rewards, zero advantages and gradients of rounding noise only, which Adam (an update
# of g / (|g| + eps)) turns into full-size steps of random sign: nothing to compare. `no_std`:
# the generator's rewards in a group can be as close as 3e-7, and dividing by their std makes
# rounding decide the sign of the advantage (measured: 20% apart instead of 0.8%).
OVERRIDES = ["rounds=2", "round.response_tokens=8", "rubric.max_items=2",
             "round.soft_verdicts=True", "round.policy.advantage_mode=no_std",
             "round.generator.advantage_mode=no_std"]
# fp32 agreement of the two runs, relative to each model's update. The all-reduces of gloo and of
# the in-process CPU collectives sum in different orders, so rewards differ in the last bit
# (~3e-8). The policy's rewards spread by ~1.5e-3 within a prompt's group (measured 5e-5); the
# untrained verifier's p_yes ~ 0.5 leaves the generator's rewards within ~1e-5 of each other
# (~300 ulp), so its advantages carry ~3e-3 of rounding (measured 8e-3). A wrong batch row or
# a lost reduction changes either update by its whole size.
UPDATE_RTOL = {Role.POLICY: 1e-3, Role.GENERATOR: 5e-2}
TIMEOUT_S = 900  # both workers, compiling side by side with the reference on 2 CPU cores
# Metrics that are sums of many well-conditioned terms; losses of advantages that average to
# zero (pg_loss, logprob_gap) are rounding noise and left out.
COMPARED_METRICS = ("policy/reward", "policy/reward_std_in_group", "policy/entropy",
                    "policy/grad_norm", "policy/kl", "generator/reward", "generator/entropy",
                    "generator/grad_norm", "generator/kl", "verifier/yes_rate", "rubric/items",
                    "rubric/tokens", "rubric/valid_rate", "policy/response_length")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_workers(workdir: Path, logs: Path, count: int = 2) -> list[subprocess.Popen]:
    """`count` worker processes, 4 CPU devices each, meeting at a coordinator on localhost."""
    env = {**os.environ, "XLA_FLAGS": with_devices(4),
           "JAX_PLATFORMS": "cpu"}
    for name in ENV_VARS:
        env.pop(name, None)
    coordinator = f"127.0.0.1:{_free_port()}"
    return start_processes(
        [[sys.executable, str(WORKER), "--workdir", str(workdir),
          "--report", str(logs / f"report{i}.json"), "--coordinator", coordinator,
          "--num-processes", str(count), "--process-id", str(i), *OVERRIDES]
         for i in range(count)], env, logs)


@pytest.mark.slow
def test_two_processes_train_like_one_with_all_devices(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    config = load_config(CONFIG, OVERRIDES)
    started = time.monotonic()
    workers = _start_workers(tmp_path / "multi", logs)
    try:  # the reference: this process, 8 devices (conftest), the same mesh fsdp=8
        single = train(config, tmp_path / "single")
    finally:
        wait_processes(workers, logs, TIMEOUT_S - (time.monotonic() - started))

    reports = [json.loads((logs / f"report{i}.json").read_text()) for i in range(2)]
    for i, report in enumerate(reports):
        assert (report["process_index"], report["process_count"]) == (i, 2)
        assert (report["device_count"], report["local_device_count"]) == (8, 4)
        assert report["mesh"] == {"data": 1, "fsdp": 8, "tensor": 1}  # fsdp=-1 is global
    assert [r["local_rows"] for r in reports] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    multi_metrics, single_metrics = reports[0]["summary"]["metrics"], single["metrics"]
    assert reports[1]["summary"]["metrics"] == multi_metrics  # replicated: equal on every host
    for name in COMPARED_METRICS:
        assert multi_metrics[name] == pytest.approx(single_metrics[name], rel=1e-3, abs=1e-7), name

    task = CoevolveTask(config)
    multi_state, meta = restore_checkpoint(tmp_path / "multi", task.abstract_state())
    single_state, _ = restore_checkpoint(tmp_path / "single", task.abstract_state())
    assert meta["round"] == 2
    initial = task.init_state(jax.random.key(0))
    for role, rtol in UPDATE_RTOL.items():
        error = update_error(flat(multi_state.role(role).params),
                             flat(single_state.role(role).params), flat(initial.role(role).params))
        assert error < rtol, f"{role}: the updates differ by {error:.3g} of their size"
