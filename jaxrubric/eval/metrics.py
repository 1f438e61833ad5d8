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

With several rubric-generation runs per query, ``agreement_over_runs`` averages each metric
over a query's runs before averaging over queries, with invalid rubrics left out or counted as
failures. HealthBench's own aggregates are here too (``healthbench_score``,
``healthbench_tag_scores``, ``healthbench_aggregate``: per-tag scores and the mean clipped to
[0, 1], as its reference scorer reports them), with standard errors by a seeded bootstrap over
queries (``bootstrap_se``).

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


AGREEMENT_METRICS = ("spearman", "kendall_tau_b", "top1_consistency", "pairwise_accuracy")
# What an invalid generated rubric scores on every agreement metric when invalid rubrics count
# as failures: no correlation, no top-1 or pairwise agreement.
FAILURE = 0.0
# Resamples of a bootstrap standard error, as HealthBench's reference scorer draws.
BOOTSTRAP_SAMPLES = 1000


def agreement_metrics(generated: ArrayLike, expert: ArrayLike, *, tol: float = DEFAULT_TOL
                      ) -> dict[str, float | None]:
    """The four agreement metrics of one query (`AGREEMENT_METRICS` order), None where
    undefined."""
    return {"spearman": spearman(generated, expert),
            "kendall_tau_b": kendall_tau_b(generated, expert),
            "top1_consistency": top1_consistency(generated, expert, tol=tol),
            "pairwise_accuracy": pairwise_accuracy(generated, expert, tol=tol)}


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
    per_query = [agreement_metrics(g, e, tol=tol) for g, e in zip(generated_list, expert_list)]
    return {name: aggregate([q[name] for q in per_query]) for name in AGREEMENT_METRICS}


def agreement_over_runs(
    generated_runs: Sequence[Sequence[ArrayLike | None]],
    expert_list: Sequence[ArrayLike],
    *,
    invalid_as_failure: bool,
    tol: float = DEFAULT_TOL,
    seed: int = 0,
) -> dict[str, dict[str, float | int | None]]:
    """The agreement metrics with several rubric-generation runs per query, as the GenRubric
    paper computes them: per query and run, averaged over the query's runs, then over queries.

    ``generated_runs[q][r]`` is query q's score vector under the rubric of run r, or None where
    that rubric is invalid. Invalid rubrics are left out (``invalid_as_failure=False``: the
    metrics of valid rubrics) or score `FAILURE` (True: a generator that writes unusable
    rubrics pays for them). A run whose metric is undefined (a constant vector) is left out
    either way; a query with no run left is skipped.

    Per metric: ``mean`` over queries, its ``bootstrap_se`` over queries (`bootstrap_se`),
    ``n`` queries averaged, ``skipped`` queries, ``runs`` (query, run) values averaged and
    ``runs_left_out``.
    """
    if len(generated_runs) != len(expert_list):
        raise ValueError(f"{len(generated_runs)} queries of generated runs but "
                         f"{len(expert_list)} expert score vectors")
    values: dict[str, list[list[float]]] = {name: [] for name in AGREEMENT_METRICS}
    left_out = dict.fromkeys(AGREEMENT_METRICS, 0)
    for runs, expert in zip(generated_runs, expert_list):
        per_run = [dict.fromkeys(AGREEMENT_METRICS, FAILURE if invalid_as_failure else None)
                   if g is None else agreement_metrics(g, expert, tol=tol) for g in runs]
        for name in AGREEMENT_METRICS:
            defined = [run[name] for run in per_run if run[name] is not None]
            values[name].append(defined)
            left_out[name] += len(runs) - len(defined)
    out = {}
    for name, per_query in values.items():
        means = [float(np.mean(v)) for v in per_query if v]
        out[name] = {**aggregate([float(np.mean(v)) if v else None for v in per_query]),
                     "bootstrap_se": bootstrap_se(means, seed=seed),
                     "runs": sum(map(len, per_query)), "runs_left_out": left_out[name]}
    return out


def top_k_responses(expert: ArrayLike, k: int) -> np.ndarray:
    """Indices (ascending) of the ``k`` responses the expert rubric scores highest; ties go
    to the earlier response (a stable sort), so the subset is deterministic."""
    e = _vector(expert, "expert")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    return np.sort(np.argsort(-e, kind="stable")[:k])


def bootstrap_se(values: ArrayLike, *, weights: ArrayLike | None = None,
                 clip: tuple[float, float] | None = None, samples: int = BOOTSTRAP_SAMPLES,
                 seed: int = 0) -> float | None:
    """Bootstrap standard error of a mean over units (queries): the standard deviation of the
    (``weights``-weighted, optionally ``clip``ped) mean over ``samples`` resamples of the units
    with replacement, drawn as ``np.random.default_rng(seed).integers(0, n, (samples, n))``.

    HealthBench's reference scorer reports the same statistic (`bootstrap_std`, unseeded);
    the seed makes a report reproducible. Resampling queries rather than responses respects
    that a query's responses share its rubric. None for fewer than 2 units.
    """
    v = _vector(values, "values")
    w = np.ones_like(v) if weights is None else _vector(weights, "weights")
    if v.shape != w.shape:
        raise ValueError(f"values has {v.size} entries but weights has {w.size}")
    if v.size < 2:
        return None
    draws = np.random.default_rng(seed).integers(0, v.size, (samples, v.size))
    stats = np.sum(w[draws] * v[draws], axis=1) / np.sum(w[draws], axis=1)
    if clip is not None:
        stats = np.clip(stats, *clip)
    return float(np.std(stats))


def healthbench_score(met: ArrayLike, points: ArrayLike) -> np.ndarray | None:
    """HealthBench's score of each response ``[n]``: the points of the criteria it meets
    (``met [n, M]``) over the rubric's positive points; None when there are none."""
    m = np.asarray(met, dtype=np.float64)
    p = _vector(points, "points")
    if m.ndim != 2 or m.shape[1] != p.size:
        raise ValueError(f"met must be [n, {p.size}], got shape {m.shape}")
    positive = float(np.sum(np.maximum(p, 0)))
    return m @ p / positive if positive > 0 else None


def healthbench_tag_scores(overall: ArrayLike, met: ArrayLike, points: ArrayLike,
                           item_tags: Sequence[Sequence[str]], example_tags: Sequence[str]
                           ) -> dict[str, np.ndarray]:
    """Per-tag scores of a query's responses, as HealthBench's reference scorer defines them.

    An example-level tag (``theme:...``) takes each response's ``overall`` score; a
    rubric-level tag (``axis:...``, ``level:...``, ``cluster:...``) the `healthbench_score`
    over the criteria that carry it, where they have positive points (else the tag is left
    out for this query).
    """
    out = {tag: _vector(overall, "overall") for tag in example_tags}
    p = _vector(points, "points")
    if len(item_tags) != p.size:
        raise ValueError(f"{len(item_tags)} item tag lists for {p.size} criteria")
    m = np.asarray(met, dtype=np.float64)
    for tag in dict.fromkeys(t for tags in item_tags for t in tags):
        carried = np.array([tag in tags for tags in item_tags])
        score = healthbench_score(m[:, carried], p[carried])
        if score is not None:
            out[tag] = score
    return out


def healthbench_aggregate(per_query: Sequence[ArrayLike], *, seed: int = 0
                          ) -> dict[str, float | int | None]:
    """HealthBench's aggregate of response scores grouped by query: ``mean`` over every
    response (unclipped), ``clipped_mean`` (the mean clipped to [0, 1], the number HealthBench
    reports: penalties can push a response below 0), and the ``bootstrap_se`` of the clipped
    mean with queries resampled (each weighted by its responses, so every draw is a mean over
    responses), with the ``responses`` and ``queries`` counted."""
    vectors = [v for v in (_vector(x, "scores") for x in per_query) if v.size]
    if not vectors:
        return {"mean": None, "clipped_mean": None, "bootstrap_se": None, "responses": 0,
                "queries": 0}
    pooled = float(np.mean(np.concatenate(vectors)))
    return {"mean": pooled, "clipped_mean": float(np.clip(pooled, 0.0, 1.0)),
            "bootstrap_se": bootstrap_se([v.mean() for v in vectors],
                                         weights=[v.size for v in vectors], clip=(0.0, 1.0),
                                         seed=seed),
            "responses": sum(v.size for v in vectors), "queries": len(vectors)}


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
