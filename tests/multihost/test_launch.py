"""The launchers, run as subprocesses: the exact commands of --dry-run, the create / reuse
decision against a fake `gcloud`, the remote script run locally for worker 0 and worker 1,
quoting, and clear errors."""

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

BASH = shutil.which("bash")
pytestmark = pytest.mark.skipif(BASH is None, reason="the launchers are bash scripts")

ROOT = Path(__file__).resolve().parents[2]
TPU = str(ROOT / "launch" / "tpu_pod.sh")
GPU = str(ROOT / "launch" / "gpu_local.sh")
LOC = ["--zone", "us-east5-a", "--project", "proj"]
TRAIN = ["jaxrubric", "train", "--config", "configs/qwen3_8b_dynamic_rubric.py", "--workdir",
         "gs://bucket/my run"]  # a space: must survive every level of quoting
METADATA = ("http://metadata.google.internal/computeMetadata/v1/instance/attributes/"
            "agent-worker-number")


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """A clean environment: none of the test session's JAX / XLA / CUDA variables leak in."""
    return {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "TMPDIR": str(tmp_path), **extra}


def _run(script: str, args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([BASH, script, *args], env=env, capture_output=True, text=True,
                          timeout=60)


def _traced(stdout: str) -> list[list[str]]:
    """The argv of every traced `+ ...` line."""
    lines = stdout.splitlines()
    assert all(line.startswith("+ ") for line in lines), stdout
    return [shlex.split(line[2:]) for line in lines]


def _run_script(command: str) -> str:
    """The remote script that runs `command` (already a quoted shell string) on every worker."""
    return (
        "set -o pipefail; mkdir -p jaxrubric/logs && cd jaxrubric || exit 1; "
        f"W=$(curl -sf -H Metadata-Flavor:Google {METADATA}) || "
        '{ echo "cannot read agent-worker-number from the metadata server" >&2; exit 1; }; '
        'export PATH="$HOME/.local/bin:$PATH" PYTHONUNBUFFERED=1 '
        "JAXRUBRIC_COORDINATOR_ADDRESS=auto; "
        f'if [ "$W" = 0 ]; then {command} 2>&1 | tee -a logs/worker-0.log; '
        f"else {command} >>logs/worker-$W.log 2>&1; fi")


QUOTED_TRAIN = ("jaxrubric train --config configs/qwen3_8b_dynamic_rubric.py "
                r"--workdir gs://bucket/my\ run")
SSH = ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "my-tpu", *LOC, "--worker=all"]
DESCRIBE = ["gcloud", "compute", "tpus", "tpu-vm", "describe", "my-tpu", *LOC,
            "--format=value(state)"]


# ------------------------------------------------------------------------------- tpu_pod.sh

def test_tpu_dry_run_creates_a_missing_slice_and_copies_the_checkout(tmp_path):
    out = _run(TPU, ["--dry-run", "--name", "my-tpu", *LOC, "--accelerator-type", "v5p-16",
                     "--create", "--create-arg=--spot", "--", *TRAIN], _env(tmp_path))
    assert out.returncode == 0, out.stderr
    archive = f"{tmp_path}/jaxrubric-my-tpu.tar.gz"
    assert _traced(out.stdout) == [
        DESCRIBE,
        ["gcloud", "compute", "tpus", "tpu-vm", "create", "my-tpu", *LOC, "--accelerator-type",
         "v5p-16", "--version", "v2-alpha-tpuv5", "--spot"],
        ["tar", "-czf", archive, "--exclude=./.git", "--exclude=./.venv", "--exclude=./.ci-venv",
         "--exclude=./build", "--exclude=./dist", "--exclude=./workdir*",
         "--exclude=./.pytest_cache", "--exclude=./.hypothesis", "--exclude=__pycache__",
         "--exclude=*.egg-info", "-C", str(ROOT), "."],
        ["gcloud", "compute", "tpus", "tpu-vm", "scp", archive, "my-tpu:jaxrubric.tar.gz", *LOC,
         "--worker=all"],
        [*SSH, "--command", "mkdir -p jaxrubric && tar -xzf jaxrubric.tar.gz -C jaxrubric && "
         r"cd jaxrubric && python3 -m pip install -q -e .\[tpu\]"],
        [*SSH, "--command", _run_script(QUOTED_TRAIN)],
    ]
    assert "not found in us-east5-a: creating a v5p-16 slice" in out.stderr


def test_tpu_dry_run_reuses_an_existing_slice(tmp_path):
    # Without --create the slice must exist; with it, the type is needed in case it does not.
    for extra in (["--create", "--accelerator-type", "v4-8", "--assume-exists"], []):
        out = _run(TPU, ["--dry-run", "--name", "my-tpu", *LOC, "--install", "none", *extra,
                         "--", *TRAIN], _env(tmp_path))
        assert out.returncode == 0, out.stderr
        assert _traced(out.stdout) == [DESCRIBE, [*SSH, "--command", _run_script(QUOTED_TRAIN)]]
        assert "exists: reusing it" in out.stderr


def test_tpu_pip_install_env_and_ssh_args(tmp_path):
    out = _run(TPU, ["--dry-run", "--name=my-tpu", *LOC, "--install", "pip", "--repo",
                     "https://github.com/org/jaxrubric@v0.1", "--env", "HF_TOKEN=a b",
                     "--ssh-arg", "--internal-ip", "--", "jaxrubric", "smoke"], _env(tmp_path))
    assert out.returncode == 0, out.stderr
    ssh = [*SSH, "--internal-ip", "--command"]
    script = _run_script("jaxrubric smoke").replace(
        "ADDRESS=auto; ", r"ADDRESS=auto; export HF_TOKEN=a\ b; ")
    assert _traced(out.stdout)[1:] == [
        [*ssh, r"mkdir -p jaxrubric && python3 -m pip install -q "
               r"jaxrubric\[tpu\]\ @\ git+https://github.com/org/jaxrubric@v0.1"],
        ["gcloud", "compute", "tpus", "tpu-vm", "scp", "--recurse", f"{ROOT}/configs",
         "my-tpu:jaxrubric/", *LOC, "--worker=all", "--internal-ip"],
        [*ssh, script],
    ]


@pytest.mark.parametrize("accelerator, runtime", [
    ("v4-32", "tpu-ubuntu2204-base"), ("v5litepod-16", "v2-alpha-tpuv5-lite"),
    ("v5p-8", "v2-alpha-tpuv5"), ("v6e-8", "v2-alpha-tpuv6e"),
])
def test_tpu_default_runtime_version(tmp_path, accelerator, runtime):
    out = _run(TPU, ["--dry-run", "--name", "t", "--zone", "z", "--accelerator-type", accelerator,
                     "--create", "--install", "none", "--", "true"], _env(tmp_path))
    assert out.returncode == 0, out.stderr
    assert _traced(out.stdout)[1][-2:] == ["--version", runtime]


def _fake_gcloud(tmp_path: Path, state: str | None) -> tuple[dict[str, str], Path]:
    """A `gcloud` that logs each call and answers `describe` with `state` (None: not found)."""
    bin_dir, log = tmp_path / "bin", tmp_path / "gcloud.log"
    bin_dir.mkdir()
    describe = f"echo {state}; exit 0" if state else "echo 'ERROR: NOT_FOUND' >&2; exit 1"
    (bin_dir / "gcloud").write_text(
        "#!/usr/bin/env bash\n"
        f"printf '%s\\x1f' \"$@\" >> {shlex.quote(str(log))}; echo >> {shlex.quote(str(log))}\n"
        f'if [ "$4" = describe ]; then {describe}; fi\n')
    (bin_dir / "gcloud").chmod(0o755)
    env = _env(tmp_path)
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    return env, log


def _calls(log: Path) -> list[list[str]]:
    if not log.exists():
        return []
    return [["gcloud", *line.split("\x1f")[:-1]] for line in log.read_text().splitlines()]


@pytest.mark.parametrize("state, create, expected_verbs", [
    (None, True, ["describe", "create", "ssh"]),
    ("READY", True, ["describe", "ssh"]),
    ("READY", False, ["describe", "ssh"]),
])
def test_tpu_create_or_reuse_against_gcloud(tmp_path, state, create, expected_verbs):
    env, log = _fake_gcloud(tmp_path, state)
    args = ["--name", "my-tpu", *LOC, "--accelerator-type", "v6e-8", "--install", "none"]
    out = _run(TPU, [*args, *(["--create"] if create else []), "--", *TRAIN], env)
    assert out.returncode == 0, out.stderr
    calls = _calls(log)
    assert [c[4] for c in calls] == expected_verbs
    assert calls[-1] == [*SSH, "--command", _run_script(QUOTED_TRAIN)]
    assert "+ gcloud compute tpus tpu-vm ssh my-tpu" in out.stderr  # traced on stderr


@pytest.mark.parametrize("state, message", [
    (None, "TPU VM my-tpu not found in zone us-east5-a"),
    ("PREEMPTED", "TPU VM my-tpu in us-east5-a is PREEMPTED, not READY"),
])
def test_tpu_refuses_a_missing_or_unready_slice(tmp_path, state, message):
    env, log = _fake_gcloud(tmp_path, state)
    out = _run(TPU, ["--name", "my-tpu", *LOC, "--install", "none", "--", *TRAIN], env)
    assert out.returncode == 2
    assert message in out.stderr
    assert [c[4] for c in _calls(log)] == ["describe"]


_SCRIPTED_GCLOUD = """
import json, pathlib, sys
state = pathlib.Path(STATE)
argv = sys.argv[1:]
with open(state / "calls.jsonl", "a") as log:
    log.write(json.dumps(argv) + "\\n")
calls = [json.loads(line) for line in (state / "calls.jsonl").read_text().splitlines()]
if argv[3] == "describe":
    answers = json.loads((state / "describe.json").read_text())
    answer = answers[min(sum(c[3] == "describe" for c in calls), len(answers)) - 1]
    print(answer or "ERROR: NOT_FOUND", file=sys.stdout if answer else sys.stderr)
    sys.exit(0 if answer else 1)
if argv[3] == "ssh" and "agent-worker-number" in argv[-1]:
    status, output = json.loads((state / "runs.json").read_text())[
        sum(c[3] == "ssh" and "agent-worker-number" in c[-1] for c in calls) - 1]
    print(output)
    sys.exit(status)
"""


def _scripted_gcloud(tmp_path: Path, runs: list[tuple[int, str]],
                     describe: tuple[str, ...] = ("READY",)) -> tuple[dict[str, str], Path]:
    """A `gcloud` that logs each call; `describe` answers the states of `describe` in turn (the
    last one repeats; "" is not found), and each run of the command on the workers answers the
    next of `runs`: (exit status, worker 0's output)."""
    bin_dir, state = tmp_path / "bin", tmp_path / "gcloud_state"
    bin_dir.mkdir()
    state.mkdir()
    (state / "describe.json").write_text(json.dumps(describe))
    (state / "runs.json").write_text(json.dumps(runs))
    gcloud = bin_dir / "gcloud"
    gcloud.write_text(f"#!{sys.executable}\nSTATE = {str(state)!r}\n{_SCRIPTED_GCLOUD}")
    gcloud.chmod(0o755)
    env = _env(tmp_path, JAXRUBRIC_TPU_POLL_S="0")
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    return env, state / "calls.jsonl"


def _verbs(log: Path) -> list[str]:
    """Each gcloud call: its verb, or `run` / `stop` for the ssh that runs the command or stops
    what is left of it."""
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    return [("run" if "agent-worker-number" in c[-1] else "stop") if c[3] == "ssh" else c[3]
            for c in calls]


def _relaunch(tmp_path, runs, describe=("READY",), *extra):
    env, log = _scripted_gcloud(tmp_path, runs, describe)
    out = _run(TPU, ["--name", "my-tpu", *LOC, "--install", "none", *extra, "--", *TRAIN], env)
    notes = [re.sub(r"after \d+ s", "after N s", line) for line in out.stderr.splitlines()
             if line.startswith("# tpu_pod.sh:")]  # the durations of the attempts: N
    return out, _verbs(log), notes


def test_tpu_relaunches_every_worker_when_the_slice_comes_back(tmp_path):
    """A worker lost on the first attempt (the others exit 75), the slice preempted, then READY
    again: every worker is started again with the same command (the same workdir)."""
    out, verbs, notes = _relaunch(tmp_path, [(75, "jaxrubric: process 3 of 4 sent no heartbeat"),
                                             (0, "done")], ("READY", "PREEMPTED", "READY"))
    assert out.returncode == 0, out.stderr
    assert verbs == ["describe", "run", "describe", "describe", "stop", "run"]
    assert notes == ["# tpu_pod.sh: attempt 1 of 3 ended with exit 75 after N s; TPU VM my-tpu is "
                     "READY: relaunching every worker with the same command and workdir "
                     "(attempt 2)"]
    log = tmp_path / "gcloud_state" / "calls.jsonl"
    runs = [json.loads(line) for line in log.read_text().splitlines() if "agent-worker" in line]
    assert runs[0] == runs[1] == [*SSH[1:], "--command", _run_script(QUOTED_TRAIN)]
    assert out.stdout.splitlines()[-1] == "done"  # worker 0's output streams through


def test_tpu_relaunches_a_run_stopped_by_a_preemption_notice(tmp_path):
    out, verbs, notes = _relaunch(tmp_path, [
        (0, "stopped by SIGTERM after round 7; checkpoint saved"), (0, "done")])
    assert out.returncode == 0 and verbs == ["describe", "run", "describe", "stop", "run"]
    assert notes[0].startswith("# tpu_pod.sh: attempt 1 of 3 stopped by a preemption notice "
                               "after N s; TPU VM my-tpu is READY: relaunching")


@pytest.mark.parametrize("runs, extra, status, runs_made, note", [
    ([(2, "jaxrubric train: error: config has no key 'round.top_pp'")], [], 2, 1,
     "attempt 1 of 3 ended with exit 2 after N s (a usage, config or data error, or a locked "
     "workdir): not relaunching"),
    ([(1, "ValueError: boom")] * 5, ["--attempts", "5"], 1, 2,
     "attempt 2 of 5 ended with exit 1 after N s, the same quick failure as attempt 1: not "
     "relaunching"),
    ([(1, "a"), (1, "b"), (137, "c"), (1, "d")], [], 137, 3,
     "attempt 3 of 3 ended with exit 137 after N s; no attempts left (--attempts 3)"),
])
def test_tpu_stops_relaunching_a_fault_that_repeats(tmp_path, runs, extra, status, runs_made,
                                                    note):
    out, verbs, notes = _relaunch(tmp_path, runs, ("READY",), *extra)
    assert out.returncode == status, out.stderr
    assert verbs.count("run") == runs_made and notes[-1] == f"# tpu_pod.sh: {note}"


def test_tpu_gives_up_on_a_slice_that_does_not_come_back(tmp_path):
    out, verbs, _ = _relaunch(tmp_path, [(255, "Connection closed")], ("READY", "PREEMPTED"),
                              "--ready-timeout", "0")
    assert out.returncode == 2 and verbs == ["describe", "run", "describe"]
    assert ("TPU VM my-tpu is PREEMPTED after waiting 0 s for it to be READY; not relaunching"
            in out.stderr)


@pytest.mark.parametrize("worker", ["0", "1"])
def test_tpu_remote_script_streams_worker_0_and_logs_every_worker(tmp_path, worker):
    """The script each worker runs, run here with a fake metadata server (`curl`) and a fake
    `jaxrubric` in ~/.local/bin (where pip puts it) that prints its arguments and fails."""
    shown = '"$PYTHONUNBUFFERED $JAXRUBRIC_COORDINATOR_ADDRESS"'
    fakes = {tmp_path / "bin" / "curl": f"echo {worker}",
             tmp_path / ".local" / "bin" / "jaxrubric": f"printf '%s\\n' \"$@\" {shown}; exit 3"}
    for path, body in fakes.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"#!/usr/bin/env bash\n{body}\n")
        path.chmod(0o755)
    env = {"PATH": f"{tmp_path / 'bin'}:{Path(BASH).parent}:/usr/bin:/bin", "HOME": str(tmp_path)}
    out = subprocess.run([BASH, "-c", _run_script(QUOTED_TRAIN)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 3  # the command's failure, through the tee (pipefail)
    logged = [*TRAIN[1:], "1 auto"]
    log = tmp_path / "jaxrubric" / "logs" / f"worker-{worker}.log"
    assert log.read_text().splitlines() == logged
    assert out.stdout.splitlines() == (logged if worker == "0" else [])


@pytest.mark.parametrize("args, message", [
    (["--zone", "z", "--", "true"], "missing --name"),
    (["--name", "t", "--", "true"], "missing --zone"),
    (["--name", "t", "--zone", "z"], "missing the command to run, after --"),
    (["--name", "t", "--zone", "z", "--create", "--", "true"], "--create needs --accelerator-type"),
    (["--name", "t", "--zone", "z", "--create", "--accelerator-type", "v9-8", "--", "true"],
     "no default runtime version for accelerator type 'v9-8'"),
    (["--name", "t", "--zone", "z", "--install", "pip", "--", "true"],
     "--install pip needs --repo URL"),
    (["--name", "t", "--zone", "z", "--install", "rsync", "--", "true"],
     "--install must be copy, pip or none"),
    (["--name", "t", "--zone", "z", "--env", "1X=y", "--", "true"], "--env takes KEY=VALUE"),
    (["--name", "t", "--zone", "z", "--frobnicate", "--", "true"], "unknown option --frobnicate"),
    (["--name", "t", "--zone"], "--zone needs a value"),
    (["--name", "t", "--zone", "z", "--attempts", "0", "--", "true"],
     "--attempts must be a positive integer, got '0'"),
    (["--name", "t", "--zone", "z", "--ready-timeout", "1h", "--", "true"],
     "--ready-timeout must be seconds, got '1h'"),
])
def test_tpu_usage_errors(tmp_path, args, message):
    out = _run(TPU, ["--dry-run", *args], _env(tmp_path))
    assert out.returncode == 2
    assert f"tpu_pod.sh: error: {message}" in out.stderr
    assert out.stdout == ""


def test_tpu_assume_exists_is_for_dry_runs_only(tmp_path):
    out = _run(TPU, ["--name", "t", "--zone", "z", "--assume-exists", "--", "true"],
               _env(tmp_path))
    assert out.returncode == 2 and "--assume-exists only applies to --dry-run" in out.stderr


def test_help(tmp_path):
    for script in (TPU, GPU):
        out = _run(script, ["-h"], _env(tmp_path))
        assert out.returncode == 0 and out.stdout.startswith("Usage: launch/")


# ----------------------------------------------------------------------------- gpu_local.sh

def _exports(stdout: str) -> tuple[dict[str, str], list[str]]:
    """`export NAME=VALUE` lines (values unquoted) and the traced command."""
    *exports, command = stdout.splitlines()
    env = {}
    for line in exports:
        assert line.startswith("export "), line
        name, _, value = line[len("export "):].partition("=")
        env[name] = shlex.split(value)[0]
    assert command.startswith("+ ")
    return env, shlex.split(command[2:])


def test_gpu_dry_run_one_machine(tmp_path):
    out = _run(GPU, ["--dry-run", "--", *TRAIN], _env(tmp_path))
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "export XLA_PYTHON_CLIENT_MEM_FRACTION=0.90",
        "export XLA_FLAGS=--xla_gpu_enable_latency_hiding_scheduler=true",
        "export JAX_PLATFORMS=cuda",
        "+ jaxrubric train --config configs/qwen3_8b_dynamic_rubric.py --workdir "
        "'gs://bucket/my run'",
    ]


def test_gpu_dry_run_several_machines_and_passthrough(tmp_path):
    env = _env(tmp_path, CUDA_VISIBLE_DEVICES="2,3", XLA_FLAGS="--xla_dump_to=/tmp/d x",
               XLA_PYTHON_CLIENT_MEM_FRACTION=".8")
    out = _run(GPU, ["--dry-run", "--num-processes", "4", "--process-id=3", "--coordinator",
                     "10.0.0.1:12345", "--", *TRAIN], env)
    assert out.returncode == 0, out.stderr
    exported, command = _exports(out.stdout)
    assert exported == {
        "CUDA_VISIBLE_DEVICES": "2,3",
        "XLA_PYTHON_CLIENT_MEM_FRACTION": ".8",
        "XLA_FLAGS": "--xla_dump_to=/tmp/d x --xla_gpu_enable_latency_hiding_scheduler=true",
        "JAX_PLATFORMS": "cuda",
        "JAXRUBRIC_COORDINATOR_ADDRESS": "10.0.0.1:12345",
        "JAXRUBRIC_NUM_PROCESSES": "4",
        "JAXRUBRIC_PROCESS_ID": "3",
    }
    assert command == TRAIN


def test_gpu_flags_override_the_environment(tmp_path):
    env = _env(tmp_path, CUDA_VISIBLE_DEVICES="7", JAX_PLATFORMS="rocm",
               XLA_FLAGS="--xla_gpu_enable_latency_hiding_scheduler=false")
    out = _run(GPU, ["--dry-run", "--gpus", "0,1", "--mem-fraction", "0.5", "--", "true"], env)
    assert out.returncode == 0, out.stderr
    exported, _ = _exports(out.stdout)
    assert exported == {"CUDA_VISIBLE_DEVICES": "0,1", "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.5",
                        "XLA_FLAGS": "--xla_gpu_enable_latency_hiding_scheduler=false",
                        "JAX_PLATFORMS": "rocm"}


def test_gpu_runs_the_command_with_the_environment(tmp_path):
    probe = ("import os, sys; print(sys.argv[1:]); print(*(os.environ.get(k) for k in "
             "('JAXRUBRIC_COORDINATOR_ADDRESS', 'JAXRUBRIC_NUM_PROCESSES', "
             "'JAXRUBRIC_PROCESS_ID', 'JAX_PLATFORMS')))")
    python = shutil.which("python3") or shutil.which("python")
    out = _run(GPU, ["--num-processes", "2", "--process-id", "0", "--coordinator", "host:99",
                     "--", python, "-c", probe, "a b", "c"], _env(tmp_path))
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["['a b', 'c']", "host:99 2 0 cuda"]
    assert "export JAXRUBRIC_PROCESS_ID=0" in out.stderr  # shown on stderr when it runs


@pytest.mark.parametrize("args, message", [
    (["--num-processes", "2", "--coordinator", "h:1"], "--num-processes 2 needs --process-id"),
    (["--num-processes", "2", "--process-id", "0"], "--num-processes 2 needs --coordinator"),
    (["--num-processes", "2", "--process-id", "2", "--coordinator", "h:1"],
     "--process-id must be in 0 .. 1, got '2'"),
    (["--num-processes", "2", "--process-id", "1", "--coordinator", "h"],
     "--coordinator must be HOST:PORT"),
    (["--num-processes", "0"], "--num-processes must be >= 1"),
    (["--process-id", "0"], "--process-id and --coordinator need --num-processes N > 1"),
    (["--mem-fraction", "1.5"], "--mem-fraction must be in (0, 1]"),
    (["--gpus", "0 1"], "--gpus takes a comma-separated list"),
    (["--verbose"], "unknown option --verbose"),
])
def test_gpu_usage_errors(tmp_path, args, message):
    out = _run(GPU, ["--dry-run", *args, "--", "true"], _env(tmp_path))
    assert out.returncode == 2
    assert f"gpu_local.sh: error: {message}" in out.stderr
    assert out.stdout == ""


def test_gpu_needs_a_command(tmp_path):
    out = _run(GPU, ["--dry-run"], _env(tmp_path))
    assert out.returncode == 2 and "missing the command to run, after --" in out.stderr
