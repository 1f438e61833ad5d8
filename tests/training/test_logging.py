"""W&B beside TensorBoard: a run logs the same scalars (tags, steps, values) and text samples to
both, a rerun in the workdir continues the same W&B run, W&B is written by process 0 only, and
`logging.wandb` without `wandb` installed fails at the config check.

W&B runs offline here (no server, no API key, no error reports); what it recorded is read back
from its transaction log `run-<id>.wandb`, the one record of an offline run (wandb 0.31 writes no
`wandb-summary.json` offline and ships no Python reader of the log).
"""

import html
import json
import struct
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
import wandb
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from wandb.proto import wandb_internal_pb2

from helpers import WalkTask
from jaxrubric.config import ConfigFileError, load_config
from jaxrubric.logging_utils import WANDB_RUN_ID, SummaryWriter, WandbSettings, open_writers
from jaxrubric.train_loop import run_training

CONFIG = Path(__file__).parents[2] / "configs" / "tiny_dynamic_rubric.py"
SETTINGS = WandbSettings(project="jaxrubric-test", run_name="toy")
TEXT = "<b>bold?</b> & `code`\n  indented"  # markup and whitespace, to be shown verbatim


@pytest.fixture(scope="module", autouse=True)
def offline_wandb(tmp_path_factory):
    """W&B offline with its own folders: it never reaches a server, nor the user's settings.
    Module-wide, so that W&B's process-wide setup sees the same ones in every test."""
    home = tmp_path_factory.mktemp("wandb_home")
    env = {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_CONSOLE": "off",
           "WANDB_ERROR_REPORTING": "false", "WANDB_DISABLE_GIT": "true",
           "WANDB_X_DISABLE_STATS": "true", "WANDB_X_DISABLE_MACHINE_INFO": "true"}
    env |= {f"WANDB_{name}": str(home / name.lower()) for name in (
        "DIR", "CONFIG_DIR", "CACHE_DIR", "DATA_DIR", "ARTIFACT_DIR")}
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        patch.delenv("WANDB_API_KEY", raising=False)
        yield


class ScalarTask(WalkTask):
    """WalkTask with scalars that change every round and a text sample; it raises in round
    `crash_at`, after its update (the round is neither logged nor saved)."""

    def __init__(self, crash_at=None):
        self.crash_at = crash_at

    def round_step(self, state, batch, rng):
        state, _ = super().round_step(state, batch, rng)
        if int(state["round"]) == self.crash_at:
            raise RuntimeError("boom")
        return state, {"loss": jnp.mean(state["w"]), "policy/reward": jnp.std(state["w"])}

    def text_samples(self, state, batch, metrics):
        return {"sample/response": f"round {int(state['round'])}: {TEXT}"}


def _run(workdir, rounds, task):
    return run_training(task, workdir=workdir, rounds=rounds, seed=7, checkpoint_every=1,
                        config={"lr": 0.1}, eval_fn=lambda state, round_: {"score": round_ / 2},
                        wandb=SETTINGS)


def _records(wandb_file):
    """W&B's protobuf records in a `.wandb` file: LevelDB's log format, a 7-byte file header
    then 32 KiB blocks of chunks (checksum, length, type: full, first, middle or last)."""
    data, block = wandb_file.read_bytes(), 32768
    assert data[:4] == b":W&B"
    pos, record = 7, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's trailer: too short for a chunk header
            pos += block - pos % block
            continue
        length, kind = struct.unpack("<HB", data[pos + 4:pos + 7])
        record += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # full, last
            yield wandb_internal_pb2.Record.FromString(record)
            record = b""


def _wandb_runs(workdir):
    """Per offline W&B run in `workdir/wandb`: its run record, exit code, folder and history
    ({step: {key: value}}, nested keys as nested dicts, media as their JSON)."""
    wandb.teardown()  # W&B's service may still be writing the log after `finish` returned
    runs = []
    for folder in sorted((workdir / "wandb").glob("offline-run-*")):
        run = {"folder": folder, "history": {}, "exit_code": None}
        for record in _records(next(folder.glob("run-*.wandb"))):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                run["run"] = record.run
            elif kind == "exit":
                run["exit_code"] = record.exit.exit_code
            elif kind == "history":
                row = run["history"].setdefault(record.history.step.num, {})
                for item in record.history.item:
                    *parents, name = list(item.nested_key) or [item.key]
                    node = row
                    for part in parents:
                        node = node.setdefault(part, {})
                    node[name] = json.loads(item.value_json)
        runs.append(run)
    return runs


def _by_tag(pairs):
    """[(tag, step, value)] -> {tag: [(step, value)]} in step order."""
    out = {}
    for tag, step, value in sorted(pairs, key=lambda p: p[1]):
        out.setdefault(tag, []).append((step, value))
    return out


def test_a_resumed_run_continues_the_wandb_run_with_tensorboards_scalars_and_texts(tmp_path):
    with pytest.raises(RuntimeError, match="boom"):
        _run(tmp_path, 5, ScalarTask(crash_at=3))  # rounds 1-2 saved
    run_id = (tmp_path / WANDB_RUN_ID).read_text()
    assert _run(tmp_path, 5, ScalarTask())["resumed_from"] == 2

    runs = _wandb_runs(tmp_path)
    assert [run["run"].run_id for run in runs] == [run_id, run_id]  # one W&B run, two parts
    assert sorted(run["exit_code"] for run in runs) == [0, 1]  # the crash shows as failed
    first = runs[0]["run"]
    assert (first.project, first.display_name) == ("jaxrubric-test", "toy")
    config = {item.key: json.loads(item.value_json) for item in first.config.update}
    assert config["config"] == {"lr": 0.1} and config["seed"] == 7
    assert config["workdir"] == str(tmp_path)
    rows = [(step, row) for run in runs for step, row in run["history"].items()]
    assert sorted(step for step, _ in rows) == [0, 1, 2, 3, 4, 5]  # each round once

    events = EventAccumulator(str(tmp_path / "tensorboard"),
                              size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    tensorboard = {tag: [(e.step, pytest.approx(e.value, rel=1e-6)) for e in events.Scalars(tag)]
                   for tag in events.Tags()["scalars"]}
    logged = _by_tag((tag, step, value) for step, row in rows for tag, value in row.items()
                    if not tag.startswith("_") and not isinstance(value, dict))
    assert {"loss", "policy/reward", "eval/score", "time/round_s"} <= set(tensorboard)
    assert logged == tensorboard

    texts = _by_tag((tag, step, value) for step, row in rows for tag, value in row.items()
                    if isinstance(value, dict) and value.get("_type") == "html-file")
    assert [step for step, _ in texts["sample/response"]] == [
        e.step for e in events.Tensors("sample/response")] == [1, 2, 3, 4, 5]
    media = [path for run in runs for path in (run["folder"] / "files").rglob("*.html")]
    shown = [path.read_text() for path in media]
    for round_ in range(1, 6):  # escaped, so the page shows the text itself
        assert [f">round {round_}: {html.escape(TEXT)}</pre>" in page for page in shown
                ].count(True) == 1


def test_wandb_is_written_by_process_0_only(tmp_path, monkeypatch):
    monkeypatch.setattr(jax, "process_index", lambda: 1)
    writers = open_writers(str(tmp_path / "tensorboard"), SETTINGS, workdir=str(tmp_path),
                           config={})
    writers.scalars(1, {"loss": 1.0})
    writers.close()
    assert [type(writer) for writer in writers.writers] == [SummaryWriter]
    assert not (tmp_path / WANDB_RUN_ID).exists() and not (tmp_path / "wandb").exists()


def test_logging_wandb_without_wandb_installed_fails_at_the_config_check(monkeypatch):
    assert load_config(CONFIG, ["logging.wandb=true"]).logging.wandb  # installed: fine
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` now fails
    with pytest.raises(ConfigFileError, match=r"config\.logging\.wandb=True needs the wandb "
                       r"package.*pip install 'jaxrubric\[wandb\]'"):
        load_config(CONFIG, ["logging.wandb=true"])
    assert not load_config(CONFIG).logging.wandb  # off by default: wandb is not needed
