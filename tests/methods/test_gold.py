"""The gold metric of `config.data.gold` (`methods.gold`, `dynamic_rubric.gold_evaluation`): the
policy's answers scored by expert rubrics, against the unshared verifier and HealthBench's
formula in NumPy, and in a run, where the watch reads it."""

import json
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx
from helpers import QUESTIONS, round_case, tiny_tokenizer

from jaxrubric.cli import main
from jaxrubric.config import ConfigFileError, load_config
from jaxrubric.methods import DYNAMIC_RUBRIC, dynamic_rubric
from jaxrubric.methods.dynamic_rubric import DynamicRubricConfig
from jaxrubric.methods.gold import load_gold_rows
from jaxrubric.roles import Role
from jaxrubric.rubric import verifier as ver
from jaxrubric.train_loop import read_eval_history

CONFIGS = Path(__file__).parents[2] / "configs"
RUBRICS = [[("lists the digits in order", 5), ("names the digits", 2), ("adds a letter", -3)],
           [("writes the word backwards", 4), ("is polite", 1)]]


def _gold_file(path: Path, questions, rubrics) -> Path:
    rows = [{"prompt_id": f"g{i}", "prompt": [{"role": "user", "content": q}],
             "rubrics": [{"criterion": c, "points": p} for c, p in rubric]}
            for i, (q, rubric) in enumerate(zip(questions, rubrics, strict=True))]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_the_gold_score_is_healthbench_s_score_of_the_policys_answers(round_mesh, tmp_path):
    # Soft verdicts: the untrained verifier's p_yes, so every score is a fraction.
    config = DynamicRubricConfig(num_responses=3, num_rubrics=2, response_tokens=6,
                                 soft_verdicts=True)
    case = round_case(DYNAMIC_RUBRIC, config, round_mesh)
    rows = load_gold_rows(_gold_file(tmp_path / "gold.jsonl", QUESTIONS, RUBRICS),
                          case.tokenizer, size=2, prompt_tokens=16, policy_tokens=32,
                          item_tokens=6)
    gold, rng = rows.batch, jax.random.key(5)
    out = jax.device_get(jax.jit(lambda s, f, g, r: DYNAMIC_RUBRIC.gold_evaluate(
        case.setup, s, f, g, r))(case.state, case.frozen, gold, rng))

    # The same answers (the round's respond stage, the same key), judged item by item by the
    # unshared verifier, scored by HealthBench's formula.
    responses, text_len = jax.device_get(jax.jit(lambda s, g: dynamic_rubric.respond(
        case.setup, s.policy.params, g.policy, dynamic_rubric.round_keys(rng).respond))(
            case.state, gold))
    prefix = ver.verifier_prefix(case.setup.verifier_template, gold.question.tokens,
                                 gold.question.lengths, responses.tokens, text_len,
                                 pad_id=case.setup.pad_id)
    verifier = nnx.merge(case.setup.graph(Role.VERIFIER), case.frozen.verifier)
    p_yes = np.asarray(ver.verify_per_item(
        verifier, case.setup.readout, prefix.tokens, prefix.lengths, gold.items[:, None],
        gold.item_lengths[:, None], gold.valid[:, None], pad_id=case.setup.pad_id).p_yes)
    per_prompt = []
    for b, rubric in enumerate(RUBRICS):
        points = np.array([p for _, p in rubric], np.float64)
        met = p_yes[b, :, 0, :len(rubric)].astype(np.float64)  # [K, items]
        per_prompt.append(np.mean(met @ points / points[points > 0].sum()))
    per_prompt = np.array(per_prompt)
    assert 0 < per_prompt.min() and per_prompt.max() < 1
    assert out["gold_score"] == pytest.approx(np.clip(per_prompt.mean(), 0, 1), abs=1e-5)
    assert out["gold_score_se"] == pytest.approx(per_prompt.std() / np.sqrt(2), abs=1e-5)


def test_gold_rows_are_checked_before_any_model(tmp_path):
    path = _gold_file(tmp_path / "gold.jsonl", ["a very long prompt " * 20], [RUBRICS[1]])
    tokenizer = tiny_tokenizer()
    with pytest.raises(ValueError, match="gold.jsonl.*row 0: prompt has .* tokens"):
        load_gold_rows(path, tokenizer, size=1, prompt_tokens=8, policy_tokens=16,
                       item_tokens=6)
    with pytest.raises(ValueError, match="1 rows, the gold batch needs 2"):
        load_gold_rows(path, tokenizer, size=2, prompt_tokens=200, policy_tokens=300,
                       item_tokens=6)
    with pytest.raises(ConfigFileError, match="GenRubric's policy answers while shown"):
        load_config(CONFIGS / "tiny_genrubric.py", [f"data.gold={path}"])


@pytest.mark.slow
def test_a_run_logs_the_gold_metric_at_every_evaluation(tmp_path):
    questions = ["Sort the digits 6 6 0 4 in ascending order.", "Reverse the word dog."] * 4
    gold = _gold_file(tmp_path / "gold.jsonl", questions, RUBRICS * 4)
    assert main(["train", "--config", str(CONFIGS / "tiny_dynamic_rubric.py"),
                 "--config.rounds=2", "--config.eval_every=1", f"--config.data.gold={gold}",
                 "--config.round.response_tokens=8", "--config.rubric.max_items=2",
                 "--workdir", str(tmp_path / "run")]) == 0
    history = read_eval_history(tmp_path / "run")
    assert [h["round"] for h in history] == [0, 1, 2]
    assert all(0 <= h["eval/gold_score"] <= 1 and h["eval/gold_score_se"] >= 0
               for h in history)
