"""The toy worlds' stage runner: dependencies respected in worker processes, errors and
SIGTERM reach the caller, workers' output goes to the stage logs."""

from __future__ import annotations

import builtins
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jaxrubric.toy import stages
from jaxrubric.toy.stages import Stage


class Timer:
    def __init__(self):
        self.seconds: dict[str, float] = {}

    def record(self, name, seconds):
        self.seconds[name] = seconds


def _chain(tmp_path: Path) -> list[Stage]:
    a, b, c, d = (tmp_path / n for n in "abcd")
    return [Stage("a", Path.write_text, (a, "a")),
            Stage("slow", time.sleep, (1.0,)),
            Stage("b", shutil.copyfile, (a, b), after=("a",)),
            Stage("c", shutil.copyfile, (b, c), after=("b", "slow")),
            Stage("d", Path.write_text, (d, "d"))]


@pytest.mark.slow
@pytest.mark.parametrize("jobs", [1, 3])
def test_every_stage_runs_once_after_what_it_reads(tmp_path, jobs):
    """`c` copies what `b` copied from `a`: it fails unless each ran after its dependency."""
    timer = Timer()
    stages.run_stages(_chain(tmp_path), timer, jobs, tmp_path / "logs")
    assert (tmp_path / "c").read_text() == "a" and (tmp_path / "d").read_text() == "d"
    assert set(timer.seconds) == {"a", "slow", "b", "c", "d"}
    assert timer.seconds["slow"] >= 1.0


def test_a_stage_error_is_raised_here(tmp_path):
    graph = [Stage("copy", shutil.copyfile, (tmp_path / "missing", tmp_path / "x")),
             Stage("after", Path.write_text, (tmp_path / "never", "x"), after=("copy",))]
    with pytest.raises(FileNotFoundError):
        stages.run_stages(graph, Timer(), 2, tmp_path / "logs")
    assert not (tmp_path / "never").exists()


def test_workers_output_goes_to_the_stage_log(tmp_path, capfd):
    graph = [Stage("say: hello", builtins.print, ("hello from a worker",)),
             Stage("say: bye", builtins.print, ("bye",), after=("say: hello",))]
    stages.run_stages(graph, Timer(), 2, tmp_path / "logs")
    assert "hello from a worker" in (tmp_path / "logs" / "say_hello.log").read_text()
    printed = capfd.readouterr().out
    assert "hello from a worker" not in printed and "start: say: hello" in printed


@pytest.mark.slow
def test_sigterm_reaches_the_workers(tmp_path):
    """A SIGTERM to the world's process is passed to its workers. A worker's default SIGTERM
    action ends it, so the pool breaks at once instead of sleeping out its 60 s stage. (In a
    process of its own: a pytest worker may run tests off its main thread, where no signal
    handler can be set.)"""
    script = ("import sys, time\nfrom pathlib import Path\nfrom jaxrubric.toy import stages\n"
              "class T:\n    def record(self, name, seconds): pass\n"
              "stages.run_stages([stages.Stage('sleep', time.sleep, (60.0,))], T(), 2, "
              "Path(sys.argv[1]))\n")
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    process = subprocess.Popen([sys.executable, "-c", script, str(tmp_path / "logs")],
                               env=env, stderr=subprocess.PIPE, text=True)
    start = time.perf_counter()
    log = tmp_path / "logs" / "sleep.log"
    while not log.exists() and time.perf_counter() - start < 60:  # the worker holds the stage
        time.sleep(0.2)
    process.send_signal(signal.SIGTERM)
    start = time.perf_counter()
    _, err = process.communicate(timeout=45)
    assert process.returncode != 0 and "BrokenProcessPool" in err, err[-2000:]
    assert time.perf_counter() - start < 30


@pytest.mark.parametrize("graph, message", [
    ([Stage("a", print, ()), Stage("a", print, ())], "appears twice"),
    ([Stage("b", print, (), after=("a",)), Stage("a", print, ())], "not earlier stages"),
])
def test_a_bad_graph_is_named(graph, message):
    with pytest.raises(ValueError, match=message):
        stages.check_graph(graph)


def test_the_toy_worlds_graph(tmp_path):
    from jaxrubric.toy import world
    from jaxrubric.toy.world_config import RUNS
    from jaxrubric.toy.world_runs import run_generator

    graph = world.world_stages(tmp_path, world.ToyWorldConfig())
    stages.check_graph(graph)
    after = {s.name: s.after for s in graph}
    assert after["run: static"] == ("generator rounds: static",)
    assert after["run: coevolve"] == after["run: oracle"] == ("generator rounds",)
    # The two runs that start first compile the two round programs, one each.
    assert [s.name for s in graph if s.name.startswith("run: ")][:2] == [
        "run: coevolve", "run: static"]
    # The stale evaluator: the generator's own rounds continued before the frozen run starts.
    assert after["run: frozen"] == ("generator rounds: stale",)
    assert after["generator rounds: stale"] == ("generator rounds",)
    unstale = world.world_stages(tmp_path, world.ToyWorldConfig(stale_rounds=0))
    assert {s.name: s.after for s in unstale}["run: frozen"] == ("generator rounds",)
    models = tmp_path / "models"
    assert [run_generator(tmp_path, world.ToyWorldConfig(), name) for name in
            ("coevolve", "frozen", "static", "oracle")] == [
        models / "generator", models / "generator_stale", models / "generator_static",
        models / "generator"]
    assert run_generator(tmp_path, world.ToyWorldConfig(stale_rounds=0),
                         "frozen") == models / "generator"
    assert "warm start: generator_cold" in after["generator rounds"]
    # The final evaluation reads every run's last policy.
    assert after["final evaluation"] == tuple(f"run: {name}" for name in RUNS)
    no_static = world.world_stages(tmp_path, world.ToyWorldConfig(runs=("coevolve",)))
    assert [s.name for s in no_static] == [
        "warm start: verifier", "warm start: policy", "warm start: generator_cold",
        "generator rounds", "run: coevolve", "final evaluation"]
    # The stages whose outputs the package ships: everything before the compared runs.
    assert world.start_stages(tmp_path, world.ToyWorldConfig()) == graph[:len(graph) - 5]


def test_train_passes_jobs_to_the_toy_world(tmp_path, monkeypatch):
    from jaxrubric.cli import default_toy_jobs, main
    from jaxrubric.toy import genrubric_world, world

    calls = []
    monkeypatch.setattr(world, "run_toy_world", lambda workdir, cfg, jobs=None,
                        from_scratch=False: calls.append((cfg.seed, jobs, from_scratch)))
    monkeypatch.setattr(genrubric_world, "run_genrubric_world", lambda workdir, cfg, jobs=None,
                        from_scratch=False: calls.append(("genrubric", jobs, from_scratch)))
    assert main(["train", "--jobs", "1", "--seed", "2", "--workdir", str(tmp_path)]) == 0
    assert main(["train", "--workdir", str(tmp_path)]) == 0
    assert main(["train", "--method", "genrubric", "--jobs", "3",
                 "--workdir", str(tmp_path)]) == 0
    assert main(["train", "--method", "genrubric", "--workdir", str(tmp_path)]) == 0
    assert main(["train", "--from-scratch", "--workdir", str(tmp_path)]) == 0
    assert main(["train", "--method", "genrubric", "--from-scratch",
                 "--workdir", str(tmp_path)]) == 0
    jobs = default_toy_jobs("dynamic_rubric"), default_toy_jobs("genrubric")
    assert calls == [(2, 1, False), (0, jobs[0], False), ("genrubric", 3, False),
                     ("genrubric", jobs[1], False), (0, jobs[0], True),
                     ("genrubric", jobs[1], True)]
    assert default_toy_jobs("dynamic_rubric") == min(2, os.cpu_count())


def test_from_scratch_is_the_toy_worlds_only(tmp_path):
    from helpers import ROOT

    from jaxrubric.cli import main

    with pytest.raises(SystemExit, match="--from-scratch is the toy world's"):
        main(["train", "--from-scratch", "--config",
              str(ROOT / "configs" / "tiny_dynamic_rubric.py"), "--workdir", str(tmp_path)])


def test_the_genrubric_worlds_graph(tmp_path):
    from jaxrubric.toy import genrubric_world as gw

    graph = gw.world_stages(tmp_path, gw.GenRubricWorldConfig())
    stages.check_graph(graph)
    after = {s.name: s.after for s in graph}
    assert after["rubric following"] == ("warm start: policy",)
    assert set(after["run: control"]) == {"warm start: verifier", "warm start: policy",
                                          "warm start: generator_cold"}
    assert gw.start_stages(tmp_path, gw.GenRubricWorldConfig()) == graph[:-2]
