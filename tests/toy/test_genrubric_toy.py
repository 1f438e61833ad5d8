"""The GenRubric toy world's pieces (expert rubrics, rubric following, held-out rows, the
agreement and coverage it reads back from a run's written rubrics), and the world itself,
evaluated on fewer queries, in which self-evolution must raise agreement with the expert
rubric above its control's."""

from __future__ import annotations

import dataclasses
import json
import random

import numpy as np
import pytest

from jaxrubric.data.loaders import load_healthbench
from jaxrubric.eval.metrics import agreement_metrics
from jaxrubric.toy import config_tree
from jaxrubric.toy import digits_task as task
from jaxrubric.toy import genrubric_report as report
from jaxrubric.toy import genrubric_warm_starts as gws
from jaxrubric.toy import genrubric_world as gw
from jaxrubric.toy import signed_rubrics as sr
from jaxrubric.toy.genrubric_config import RUNS, GenRubricWorldConfig


def test_the_expert_rubric_scores_answers_as_their_kept_digits_say():
    prompt = "big 3817295"  # big 8 7 9 5, small 3 1 2
    rubric = sr.expert_rubric(prompt)
    assert rubric == [("has 3", -3), ("has 8", 3), ("has 1", -3), ("has 7", 3), ("has 2", -3),
                      ("has 9", 3), ("has 5", 3)]
    assert sr.score(rubric, "8795") == 1.0
    assert sr.score(rubric, "795") == pytest.approx(3 / 4)
    assert sr.score(rubric, "38795") == pytest.approx(3 / 4)
    assert sr.score(rubric, "312") == pytest.approx(-3 / 4)
    assert sr.score([("has 3", -2)], "3") is None  # no positive weight: no scale
    # An "omits" item with the opposite sign ranks answers as the "has" item does.
    answers = ["8795", "795", "38795", "312", "3817295"]
    has = [sr.score([("has 8", 3), ("has 3", -2)], a) for a in answers]
    omits = [sr.score([("has 8", 3), ("omits 3", 2)], a) for a in answers]
    assert agreement_metrics(has, omits)["spearman"] == pytest.approx(1.0)


def test_following_a_rubric_keeps_and_drops_what_its_items_say_and_guesses_the_rest():
    prompt = "big 3817295"
    rubric = [("has 8", 2), ("has 3", -1), ("omits 1", 3), ("omits 7", -4), ("hs 9", 5)]
    assert [sr.keep_votes(rubric, d) for d in "3817295"] == [-1, 2, -3, 4, 0, 0, 0]
    answers = [sr.follow(prompt, rubric, random.Random(seed)) for seed in range(400)]
    for answer in answers:
        assert answer == "".join(d for d in task.digits_of(prompt) if d in answer)  # in order
        assert "8" in answer and "7" in answer and "3" not in answer and "1" not in answer
    for digit in "295":  # named by no item in the language ("hs 9" is not one)
        assert 0.4 < np.mean([digit in a for a in answers]) < 0.6
    # Conflicting items: the heavier side wins; a tie is a coin.
    assert sr.keep_votes([("has 8", 2), ("omits 8", 2)], "8") == 0
    assert sr.keep_votes([("has 8", 2), ("omits 8", 3)], "8") == -1


def test_sound_items_agree_with_the_expert_and_teacher_rubrics_are_partly_sound():
    rng = random.Random(0)
    for _ in range(300):
        prompt, _ = task.make_prompt(rng)
        item = sr.sound_item(prompt, rng)
        assert sr.item_soundness(prompt, item) is True
        target, copy = task.target_of(prompt), task.digits_of(prompt)
        rubric = sr.expert_rubric(prompt)
        assert sr.score(rubric, target) == 1.0 and sr.score(rubric, copy) < 1.0
    soundness = []
    for _ in range(2000):
        prompt, _ = task.make_prompt(rng)
        rubric = sr.teacher_rubric(prompt, rng, max_items=4, informed=0.5)
        assert 1 <= len(rubric) <= 4 and any(w > 0 for _, w in rubric)
        assert len({c for c, _ in rubric}) == len(rubric)
        assert all(task.in_language(c) and 1 <= abs(w) <= 5 for c, w in rubric)
        soundness += [s for s in (sr.item_soundness(prompt, i) for i in rubric) if s is not None]
    # Half sound by construction, half random (of which half sound by chance): 3/4.
    assert 0.70 < np.mean(soundness) < 0.80
    text = sr.rubric_text([("has 8", 3), ("omits 2", -1)])
    assert text == "[3] has 8\n[-1] omits 2\n"


def test_held_out_rows_have_eight_responses_of_distinct_expert_scores(tmp_path):
    rows = sr.expert_rows(40, seed=5)
    path = tmp_path / "eval.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    loaded = load_healthbench(path)
    assert not loaded.problems and len(loaded.records) == 40
    for record in loaded.records:
        prompt = record.messages[0]["content"]
        assert len(task.digits_of(prompt)) == sr.HELD_OUT_DIGITS
        assert record.responses[0] == task.target_of(prompt)
        assert task.digits_of(prompt) in record.responses  # the prompt copied
        assert all(record.responses)  # no empty completion
        expert = [(item.criterion, item.weight) for item in record.rubric]
        assert expert == sr.expert_rubric(prompt)
        scores = [sr.score(expert, r) for r in record.responses]
        assert len(record.responses) == 8 and len(set(scores)) == 8
        assert scores[0] == max(scores)


def test_per_query_agreement_reads_the_verifier_scores_and_rejudges_with_the_checker():
    prompt = "big 3817295"
    answers = sr.held_out_responses(prompt, random.Random(1))
    expert = [sr.score(sr.expert_rubric(prompt), a) for a in answers]
    sound = [[3, "has 8"], [-2, "has 3"], [2, "omits 1"]]
    unsound = [[3, "has 3"], [1, "has 8"]]
    judged = lambda rubric: [sr.score([(c, w) for w, c in rubric], a) for a in answers]  # noqa: E731
    row = {"id": "q", "row": 0, "valid": [True, True, False, True, True],
           "scores": [[s, u, 0.0, s, e] for s, u, e in zip(judged(sound), judged(unsound),
                                                           expert)],
           "rubrics": [sound, unsound, [], sound]}
    by_verifier = report.per_query_agreement([row], runs=3)
    by_checker = report.per_query_agreement([row], runs=3, responses={"q": answers},
                                        prompts={"q": prompt})
    # The verifier here is the checker: both readings agree, over the two valid sampled runs.
    want = np.mean([agreement_metrics(judged(r), expert)["spearman"] for r in (sound, unsound)])
    assert by_verifier["spearman"] == pytest.approx([want])
    assert by_checker["spearman"] == pytest.approx([want])
    interval = report.paired_interval([0.5, 0.7, 0.6, None], [0.1, 0.2, 0.3, 0.0], seed=0,
                                  resamples=500)
    assert interval["queries"] == 3 and interval["mean"] == pytest.approx(0.4)
    assert interval["low"] <= 0.4 <= interval["high"]


@pytest.mark.parametrize("tokenizer_name", ["toy", "tiny_bpe"])
def test_an_expert_criterion_is_encoded_as_the_parser_reads_a_generated_item(
        tokenizer_name, tmp_path):
    """The verifier reads expert criteria as it reads generated items: the same tokens, with
    or without a space token of its own (the toy tokenizer) or merged (a BPE's ``Ġhas``)."""
    import jax

    import jaxrubric
    from jaxrubric.eval import common
    from jaxrubric.rubric import grammar as grammar_lib

    if tokenizer_name == "toy":
        tok = jaxrubric.load_tokenizer(task.build_tokenizer(tmp_path / "tok"))
        criteria = ["has 3", "omits 7"]
    else:
        from helpers import tiny_tokenizer

        tok = tiny_tokenizer()
        criteria = ["Mentions the dose", "Recommends aspirin"]
    grammar = grammar_lib.build_rubric_grammar(tok, weights=(-3, 3), max_items=2,
                                               max_item_tokens=8)
    line = "".join(f"[3] {c}\n" for c in criteria)
    ids = tok.encode(line, add_special_tokens=False) + [tok.eos_token_id]
    parsed = grammar_lib.parse_rubric_tokens(np.asarray([ids + [tok.pad_token_id] * 4]),
                                             jax.device_put(grammar), tok.pad_token_id)
    for m, criterion in enumerate(criteria):
        want = np.asarray(parsed.items)[0, m, :int(parsed.item_lengths[0, m])].tolist()
        assert common.item(tok, criterion, 3, 8).ids == want, criterion


def test_rubric_coverage_counts_what_each_logged_rubric_names_of_its_query(tmp_path):
    from jaxrubric.toy import diagnostics

    prompt = task.INSTRUCTION + "9817204"  # big digits 9, 8, 7
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "eval.jsonl").write_text(
        json.dumps(sr.expert_row("q", prompt, random.Random(0))) + "\n")
    run = tmp_path / "runs" / "evolving"
    run.mkdir(parents=True)
    rubrics = [
        # 9 kept (sound), 2 dropped (sound), 5 absent, 9 repeated with the sign that agrees
        [[3, "has 9"], [-2, "has 2"], [4, "omits 5"], [1, "omits 9"]],
        # 8 asked to be dropped (unsound) and an item outside the language
        [[2, "omits 8"], [1, "hs 7"]],
        [[5, "has 7"]],  # the greedy rubric, written last: left out
    ]
    # A resumed run logs round 0 again: the later row is the one read.
    superseded = {"round": 0, "id": "q", "row": 0, "rubrics": [[[1, "has 1"]], [[1, "has 2"]]]}
    (run / "eval_scores.jsonl").write_text("".join(json.dumps(r) + "\n" for r in (
        superseded, {"round": 0, "id": "q", "row": 0, "rubrics": rubrics})))
    coverage = diagnostics.rubric_coverage(tmp_path)
    assert list(coverage) == [0]
    c = coverage[0]
    assert c["items"] == 3.0  # (4 + 2) / 2
    assert c["in_language"] == pytest.approx(5 / 6)
    assert c["absent"] == pytest.approx(1 / 5)  # "omits 5" of the 5 items in the language
    assert c["repeated"] == pytest.approx(1 / 5)  # the second item on 9
    # On the query's digits: has 9, has 2 (w < 0), omits 9 (w > 0: unsound), omits 8 (unsound).
    assert c["sound"] == pytest.approx(2 / 4)
    assert c["distinct_digits"] == pytest.approx((2 + 1) / 2)  # {9, 2} and {8}
    # Net instructions: keep 9 (3 - 1 > 0, right), drop 2 (right); drop 8 (wrong).
    assert c["sound_digits"] == pytest.approx((2 + 0) / 2)


def test_method_picks_a_toy_world_and_is_refused_with_a_config(tmp_path):
    from helpers import ROOT

    from jaxrubric.cli import main

    with pytest.raises(SystemExit, match="--method picks a toy world"):
        main(["train", "--method", "genrubric", "--config",
              str(ROOT / "configs" / "tiny_genrubric.py"), "--workdir", str(tmp_path)])
    with pytest.raises(ValueError, match="unknown GenRubric toy runs"):
        GenRubricWorldConfig(runs=("evolving", "frozen"))


@pytest.mark.slow
def test_run_config_carries_the_worlds_round(tmp_path):
    """Both runs train with the world's round config as it is (its sampling temperatures,
    advantages and induced responses among it); the control only shuffles the credit."""
    cfg = GenRubricWorldConfig()
    paths = gw.write_data(tmp_path, GenRubricWorldConfig(eval_queries=2))
    assert (cfg.round.generator.temperature, cfg.round.policy.temperature,
            cfg.round.generator.advantage_mode, cfg.round.policy.advantage_mode,
            cfg.round.induced_responses) == (0.7, 0.5, "no_std", "no_std", 2)
    for name in RUNS:
        c = gw.run_config(name, tmp_path, paths, cfg).round.to_dict()
        assert c.pop("shuffle_generator_credit") == (name == "control")
        own = dataclasses.asdict(cfg.round)
        del own["shuffle_generator_credit"]
        assert c == own
    # A study's round setting reaches the runs.
    over = config_tree.replace(cfg, {"round.generator.temperature": 1.0})
    assert gw.run_config("evolving", tmp_path, paths, over).round.generator.temperature == 1.0


@pytest.mark.slow
def test_the_answerer_trains_in_stages_until_it_follows_the_rubrics_it_is_shown(tmp_path):
    import jax

    import jaxrubric
    from jaxrubric import sharding as shd

    tokenizer = jaxrubric.load_tokenizer(task.build_tokenizer(tmp_path / "tokenizer"))
    mesh = shd.make_mesh({"fsdp": 1}, devices=jax.devices()[:1])
    tiny = dict(answerer_steps=2, answerer_hidden_size=16, answerer_layers=1, sft_batch=4,
                answerer_stages=2)

    def stages(workdir, follows):
        gws.warm_start("policy", workdir, tokenizer, mesh,
                      GenRubricWorldConfig(answerer_follows=follows, **tiny))
        history = json.loads((workdir / "models" / "policy" / "sft_history.json").read_text())
        checks = [h for h in history if "follows_named_digits" in h]
        # The world's rubric-following stage reads the saved answerer's last check.
        kept = json.loads((workdir / gws.FOLLOWING).read_text())
        assert kept["follows_named_digits"] == checks[-1]["follows_named_digits"]
        return [h["step"] for h in history], checks

    # Never following well enough: every stage runs, each checked after its steps.
    steps, checks = stages(tmp_path / "never", 1.01)
    assert steps == [1, 2, 3, 4] and [c["step"] for c in checks] == [2, 4]
    assert all(0 <= c["follows_named_digits"] <= 1 for c in checks)
    # Following at least as well as asked after the first stage: it stops there.
    steps, checks = stages(tmp_path / "at_once", 0.0)
    assert steps == [1, 2] and [c["step"] for c in checks] == [2]
    assert (tmp_path / "at_once" / "models" / "policy" / "config.json").exists()


def test_train_method_genrubric_runs_the_genrubric_world(tmp_path, monkeypatch):
    from jaxrubric.cli import main

    calls = []
    monkeypatch.setattr(gw, "run_genrubric_world",
                        lambda workdir, cfg, jobs=None, from_scratch=False:
                        calls.append((workdir, cfg)))
    assert main(["train", "--method", "genrubric", "--seed", "3", "--rounds", "7",
                 "--workdir", str(tmp_path)]) == 0
    assert calls == [(str(tmp_path), GenRubricWorldConfig(seed=3, rounds=7))]


# The defaults evaluated at the start and the end only, on half the held-out queries, from the
# warm starts shipped with the package (this config's start settings are the defaults',
# `toy/warm_starts.py`). Over the training draws of the defaults (warm starts trained in ways
# that differ only in rounding: README) the rise and the lead over the shuffled-credit control
# on those queries were never below about twice what the test asks
# (docs/toy_worlds_measured.md). Runs are deterministic on one machine; another CPU's rounding
# is another draw.
SHORT = GenRubricWorldConfig(eval_every=40, eval_queries=64, bootstrap=1000)


@pytest.mark.slow
def test_the_world_raises_agreement_above_its_control_and_recomputes_the_logged_one(
        tmp_path):
    import dataclasses
    import subprocess
    import sys

    from xla_flags import as_a_user_runs

    from jaxrubric.train_loop import read_eval_history

    workdir = tmp_path / "genrubric"
    default = dataclasses.asdict(GenRubricWorldConfig())
    over = {k: v for k, v in dataclasses.asdict(SHORT).items() if v != default[k]}
    script = ("import json, sys\nfrom jaxrubric.toy import genrubric_world as gw\n"
              "gw.run_genrubric_world(sys.argv[1], gw.GenRubricWorldConfig(**json.loads("
              "sys.argv[2])))\n")
    subprocess.run([sys.executable, "-c", script, str(workdir), json.dumps(over)],
                   env=as_a_user_runs(),  # one CPU device, as `jaxrubric train` runs
                   check=True, timeout=1800)
    summary = json.loads((workdir / "summary.json").read_text())
    assert summary["rounds"] == [0, 40]
    for name in ("evolving", "control", "checker_judged"):
        assert set(summary[name]) == {"spearman", "kendall_tau_b", "top1", "pairwise"}
        assert all(len(v) == 2 for v in summary[name].values())
    # Both runs start from the same cold start and evaluate with the same key.
    assert summary["evolving"]["pairwise"][0] == summary["control"]["pairwise"][0]
    # The claim, with margins about half the smallest of nine draws (above).
    intervals = summary["intervals"]
    assert intervals["evolving_rise"]["spearman"]["mean"] >= 0.055, intervals["evolving_rise"]
    assert intervals["evolving_minus_control"]["spearman"]["mean"] >= 0.07, intervals
    assert summary["evolving"]["pairwise"][-1] > summary["control"]["pairwise"][-1]
    assert set(summary["rubric_following"]) == {"follows_named_digits", "keeps_unnamed_digits",
                                                "in_order"}
    assert summary["rubric_following"]["follows_named_digits"] > 0.8
    # The summary's verifier-judged agreement is the one the training loop logged.
    for name in RUNS:
        logged = read_eval_history(workdir / "runs" / name)
        for metric, key in report.METRICS.items():
            for entry, value in zip(logged, summary[name][key]):
                if f"eval/agreement/{metric}" in entry:
                    assert value == pytest.approx(entry[f"eval/agreement/{metric}"], abs=1e-9)
    assert (workdir / "agreement.png").stat().st_size > 1000
    assert set(json.loads((workdir / "timings.json").read_text())) == {
        "warm start: verifier", "warm start: policy", "warm start: generator_cold",
        "rubric following", "run: evolving", "run: control", "world"}
