"""End to end: the toy world learns, and the Colab notebook runs it.

A shortened default (fewer supervised steps and rounds, the co-evolving run only) must raise
the policy's held-out ground-truth quality: the check that fails when the learning signal
breaks (a silent reward of 0, a verifier that says "no" to everything, a generator update that
never reaches the policy). The notebook then runs in a fresh kernel against the same workdir,
where every step is cached, so it only re-plots.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from jaxrubric.toy import world

SHORT = world.ToyWorldConfig(runs=("coevolve",), rounds=30, generator_rounds=10, eval_every=10,
                             verifier_steps=250, policy_steps=250, generator_steps=200)
NOTEBOOK = Path(__file__).parent.parent / "colab" / "quickstart.ipynb"


@pytest.mark.slow
def test_toy_world_quality_rises_and_the_notebook_runs(tmp_path):
    workdir = tmp_path / "toy"
    summary = world.run_toy_world(workdir, SHORT)
    quality = summary["coevolve"]
    assert len(quality) == SHORT.rounds // SHORT.eval_every + 1
    # 256 held-out samples per evaluation: a standard error of ~0.016, so a rise of 0.04 is
    # signal (the full default rises by 0.18-0.19 over 60 rounds; this short run by ~0.07).
    assert max(quality[1:]) - quality[0] >= 0.04, quality
    assert (workdir / "quality.png").stat().st_size > 1000
    assert json.loads((workdir / "summary.json").read_text())["coevolve"] == quality
    assert world.verifier_accuracy(workdir, n=256) > 0.9

    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    parameters = next(c for c in notebook.cells if "parameters" in c.metadata.get("tags", []))
    short = {k: v for k, v in dataclasses.asdict(SHORT).items()
             if v != getattr(world.ToyWorldConfig(), k)}
    parameters.source = (f"JAXRUBRIC_SOURCE = {str(NOTEBOOK.parent.parent)!r}\n"
                         f"WORKDIR = {str(workdir)!r}\nSHORT = {short!r}")
    nbclient.NotebookClient(notebook, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [o for c in notebook.cells if c.cell_type == "code" for o in c.outputs]
    assert any("image/png" in o.get("data", {}) for o in outputs)
