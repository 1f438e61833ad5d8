"""The round's telemetry (`rewards.telemetry`) against a NumPy recomputation from the same round's
rubric cards (`methods.cards`), on tiny DynamicRubric and GenRubric runs that card every prompt."""

import json
from pathlib import Path
from types import SimpleNamespace

import jax
import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from jaxrubric.cli import main
from jaxrubric.methods.cards import build_cards, read_cards
from jaxrubric.rewards.telemetry import Judgement, round_telemetry

CONFIGS = Path(__file__).parents[2] / "configs"
# Soft verdicts: the tiny random verifier's p_yes spreads around 0.5, so items pass for some
# answers and not others and every metric has something to count.
SMALL = ["--config.round.response_tokens=8", "--config.rubric.max_items=3",
         "--config.round.soft_verdicts=true", "--config.logging.card_every=1",
         "--config.logging.card_prompts=8"]
PASS = 0.5


def _mean(values):
    return float(np.mean(values)) if len(values) else 0.0


def _items(cards):
    """(rubric, index, item) of every item of a rubric that scores answers."""
    return [(r, k, i) for c in cards for r in c["rubrics"] if r["valid"]
            for k, i in enumerate(r["items"])]


def _saturated(item):
    passed = np.asarray(item["verdicts"]) > PASS
    return bool(passed.all() or not passed.any())


def _duplicate(rubric, k):
    earlier = rubric["items"][:k]
    return any(o["token_ids"] == rubric["items"][k]["token_ids"] for o in earlier)


def _redundant(rubric, k):
    mine = np.asarray(rubric["items"][k]["verdicts"]) > PASS
    return any(np.array_equal(np.asarray(o["verdicts"]) > PASS, mine)
               for j, o in enumerate(rubric["items"]) if j != k)


def _correlation(card):
    rows = [a for a in card["answers"] if a["rewarded"]]
    x = np.array([a["reward"] for a in rows], np.float64)
    y = np.array([a["length"] for a in rows], np.float64)
    if len(rows) == 0:
        return None
    sxx, syy = np.var(x), np.var(y)
    if sxx <= 1e-12 or syy <= 1e-12:
        return None
    return float(np.mean((x - x.mean()) * (y - y.mean())) / np.sqrt(sxx * syy))


def recompute(cards):
    """Every telemetry scalar of a round, from its cards alone."""
    items = _items(cards)
    rubrics = [r for c in cards for r in c["rubrics"]]
    valid = [r for r in rubrics if r["valid"]]
    weights = np.array([i["weight"] for _, _, i in items], np.float64)
    saturated = np.array([_saturated(i) for _, _, i in items], bool)
    p = np.array([np.mean(i["verdicts"]) for _, _, i in items], np.float64)
    lengths = np.array([a["length"] for c in cards for a in c["answers"]], np.float64)
    rewards = [[a["reward"] for a in c["answers"] if a["rewarded"]] for c in cards]
    correlations = [x for x in map(_correlation, cards) if x is not None]
    out = {
        "generator/saturated_items": _mean(saturated),
        "generator/saturated_weight": float(np.abs(weights)[saturated].sum()
                                            / max(np.abs(weights).sum(), 1e-9)),
        "generator/item_discriminability": _mean(p * (1 - p)),
        "generator/invalid_rubrics": 1 - _mean([r["valid"] for r in rubrics]),
        "generator/truncated_rubrics": 1 - _mean([r["complete"] for r in rubrics]),
        "generator/items_per_rubric": _mean([len(r["items"]) for r in valid]),
        "generator/weight_mean": _mean(weights),
        "generator/weight_std": float(np.std(weights)) if len(weights) else 0.0,
        "generator/rubric_tokens": _mean([r["length"] for r in valid]),
        "generator/duplicate_items": _mean([_duplicate(r, k) for r, k, _ in items]),
        "policy/tied_prompts": _mean([not r or max(r) == min(r) for r in rewards]),
        "policy/length_mean": float(lengths.mean()),
        "policy/length_std": float(lengths.std()),
        "policy/score_length_corr": _mean(correlations),
    }
    if cards[0]["method"] == "genrubric":
        out["generator/redundant_items"] = _mean([_redundant(r, k) for r, k, _ in items])
    return {f"telemetry/{name}": value for name, value in out.items()}


def _logged(workdir):
    events = EventAccumulator(str(workdir / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: {e.step: e.value for e in events.Scalars(tag)}
            for tag in events.Tags()["scalars"] if tag.startswith("telemetry/")}


@pytest.mark.slow
@pytest.mark.parametrize(("config", "rounds"), [("tiny_dynamic_rubric.py", 3),
                                                ("tiny_genrubric.py", 2)])
def test_telemetry_equals_numpy_over_the_rounds_cards(tmp_path, config, rounds):
    assert main(["train", "--config", str(CONFIGS / config), f"--config.rounds={rounds}",
                 "--workdir", str(tmp_path), *SMALL]) == 0
    logged = _logged(tmp_path)
    cards = read_cards(str(tmp_path / "cards.jsonl"))
    assert sorted({c["round"] for c in cards}) == list(range(1, rounds + 1))
    spread = 0.0
    for round_ in range(1, rounds + 1):
        these = [c for c in cards if c["round"] == round_]
        assert len(these) == 8  # every prompt of the batch
        expected = recompute(these)
        assert set(expected) == set(logged), set(expected) ^ set(logged)
        for name, value in expected.items():
            assert logged[name][round_] == pytest.approx(value, abs=1e-5), (round_, name)
        spread += expected["telemetry/generator/item_discriminability"]
    assert spread > 0  # items that pass for some answers and not others were counted
    # The same scalars are in metrics.jsonl, the file `jaxrubric inspect` reads.
    lines = [json.loads(line) for line in open(tmp_path / "metrics.jsonl", encoding="utf-8")]
    assert [line["round"] for line in lines] == list(range(1, rounds + 1))
    for line in lines:
        for name in expected:
            assert line[name] == pytest.approx(logged[name][line["round"]], abs=1e-6)


class _Tokens:
    """A tokenizer stand-in: ids as text."""

    def decode(self, ids):
        return " ".join(map(str, ids))


@pytest.mark.parametrize("method", ["dynamic_rubric", "genrubric"])
@pytest.mark.parametrize("soft", [False, True])
def test_telemetry_equals_numpy_on_constructed_rounds(method, soft):
    """Arrays made to hold every case: items all answers pass, none pass and some; duplicate
    and redundant items; invalid and truncated rubrics; tied prompts; lengths that vary with the
    rewards; answers without a reward."""
    rng = np.random.default_rng(3)
    b, a, g, m, li = 6, 5, 3, 4, 3
    verdicts = (rng.random((b, a, g, m)) < 0.5).astype(np.float32)
    verdicts[:, :, 0, 0], verdicts[:, :, 1, 1] = 1.0, 0.0  # saturated either way
    verdicts[:, :, 2, 3] = verdicts[:, :, 2, 2]  # the same fingerprint: redundant
    if soft:
        verdicts = np.clip(verdicts * 0.6 + rng.random(verdicts.shape) * 0.4, 0, 1)
    items = rng.integers(1, 3, (b, g, m, li)).astype(np.int32)
    items[:, 0, 1] = items[:, 0, 0]  # a duplicated item
    item_lengths = rng.integers(1, li + 1, (b, g, m)).astype(np.int32)
    item_lengths[:, 0, 1] = item_lengths[:, 0, 0]
    item_valid = rng.random((b, g, m)) < 0.8
    complete = rng.random((b, g)) < 0.75  # a rubric cut off by the token limit is invalid
    group_valid = complete & (rng.random((b, g)) < 0.9)
    weights = rng.integers(1, 6, (b, g, m)) * (rng.choice([-1, 1], (b, g, m))
                                               if method == "genrubric" else 1)
    reward = rng.random((b, a)).astype(np.float32)
    reward[0] = 0.25  # a tied prompt
    lengths = rng.integers(3, 12, (b, a)).astype(np.int32)
    lengths[1] = np.argsort(reward[1]) + 4  # lengths that follow the reward
    reward_valid = (rng.random((b, a)) < 0.8) if method == "genrubric" else np.ones((b, a), bool)
    judgement = Judgement(verdicts, weights.astype(np.int32), item_valid, group_valid, complete,
                          items, item_lengths, reward, reward_valid, lengths)
    rubric_lengths = rng.integers(5, 30, (b, g)).astype(np.int32)
    scalars = jax.device_get(round_telemetry(jax.tree.map(np.asarray, judgement),
                                             rubric_lengths, redundancy=method == "genrubric"))
    outputs = SimpleNamespace(
        judgement=judgement, responses=rng.integers(1, 9, (b, a, 12)),
        rubrics=rng.integers(1, 9, (b, g, 30)), rubric_len=rubric_lengths,
        scores=rng.random((b, a, g)), policy_advantages=rng.normal(size=(b, a)),
        generator_reward=rng.random((b, g)), generator_advantages=rng.normal(size=(b, g)),
        item_reward=rng.random((b, g, m)) if method == "genrubric" else None)
    cards = build_cards(outputs, (rng.integers(1, 9, (b, 10)), np.full(b, 10)), _Tokens(),
                        round_=1, method=method, soft_verdicts=soft,
                        answers_per_group=1 if method == "genrubric" else None)
    expected = recompute(json.loads(json.dumps(cards)))
    assert set(expected) == set(scalars)
    for name, value in expected.items():
        assert float(scalars[name]) == pytest.approx(value, abs=1e-5), name
    for name in ("saturated_items", "duplicate_items", "invalid_rubrics", "truncated_rubrics"):
        assert 0 < expected[f"telemetry/generator/{name}"] < 1, name
    assert 0 < expected["telemetry/policy/tied_prompts"] < 1
    assert expected["telemetry/policy/score_length_corr"] != 0
