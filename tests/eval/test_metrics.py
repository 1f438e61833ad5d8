"""Agreement and reward-benchmark metrics against scipy and hand-computed values."""

import json
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from jaxrubric.eval.metrics import (
    agreement_table,
    aggregate,
    delta_gap,
    delta_gap_from_ranks,
    kendall_tau_b,
    listwise_ranking_accuracy,
    pairwise_accuracy,
    pairwise_preference_accuracy,
    preference_pairs,
    spearman,
    top1_consistency,
)

DATA = Path(__file__).parents[1] / "data"


def _prometheus_queries():
    """Expert score per response: the mean of its 3 GPT-4 scores, grouped by MT-Bench question
    (the 48 rows are 12 questions x 4 responses)."""
    with open(DATA / "prometheus_mt_bench_eval_48rows.json") as f:
        rows = json.load(f)
    grouped = defaultdict(list)
    for row in rows:
        grouped[row["idx"]].append(float(np.mean(row["gpt4_score"])))
    return [np.array(scores) for scores in grouped.values()]


# ---------------------------------------------------------------- correlations vs scipy


def _random_pairs():
    for seed in range(200):
        rng = np.random.default_rng(seed)
        n = int(rng.integers(2, 40))
        if seed % 2:
            yield rng.integers(0, 3, n), rng.integers(0, 3, n)
        else:
            yield rng.normal(size=n), rng.normal(size=n)


def test_spearman_matches_scipy():
    checked = 0
    for g, e in _random_pairs():
        ours = spearman(g, e)
        if np.ptp(g) == 0 or np.ptp(e) == 0:
            assert ours is None
            continue
        assert ours == pytest.approx(stats.spearmanr(g, e).statistic, abs=1e-12)
        checked += 1
    assert checked > 150


def test_kendall_tau_b_matches_scipy():
    checked = 0
    for g, e in _random_pairs():
        ours = kendall_tau_b(g, e)
        if np.ptp(g) == 0 or np.ptp(e) == 0:
            assert ours is None
            continue
        reference = stats.kendalltau(g, e, variant="b").statistic
        assert ours == pytest.approx(reference, abs=1e-12)
        checked += 1
    assert checked > 150


@pytest.mark.parametrize("metric", [spearman, kendall_tau_b])
def test_correlations_undefined_cases(metric):
    assert metric([1, 1, 1], [1, 2, 3]) is None
    assert metric([1, 2, 3], [0.5, 0.5, 0.5]) is None
    assert metric([1], [2]) is None
    assert metric([], []) is None
    assert metric([1, 2, 3], [1, 2, 3]) == pytest.approx(1.0)
    assert metric([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)


def test_bad_inputs_raise():
    with pytest.raises(ValueError):
        spearman([1, 2], [1, 2, 3])
    with pytest.raises(ValueError):
        kendall_tau_b([1, np.nan], [1, 2])
    with pytest.raises(ValueError):
        pairwise_accuracy([[1, 2]], [[1, 2]])
    with pytest.raises(ValueError):
        delta_gap([1.0, 2.0], [(0, 2)])
    with pytest.raises(ValueError):
        delta_gap([1.0, 2.0], [(-1, 0)])
    with pytest.raises(ValueError):
        listwise_ranking_accuracy([1.0, 2.0], [1, 2, 3])


# ---------------------------------------------------------------- top-1 and pairwise


def test_top1_consistency_with_ties():
    assert top1_consistency([3, 1, 2], [5, 4, 1]) == 1.0
    assert top1_consistency([3, 1, 2], [4, 5, 1]) == 0.0
    # Both generated top responses must be expert top responses.
    assert top1_consistency([3, 3, 1], [5, 5, 0]) == 1.0
    assert top1_consistency([3, 3, 1], [5, 4, 0]) == 0.0
    # One generated top inside a tied expert top set is enough.
    assert top1_consistency([3, 2, 1], [5, 5, 0]) == 1.0
    # A constant generated vector names every response as top.
    assert top1_consistency([1, 1, 1], [2, 1, 0]) == 0.0
    assert top1_consistency([1, 1, 1], [2, 2, 2]) == 1.0
    assert top1_consistency([7], [0]) == 1.0
    assert top1_consistency([], []) is None


def test_top1_float_ties_within_tolerance():
    third = np.float32(1) / np.float32(3)
    noisy = float(third) + 1e-8
    # Rounding noise must not decide which expert response is top ...
    assert top1_consistency([1.0, 0.0, 0.0], [float(third), noisy, 0.0]) == 1.0
    assert top1_consistency([1.0, 0.0, 0.0], [float(third), noisy, 0.0], tol=0.0) == 0.0
    # ... nor single out one generated response from a tie.
    assert top1_consistency([noisy, float(third), 0.0], [1.0, 0.9, 0.0]) == 0.0
    assert top1_consistency([noisy, float(third), 0.0], [1.0, 0.9, 0.0], tol=0.0) == 1.0


def test_pairwise_accuracy_three_way():
    # pairs (0,1) (0,2) (0,3) (1,2) (1,3) (2,3)
    generated = [3, 3, 1, 2]  # tie, >, >, >, >, <
    expert = [5, 4, 1, 1]  # >, >, >, >, >, tie
    assert pairwise_accuracy(generated, expert) == pytest.approx(4 / 6)
    assert pairwise_accuracy([1, 1, 1], [2, 2, 2]) == 1.0
    assert pairwise_accuracy([1, 2, 3], [3, 2, 1]) == 0.0
    assert pairwise_accuracy([1], [1]) is None


def test_pairwise_accuracy_tolerance():
    assert pairwise_accuracy([0.5, 0.5 + 1e-9], [1, 1]) == 1.0
    assert pairwise_accuracy([0.5, 0.5 + 1e-9], [1, 1], tol=0.0) == 0.0


# ---------------------------------------------------------------- reward benchmarks


def test_pairwise_preference_accuracy_ties_count_half():
    chosen = [0.9, 0.5, 0.2, 0.7]
    rejected = [0.1, 0.5, 0.8, 0.7]
    assert pairwise_preference_accuracy(chosen, rejected) == pytest.approx((1 + 0.5 + 0 + 0.5) / 4)
    assert pairwise_preference_accuracy([], []) is None


def test_preference_pairs_from_ranks():
    assert preference_pairs([2, 1, 3, 1]) == [(0, 2), (1, 0), (1, 2), (3, 0), (3, 2)]
    assert preference_pairs([1, 1]) == []


def test_listwise_ranking_accuracy():
    ranks = [2, 1, 3]
    assert listwise_ranking_accuracy([0.5, 0.9, 0.1], ranks) == 1.0
    assert listwise_ranking_accuracy([0.9, 0.5, 0.1], ranks) == 0.0
    # A score tie across a reference preference fails.
    assert listwise_ranking_accuracy([0.5, 0.5, 0.1], ranks) == 0.0
    # Reference ties leave the order of their members free.
    assert listwise_ranking_accuracy([0.3, 0.9, 0.1], [1, 1, 2]) == 1.0
    assert listwise_ranking_accuracy([0.3, 0.3, 0.1], [1, 1, 2]) == 1.0
    assert listwise_ranking_accuracy([0.3, 0.9, 0.5], [1, 1, 2]) == 0.0
    assert listwise_ranking_accuracy([0.3, 0.9], [1, 1]) is None


def test_delta_gap():
    scores = [0.9, 0.4, 0.6]
    assert delta_gap(scores, [(0, 1), (2, 1)]) == pytest.approx(((0.9 - 0.4) + (0.6 - 0.4)) / 2)
    assert delta_gap(scores, []) is None
    # ranks: 0 best, then 2, then 1 -> pairs (0,1) (0,2) (2,1)
    expected = ((0.9 - 0.4) + (0.9 - 0.6) + (0.6 - 0.4)) / 3
    assert delta_gap_from_ranks(scores, [1, 3, 2]) == pytest.approx(expected)
    assert delta_gap_from_ranks(scores, [1, 1, 1]) is None


# ---------------------------------------------------------------- aggregation


def test_aggregate_skips_undefined():
    assert aggregate([1.0, None, 0.0, float("nan"), 0.5]) == {"mean": 0.5, "n": 3, "skipped": 2}
    assert aggregate([None]) == {"mean": None, "n": 0, "skipped": 1}
    assert aggregate([]) == {"mean": None, "n": 0, "skipped": 0}


def test_agreement_table_hand_case():
    generated = [[1, 2, 3], [1, 1, 1], [0, 1]]
    expert = [[1, 2, 3], [3, 2, 1], [1, 0]]
    table = agreement_table(generated, expert)
    assert table["spearman"] == {"mean": 0.0, "n": 2, "skipped": 1}
    assert table["kendall_tau_b"] == {"mean": 0.0, "n": 2, "skipped": 1}
    assert table["top1_consistency"] == {"mean": pytest.approx(1 / 3), "n": 3, "skipped": 0}
    assert table["pairwise_accuracy"]["mean"] == pytest.approx((1 + 0 + 0) / 3)
    with pytest.raises(ValueError):
        agreement_table(generated, expert[:2])


def test_prometheus_identical_scores_agree_perfectly():
    queries = _prometheus_queries()
    assert len(queries) == 12 and all(q.size == 4 for q in queries)
    table = agreement_table(queries, queries)
    constant = sum(np.ptp(q) == 0 for q in queries)
    for name in ("spearman", "kendall_tau_b"):
        assert table[name] == {"mean": pytest.approx(1.0), "n": 12 - constant, "skipped": constant}
    for name in ("top1_consistency", "pairwise_accuracy"):
        assert table[name] == {"mean": 1.0, "n": 12, "skipped": 0}


def test_prometheus_perturbed_scores():
    queries = _prometheus_queries()
    rng = np.random.default_rng(0)
    # A monotone transform keeps every ranking, tie and top response.
    monotone = [np.exp(q) * 2 + 1 for q in queries]
    table = agreement_table(monotone, queries)
    assert table["pairwise_accuracy"]["mean"] == 1.0
    assert table["top1_consistency"]["mean"] == 1.0
    assert table["spearman"]["mean"] == pytest.approx(1.0)
    # Small noise breaks ties but no strict order (scores are thirds, at least 1/3 apart).
    # so exactly the pairs the expert orders agree three ways.
    noisy = [q + rng.uniform(-0.1, 0.1, q.size) for q in queries]
    for g, e in zip(noisy, queries):
        strict = len(preference_pairs(-e)) / (e.size * (e.size - 1) / 2)
        assert pairwise_accuracy(g, e) == pytest.approx(strict)
        if np.ptp(e) > 0:
            assert kendall_tau_b(g, e) == pytest.approx(stats.kendalltau(g, e).statistic)
            assert spearman(g, e) > 0
    # Reversing the scores reverses every strict pair.
    reversed_table = agreement_table([-q for q in queries], queries)
    assert reversed_table["kendall_tau_b"]["mean"] == pytest.approx(-1.0)
    # Δgap of the expert scores over their own preference pairs is positive.
    gaps = [delta_gap_from_ranks(q, -q) for q in queries]
    assert all(g is None or g > 0 for g in gaps) and aggregate(gaps)["n"] > 0
