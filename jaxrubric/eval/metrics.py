"""Agreement and reward-benchmark metrics, computed on the host with NumPy.

Agreement metrics compare, for one query, the scores a generated rubric gives its n responses
(``generated``, first) with the scores of the expert or reference rubric (``expert``,
second). Each returns a float, or ``None`` where the metric is undefined, so that
``aggregate`` can skip the query and say so instead of averaging in a NaN.

Ties. Spearman and Kendall use exact equality, as ``scipy.stats`` does. The decision metrics
(top-1, pairwise and preference accuracy, listwise ranking) treat two scores within ``tol``
(absolute, default 1e-6) as tied: rubric scores are ratios of small integers computed in
float32, so distinct scores differ by far more than 1e-6 while rounding noise between two
equal scores is far less, and a tie must not be decided by that noise.

Inputs must be finite; a NaN or infinity raises ``ValueError``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike

DEFAULT_TOL = 1e-6


def spearman(generated: ArrayLike, expert: ArrayLike) -> float | None:
    """Spearman's rho: the Pearson correlation of average ranks (ties share their mean rank).

    ``None`` when either vector is constant or there are fewer than 2 responses.
    """
    g, e = _pair(generated, expert)
    if g.size < 2:
        return None
    rg = _average_ranks(g) - (g.size + 1) / 2
    re = _average_ranks(e) - (e.size + 1) / 2
    denominator = math.sqrt(float(rg @ rg) * float(re @ re))
    return float(rg @ re) / denominator if denominator > 0 else None


def kendall_tau_b(generated: ArrayLike, expert: ArrayLike) -> float | None:
    """Kendall's tau-b: ``(C - D) / sqrt((n0 - T_g) (n0 - T_e))`` over the n0 pairs, where
    C and D count concordant and discordant pairs and T_g, T_e the pairs tied in each vector.

    O(n^2) time and memory, which suits per-query response lists. ``None`` when either vector
    is constant or there are fewer than 2 responses.
    """
    g, e = _pair(generated, expert)
    if g.size < 2:
        return None
    upper = np.triu_indices(g.size, k=1)
    sg = np.sign(g[:, None] - g[None, :])[upper]
    se = np.sign(e[:, None] - e[None, :])[upper]
    untied_g = np.count_nonzero(sg)
    untied_e = np.count_nonzero(se)
    if untied_g == 0 or untied_e == 0:
        return None
    return float(sg @ se) / math.sqrt(untied_g * untied_e)


def top1_consistency(
    generated: ArrayLike, expert: ArrayLike, *, tol: float = DEFAULT_TOL
) -> float | None:
    """1.0 when every top-scored response under ``generated`` (all ties for the maximum) is
    also top-scored under ``expert``, else 0.0. ``None`` for an empty query.

    A constant ``generated`` vector thus scores 1.0 only when ``expert`` is constant too.
    """
    g, e = _pair(generated, expert)
    if g.size == 0:
        return None
    generated_top = g >= g.max() - tol
    expert_top = e >= e.max() - tol
    return float(np.all(expert_top[generated_top]))


def pairwise_accuracy(
    generated: ArrayLike, expert: ArrayLike, *, tol: float = DEFAULT_TOL
) -> float | None:
    """Fraction of pairs i < j on which the two vectors agree three ways: both say higher, both
    lower, or both tie. ``None`` with fewer than 2 responses."""
    g, e = _pair(generated, expert)
    if g.size < 2:
        return None
    upper = np.triu_indices(g.size, k=1)
    agree = _tol_sign(g[:, None] - g[None, :], tol) == _tol_sign(e[:, None] - e[None, :], tol)
    return float(np.mean(agree[upper]))


def pairwise_preference_accuracy(
    chosen_scores: ArrayLike, rejected_scores: ArrayLike, *, tol: float = DEFAULT_TOL
) -> float | None:
    """Fraction of preference pairs where the chosen response outscores the rejected one.

    A tie counts half: it is the expected accuracy of breaking the tie at random, so an
    evaluator that cannot tell the pair apart is neither rewarded nor punished relative to
    chance. ``None`` for no pairs.
    """
    chosen, rejected = _pair(chosen_scores, rejected_scores, ("chosen", "rejected"))
    if chosen.size == 0:
        return None
    outcome = _tol_sign(chosen - rejected, tol)
    return float(np.mean((outcome + 1) / 2))


def preference_pairs(reference_ranks: ArrayLike) -> list[tuple[int, int]]:
    """All ``(better_index, worse_index)`` pairs implied by ranks (lower rank is better, as in
    1 = best; equal ranks are a tie and give no pair), in index order."""
    ranks = _vector(reference_ranks, "reference_ranks")
    better, worse = np.nonzero(ranks[:, None] < ranks[None, :])
    return [(int(b), int(w)) for b, w in zip(better, worse)]


def listwise_ranking_accuracy(
    scores: ArrayLike, reference_ranks: ArrayLike, *, tol: float = DEFAULT_TOL
) -> float | None:
    """1.0 when the scores order the list as the reference ranking does, else 0.0.

    ``reference_ranks[i]`` is the rank of response i (lower is better; equal ranks tie).
    Every pair the reference orders must be ordered the same way by more than ``tol``; a
    score tie across a reference preference fails. Pairs tied in the reference may come in
    any order, since the reference claims nothing about them. ``None`` when the reference
    orders no pair.
    """
    s, ranks = _pair(scores, reference_ranks, ("scores", "reference_ranks"))
    pairs = preference_pairs(ranks)
    if not pairs:
        return None
    better, worse = np.asarray(pairs).T
    return float(np.all(s[better] - s[worse] > tol))


def delta_gap(scores: ArrayLike, pairs: Sequence[tuple[int, int]]) -> float | None:
    """Δgap: the mean of ``scores[better] - scores[worse]`` over ``(better, worse)`` index
    pairs with a reference preference. ``None`` for no pairs."""
    s = _vector(scores, "scores")
    if len(pairs) == 0:
        return None
    index = np.asarray(pairs)
    if index.ndim != 2 or index.shape[1] != 2 or not np.issubdtype(index.dtype, np.integer):
        raise ValueError("pairs must be a sequence of (better_index, worse_index) int pairs")
    if index.min() < 0 or index.max() >= s.size:
        raise ValueError(f"pair index out of range for {s.size} scores")
    return float(np.mean(s[index[:, 0]] - s[index[:, 1]]))


def delta_gap_from_ranks(scores: ArrayLike, reference_ranks: ArrayLike) -> float | None:
    """Δgap over every pair the reference ranking orders (see ``preference_pairs``)."""
    s, ranks = _pair(scores, reference_ranks, ("scores", "reference_ranks"))
    return delta_gap(s, preference_pairs(ranks))


def aggregate(per_query_values: Sequence[float | None]) -> dict[str, float | int | None]:
    """Mean over queries of a per-query metric, skipping undefined values (``None`` or NaN).

    Returns ``{"mean": float | None, "n": queries averaged, "skipped": queries skipped}``;
    the mean is ``None`` when every query was skipped.
    """
    defined = [float(v) for v in per_query_values if v is not None and not math.isnan(v)]
    return {
        "mean": float(np.mean(defined)) if defined else None,
        "n": len(defined),
        "skipped": len(per_query_values) - len(defined),
    }


def agreement_table(
    generated_list: Sequence[ArrayLike],
    expert_list: Sequence[ArrayLike],
    *,
    tol: float = DEFAULT_TOL,
) -> dict[str, dict[str, float | int | None]]:
    """The four agreement metrics per query, each aggregated over queries.

    Keys: ``spearman``, ``kendall_tau_b``, ``top1_consistency``, ``pairwise_accuracy``; each
    value is an ``aggregate`` dict.
    """
    if len(generated_list) != len(expert_list):
        raise ValueError(
            f"{len(generated_list)} generated score vectors but {len(expert_list)} expert ones"
        )
    queries = list(zip(generated_list, expert_list))
    return {
        "spearman": aggregate([spearman(g, e) for g, e in queries]),
        "kendall_tau_b": aggregate([kendall_tau_b(g, e) for g, e in queries]),
        "top1_consistency": aggregate([top1_consistency(g, e, tol=tol) for g, e in queries]),
        "pairwise_accuracy": aggregate([pairwise_accuracy(g, e, tol=tol) for g, e in queries]),
    }


def _vector(values: ArrayLike, name: str) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {array.shape}")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{name} must be finite")
    return array


def _pair(
    first: ArrayLike, second: ArrayLike, names: tuple[str, str] = ("generated", "expert")
) -> tuple[np.ndarray, np.ndarray]:
    a, b = _vector(first, names[0]), _vector(second, names[1])
    if a.shape != b.shape:
        raise ValueError(f"{names[0]} has {a.size} entries but {names[1]} has {b.size}")
    return a, b


def _tol_sign(difference: np.ndarray, tol: float) -> np.ndarray:
    """-1, 0 or +1, with |difference| <= tol counting as a tie."""
    return np.where(np.abs(difference) <= tol, 0, np.sign(difference)).astype(np.int8)


def _average_ranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks; tied values share the mean of the ranks they span."""
    _, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)
    return (ends - (counts - 1) / 2)[inverse]
