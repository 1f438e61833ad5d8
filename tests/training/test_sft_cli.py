"""`jaxrubric sft`: rows checked before any model loads, HealthBench rubrics rendered in the
rubric grammar, the loss falling on a tiny random generator, and `jaxrubric train` starting
from the written checkpoint with the same weights."""

from __future__ import annotations

import json
import shlex

import datasets
import jax
import numpy as np
import pytest
from flax import nnx
from helpers import CONFIGS
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tokenizer_fixtures import healthbench_rows

import jaxrubric
from jaxrubric import sft_command
from jaxrubric.cli import build_parser, main
from jaxrubric.config import load_config
from jaxrubric.data import DataError, prompt_text
from jaxrubric.eval.common import fill
from jaxrubric.roles import Role
from jaxrubric.rubric import templates as tpl
from jaxrubric.train import CoevolveTask

CONFIG = CONFIGS / "tiny_genrubric.py"
# Short prompts under the tiny tokenizer (7 to 58 tokens), and row 15, whose prompt has 2017.
SHORT_ROWS = (21, 19, 11, 14, 22, 6, 17, 10, 9, 2, 4, 13)
LONG_ROW = 15
# Short prompts, compact template: rows of ~100 tokens, so a step takes little time on CPU.
OVERRIDES = ["data.prompt_tokens=256", "rubric.template_style=compact"]
# HealthBench points -> the grammar's weights (-5..5), by hand: halved, away from zero.
WEIGHT = {10: 5, 9: 5, 8: 4, 7: 4, 6: 3, 5: 3, 4: 2, 3: 2, 2: 1, 1: 1}


@pytest.fixture(scope="module", autouse=True)
def _datasets_cache(tmp_path_factory):
    """Keeps the Arrow caches `datasets` writes for these temporary files out of ~/.cache."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path_factory.mktemp("hf_cache"))
        yield


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _weight(points):
    return WEIGHT[abs(points)] * (1 if points > 0 else -1)


def _load(data, rows, overrides=(), role="generator"):
    """`load_examples` on ``rows`` written to ``data`` (a fresh name per call: `datasets`
    caches what it read from a path)."""
    config = load_config(CONFIG, [*OVERRIDES, *overrides])
    tokenizer = jaxrubric.load_tokenizer(config.tokenizer)
    return sft_command.load_examples(_write(data, rows), config, role, tokenizer), tokenizer


def test_healthbench_rows_become_expert_rubrics_in_the_grammar(tmp_path):
    rows = [healthbench_rows()[i] for i in (18, 21)]
    loaded, tok = _load(tmp_path / "long.jsonl", rows, ["rubric.max_item_tokens=160"])
    assert loaded.format == "healthbench" and not loaded.problems
    # Row 18's three criteria all fit; row 21 has six: the three of most points are kept (7
    # and -7 tie, the earlier wins), in the row's order.
    expected = [[(_weight(c["points"]), " ".join(c["criterion"].split()))
                 for c in rows[0]["rubrics"]],
                [(_weight(rows[1]["rubrics"][i]["points"]), rows[1]["rubrics"][i]["criterion"])
                 for i in (0, 4, 5)]]
    assert [w for w, _ in expected[0]] == [5, 2, -4] and [w for w, _ in expected[1]] == [4, -5, -5]
    template = tpl.genrubric_generator_template(tok, max_items=3, style="compact")
    for example, row, items in zip(loaded.examples, rows, expected):
        assert example.target[-1] == tok.eos_token_id
        assert tok.decode(example.target[:-1]) == "".join(f"[{w}] {c}\n" for w, c in items)
        question = tok(prompt_text(row["prompt"]), add_special_tokens=False)["input_ids"]
        assert example.prompt == fill(template, [question])  # what the round shows the generator
    assert loaded.cuts == {"rubrics_cut": 1}

    loaded, tok = _load(tmp_path / "cut.jsonl", rows)  # rubric.max_item_tokens=6: cut
    assert loaded.cuts == {"rubrics_cut": 1, "criteria_cut": 6}
    first = tok.decode(loaded.examples[0].target[:-1]).splitlines()[0]
    assert first == "[5] " + tok.decode(tok.encode(" " + rows[0]["rubrics"][0]["criterion"])[:6]
                                        ).strip()


def test_bad_rows_name_the_file_row_and_field(tmp_path):
    good = {"prompt": "How much water should I drink?",
            "completion": "[3] Gives a dose.\n[-2] Is rude.\n"}
    cases = [
        ({"prompt": "Hi", "completion": 7}, "row 1: field 'completion' must be a string, got 7"),
        ({"completion": "[1] x.\n"}, "row 1: field 'prompt' is missing or null"),
        ({"prompt": "Hi", "completion": "[7] Gives a dose.\n"},
         "row 1: field 'completion' is not a rubric the round's grammar admits (lines '[w] "
         "criterion' with w one of [-5, -4, -3, -2, -1, 1, 2, 3, 4, 5], at most "
         "rubric.max_items=3"),
        ({"prompt": "Hi", "completion": "[1] a.\n[1] b.\n[1] c.\n[1] d.\n"},
         "row 1: field 'completion' is not a rubric the round's grammar admits"),
        ({"prompt": "word " * 300, "completion": "[1] a.\n"}, "row 1: field 'prompt' has "),
    ]
    for i, (bad, message) in enumerate(cases):
        data = tmp_path / f"case{i}.jsonl"
        with pytest.raises(DataError) as error:
            _load(data, [good, bad])
        assert str(error.value).startswith(f"{data} {message}")
    assert str(error.value).endswith("tokens, more than config.data.prompt_tokens=256")
    loaded, _ = _load(tmp_path / "all.jsonl", [good, *(bad for bad, _ in cases)],
                      ["data.skip_bad_rows=true"])
    assert len(loaded.examples) == 1  # every bad row left out, and said why, in row order
    assert [int(p.split(" row ")[1].split(":")[0]) for p in loaded.problems] == [1, 2, 3, 4, 5]

    penalties = json.loads(json.dumps(healthbench_rows()[21]))
    penalties["rubrics"][0]["points"] = 1  # the three largest are now all penalties
    with pytest.raises(DataError, match="row 0: field 'rubrics' keeps only penalties among its "
                                        "rubric.max_items=3 criteria of most points"):
        _load(tmp_path / "penalties.jsonl", [penalties])
    with pytest.raises(DataError, match="row 0: a HealthBench row teaches the generator"):
        _load(tmp_path / "healthbench.jsonl", [healthbench_rows()[21]], role="policy")

    # The policy learns its completion after the chat-formatted prompt, then eos.
    loaded, tok = _load(tmp_path / "policy.jsonl", [{"prompt": "Hi", "completion": "Hello."}],
                        ["data.policy_tokens=64"], role="policy")
    chat = tok.apply_chat_template([{"role": "user", "content": "Hi"}],
                                   add_generation_prompt=True, tokenize=False)
    assert tok.decode(loaded.examples[0].prompt) == chat
    assert loaded.examples[0].target == [*tok.encode("Hello.", add_special_tokens=False),
                                         tok.eos_token_id]


def test_the_command_stops_on_a_bad_row_before_any_model_loads(tmp_path, capsys, monkeypatch):
    rows = [healthbench_rows()[i] for i in SHORT_ROWS[:2]] + [healthbench_rows()[LONG_ROW]]
    data = _write(tmp_path / "hb.jsonl", rows)
    monkeypatch.setattr(sft_command, "role_model", lambda *a, **k: pytest.fail("model loaded"))
    argv = ["sft", "--config", str(CONFIG), "--data", str(data), "--workdir",
            str(tmp_path / "w"), *(f"--config.{o}" for o in OVERRIDES)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"jaxrubric sft: error: {data} row 2: field 'prompt' has 2017 tokens, more than " \
           "config.data.prompt_tokens=256" in err
    assert not (tmp_path / "w").exists()


@pytest.fixture(scope="module")
def sft_run(tmp_path_factory):
    """The command on the short HealthBench rows and the long one, skipped, for 40 steps."""
    root = tmp_path_factory.mktemp("sft")
    data = _write(root / "hb.jsonl", [healthbench_rows()[i] for i in (*SHORT_ROWS, LONG_ROW)])
    config = load_config(CONFIG, [*OVERRIDES, "data.skip_bad_rows=true",
                                  "optim.generator_lr=0.003", "log_every=10"])
    model, summary = sft_command.run_sft(config, data, root / "w", steps=40, progress=False)
    return root, data, model, summary


def test_sft_loss_falls_and_is_logged(sft_run):
    root, data, _, summary = sft_run
    assert summary["rows"] == len(SHORT_ROWS) and summary["bad_rows_skipped"] == 1
    assert "row 12: field 'prompt' has 2017 tokens" in summary["bad_rows"][0]
    assert summary["lr"] == 0.003 and summary["batch_size"] == 8 and summary["steps"] == 40
    assert json.loads((root / "w" / "sft_summary.json").read_text()) == summary
    events = EventAccumulator(str(root / "w" / "tensorboard"))
    events.Reload()
    assert {"sft/loss", "sft/accuracy", "sft/grad_norm"} <= set(events.Tags()["scalars"])
    losses = [(e.step, e.value) for e in events.Scalars("sft/loss")]
    assert [s for s, _ in losses] == [10, 20, 30, 40]
    assert [v for _, v in losses] == pytest.approx([h["loss"] for h in summary["history"]])
    assert losses[-1][1] < 0.6 * losses[0][1], losses


def test_train_starts_the_generator_from_the_sft_checkpoint(sft_run):
    root, _, model, summary = sft_run
    assert summary["checkpoint"] == str(root / "w" / "generator")
    config = load_config(CONFIG, [*OVERRIDES, f"generator.path={summary['checkpoint']}"])
    task = CoevolveTask(config)
    loaded = nnx.state(task.models[Role.GENERATOR], nnx.Param)
    trained = nnx.state(model, nnx.Param)
    assert jax.tree.structure(loaded) == jax.tree.structure(trained)
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
                 loaded, trained)
    assert jaxrubric.load_tokenizer(summary["checkpoint"]).get_vocab() == task.tokenizer.get_vocab()


def test_the_command_with_skip_bad_rows_and_an_existing_workdir(sft_run, tmp_path, capsys):
    root, data, _, _ = sft_run
    argv = ["sft", "--config", str(CONFIG), "--data", str(data), "--workdir", str(tmp_path),
            "--steps", "2", "--lr", "0.001", "--skip-bad-rows", "--no-progress",
            *(f"--config.{o}" for o in OVERRIDES)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert f"{len(SHORT_ROWS)} rows (1 bad rows skipped), 2 steps" in out
    assert f"--config.generator.path={tmp_path / 'generator'}" in out
    summary = json.loads((tmp_path / "sft_summary.json").read_text())
    assert summary["lr"] == 0.001 and summary["steps"] == 2
    with pytest.raises(SystemExit, match="already holds a checkpoint; give another --workdir"):
        main(argv)


@pytest.mark.parametrize("recipe", ["qwen3_8b_genrubric.py", "llama31_8b_genrubric.py"])
def test_the_recipes_show_sft_then_rl_with_commands_that_parse(recipe):
    text = (CONFIGS / recipe).read_text()
    docstring = text[3:text.index('"""', 3)]
    assert "SFT, then RL" in docstring
    commands = " ".join(line.strip() for line in docstring.splitlines()
                        if line.startswith("    ")).replace("\\ ", "").split("jaxrubric ")[1:]
    assert [c.split()[0] for c in commands] == ["sft", "train"]
    parsed = [build_parser().parse_known_args(shlex.split(c)) for c in commands]
    for args, extra in parsed:
        assert args.config == f"configs/{recipe}"
        assert extra and all(e.startswith("--config.") for e in extra), extra
    # The SFT overrides are keys of the config (the RL ones name a data file it would check).
    load_config(CONFIGS / recipe, [e.removeprefix("--config.") for e in parsed[0][1]])
    assert "--config.generator.path=/ckpt/sft/generator" in commands[1]
