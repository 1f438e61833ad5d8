"""End to end: the toy world learns, its evaluators differ as the paper says, and the Colab
notebook runs it.

The default world, shortened to its first evaluations (as `jaxrubric train --rounds N` runs
it: from the starts shipped with the package, all four runs), must raise the policy's
held-out ground-truth quality: the check that fails when the learning signal breaks (a silent
reward of 0, a verifier that says "no" to everything, a generator update that never reaches
the policy). It must also show the part of DynamicRubric's claim that a short world can show:
the answer-seeing generator's rubrics keep wider score gaps between the policy's own answers
than the prompt-only (static) generator's (Δgap, the paper's Eq. 2), and its policy ends
above the static run's in the final evaluation, paired by question. Whether it ends above
the frozen run's, and whether the stale evaluator's gaps close, take the full 90 rounds and
several seeds (the README's table). It runs as `jaxrubric train` does, in a process of its
own on one CPU device (the suite's 8 fake devices would only add collectives on a 2-core
runner). The notebook then runs in a fresh kernel against the same workdir, where every step
is cached, so it only re-plots. The warm starts' own training is tested small
(`test_toy_warm_starts.py`); the shipped ones are checked to be the defaults'.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from xla_flags import as_a_user_runs

from jaxrubric.toy import diagnostics
from jaxrubric.toy.world_config import RUNS, ToyWorldConfig

# The defaults' first evaluations after round 0: a run of `rounds` rounds is the first
# `rounds` rounds of the default one (a constant learning rate, the same draws), and every
# stage before the runs is the shipped one (`toy/warm_starts.py`).
SHORT = ToyWorldConfig(rounds=ToyWorldConfig().eval_every)
NOTEBOOK = Path(__file__).parents[2] / "colab" / "quickstart.ipynb"


def _short_overrides() -> dict:
    default = dataclasses.asdict(ToyWorldConfig())
    return {k: v for k, v in dataclasses.asdict(SHORT).items() if v != default[k]}


@pytest.mark.slow
def test_toy_world_quality_rises_and_the_notebook_runs(tmp_path, monkeypatch):
    workdir = tmp_path / "toy"
    script = ("import json, sys\nfrom jaxrubric.toy.world import ToyWorldConfig, run_toy_world\n"
              "over = {k: tuple(v) if isinstance(v, list) else v\n"
              "        for k, v in json.loads(sys.argv[2]).items()}\n"
              "run_toy_world(sys.argv[1], ToyWorldConfig(**over))\n")
    subprocess.run([sys.executable, "-c", script, str(workdir), json.dumps(_short_overrides())],
                   env=as_a_user_runs(), check=True, timeout=900)
    summary = json.loads((workdir / "summary.json").read_text())
    quality = summary["coevolve"]
    assert summary["rounds"] == [0, SHORT.rounds]
    assert all(len(summary[run]) == 2 for run in RUNS)
    # The held-out questions x 4 answers per evaluation: a rise of 0.08 is several standard
    # errors of the difference of two evaluations, and far below what the runs rise by
    # (docs/toy_worlds_measured.md).
    assert quality[1] - quality[0] >= 0.08, quality
    # Δgap on each run's own answers, with its standard error clustered by question: the
    # answer-seeing generator's rubrics (co-evolving; at round 0 the generator every run but
    # the static one starts from) separate the policy's answers further than the prompt-only
    # generator's at every evaluation, by at least twice the standard error of the difference
    # (the noise of the two evaluations).
    gap, gap_se = summary["delta_gap"], summary["delta_gap_se"]
    for i in range(2):
        margin = 2 * np.hypot(gap_se["coevolve"][i], gap_se["static"][i])
        assert gap["coevolve"][i] - gap["static"][i] >= margin, (gap, gap_se)
    # The final evaluation: every run's last policy on the same held-out questions, 16 answers
    # each, all from one sampling key, so two runs' difference is paired by question. Each run's
    # quality there is the training loop's last evaluation of the same policy within the noise
    # of both (4 standard errors), and the co-evolving run is ahead of the static one by at
    # least twice the paired standard error (the prompt-only generator cannot name the stray
    # letter a policy writes). A standard error of 0 would mean both runs were scored on one
    # policy.
    final = summary["final"]
    assert final["questions"] == SHORT.eval_batch_size and final["samples"] == SHORT.final_samples
    for run in RUNS:
        noise = np.hypot(final["quality_se"][run], summary["quality_se"][run][-1])
        assert abs(final["quality"][run] - summary[run][-1]) <= 4 * noise, (run, final)
    lead = final["leads"]["coevolve-static"]
    assert lead["se"] > 0 and lead["mean"] >= 2 * lead["se"], final["leads"]
    # The evaluator's signal on the anchor lists beside it.
    anchors = summary["anchor_delta_gap"]["coevolve"]
    assert len(anchors) == len(quality) and all(np.isfinite(g) for g in anchors), anchors
    assert (workdir / "quality.png").stat().st_size > 1000
    assert diagnostics.verifier_accuracy(workdir, n=256) > 0.9
    start = diagnostics.mistake_profile(workdir)
    end = diagnostics.mistake_profile(workdir, "coevolve")
    assert end["keeps_a_small_digit"] < start["keeps_a_small_digit"], (start, end)

    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    parameters = next(c for c in notebook.cells if "parameters" in c.metadata.get("tags", []))
    real_workdir = tmp_path / "real"
    parameters.source = (f"JAXRUBRIC_SOURCE = {str(NOTEBOOK.parent.parent)!r}\n"
                         f"WORKDIR = {str(workdir)!r}\nSHORT = {_short_overrides()!r}\n"
                         "RUN_REAL_MODEL = True\nRECIPE = ''\n"
                         f"REAL_WORKDIR = {str(real_workdir)!r}\nREAL_ROUNDS = 1\n"
                         "DEVICE_MEMORY = '15GiB'")
    monkeypatch.setenv("XLA_FLAGS", as_a_user_runs()["XLA_FLAGS"])  # the kernel inherits it
    # The real-model part checks the hub first (unreachable here); where it is reachable, JAX
    # on the CPU makes it skip all the same, so a test never downloads Qwen3-0.6B.
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    nbclient.NotebookClient(notebook, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [o for c in notebook.cells if c.cell_type == "code" for o in c.outputs]
    assert any("image/png" in o.get("data", {}) for o in outputs)
    printed = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
    skips = [line for line in printed.splitlines() if line.startswith("Skipping the real model: ")]
    assert len(skips) == 1 and not real_workdir.exists(), printed
    assert json.loads((workdir / "summary.json").read_text())["coevolve"] == quality


def test_the_two_worlds_use_one_verifier():
    """Their defaults agree on all that the verifier's warm start reads (`verifier_sft.py`),
    so the package ships and the suite reads one verifier for both."""
    from jaxrubric.toy.genrubric_config import GenRubricWorldConfig

    assert SHORT.verifier_settings() == GenRubricWorldConfig().verifier_settings()
