"""The reward-hacking watch in the toy world: a run whose generator is forced to write one
constant rubric that pays for what the ground truth penalises (`forced_rubric_run.py`) raises
it; the default world's runs do not (measured: docs/observability.md)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from xla_flags import as_a_user_runs

from jaxrubric.train_loop import read_eval_history

WORKER = Path(__file__).with_name("forced_rubric_run.py")


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.slow
def test_a_constant_rubric_that_pays_for_the_wrong_thing_raises_the_watch(tmp_path):
    subprocess.run([sys.executable, str(WORKER), str(tmp_path), "30"], env=as_a_user_runs(),
                   check=True, timeout=900)
    run = tmp_path / "runs" / "forced"
    quality = [e["eval/quality"] for e in read_eval_history(run)]
    rewards = [m["policy/reward"] for m in _lines(run / "metrics.jsonl")]
    # What the watch is for: the training reward rose while the ground truth fell.
    assert sum(rewards[-10:]) / 10 > sum(rewards[:10]) / 10 + 0.1
    assert quality[-1] < quality[1] < quality[0]
    alarms = {(a["round"], a["kind"]) for a in _lines(run / "watch.jsonl")}
    assert (30, "reward_hacking") in alarms  # the first evaluation with a full window
    assert any(kind == "length" for _, kind in alarms)  # keeping small digits lengthens
