"""Rubric score aggregation: formulas, invalid groups, HealthBench rows, jit and vmap."""

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from jaxrubric.rubric.scores import dynamic_rubric_score, genrubric_score

DATA = Path(__file__).parents[1] / "data"


def _healthbench_points():
    with open(DATA / "healthbench_oss_eval_30examples.jsonl") as f:
        return [[c["points"] for c in json.loads(line)["rubrics"]] for line in f]


def _healthbench_reference(points, met):
    """HealthBench's per-example formula, written as plainly as simple-evals writes it."""
    possible = sum(p for p in points if p > 0)
    achieved = sum(p for p, m in zip(points, met) if m)
    return achieved / possible


def test_dynamic_rubric_hand_case():
    scores, ok = dynamic_rubric_score(
        jnp.array([1, 0, 1, 1]), jnp.array([3, 2, 5, 1]), jnp.array([True, True, True, False])
    )
    assert ok
    np.testing.assert_allclose(scores, (3 + 5) / (3 + 2 + 5), rtol=1e-6)


def test_dynamic_rubric_soft_scores_with_p_yes():
    p_yes = jnp.array([0.9, 0.2, 0.5])
    scores, ok = dynamic_rubric_score(p_yes, jnp.array([1, 2, 3]), jnp.ones(3, bool))
    np.testing.assert_allclose(scores, (0.9 + 0.4 + 1.5) / 6, rtol=1e-6)
    assert scores.dtype == jnp.float32 and ok


def test_genrubric_hand_case_with_negative_weights():
    verdicts = jnp.array([1, 1, 0, 1])
    weights = jnp.array([4, 2, 3, -5])
    scores, ok = genrubric_score(verdicts, weights, jnp.ones(4, bool))
    np.testing.assert_allclose(scores, (4 + 2 - 5) / (4 + 2 + 3), rtol=1e-6)
    assert ok


def test_genrubric_clip():
    args = (jnp.array([0, 1]), jnp.array([2, -6]), jnp.ones(2, bool))
    np.testing.assert_allclose(genrubric_score(*args)[0], -3.0)
    np.testing.assert_allclose(genrubric_score(*args, clip=True)[0], 0.0)


def test_invalid_groups_score_zero():
    verdicts = jnp.ones((4, 3))
    weights = jnp.array([[1, 2, 3], [1, 2, 3], [-1, -2, 0], [5, 5, 5]])
    valid = jnp.array([[True] * 3, [False] * 3, [True] * 3, [False, True, False]])
    dyn, dyn_ok = dynamic_rubric_score(verdicts, weights, valid)
    gen, gen_ok = genrubric_score(verdicts, weights, valid)
    np.testing.assert_array_equal(dyn_ok, [True, False, False, True])
    np.testing.assert_array_equal(gen_ok, [True, False, False, True])
    np.testing.assert_allclose(dyn, [1, 0, 0, 1])
    np.testing.assert_allclose(gen, [1, 0, 0, 1])


def test_invalid_items_carry_nothing_even_as_nan():
    verdicts = jnp.array([1.0, jnp.nan])
    weights = jnp.array([2.0, jnp.nan])
    valid = jnp.array([True, False])
    for score_fn in (dynamic_rubric_score, genrubric_score):
        scores, ok = score_fn(verdicts, weights, valid)
        assert ok and float(scores) == 1.0


def test_gradient_is_finite_for_invalid_groups():
    def total(p_yes):
        return genrubric_score(p_yes, jnp.array([[1, 2], [3, 4]]), jnp.array([[1, 1], [0, 0]]))[
            0
        ].sum()

    grad = jax.grad(total)(jnp.full((2, 2), 0.5))
    assert np.all(np.isfinite(grad))
    np.testing.assert_allclose(grad, [[1 / 3, 2 / 3], [0, 0]], rtol=1e-6)


def test_broadcast_responses_against_group_weights():
    rng = np.random.default_rng(0)
    b, k, g, m = 2, 3, 4, 5
    verdicts = rng.integers(0, 2, (b, k, g, m))
    weights = rng.integers(-3, 6, (b, g, m))
    valid = rng.random((b, g, m)) < 0.8
    scores, ok = genrubric_score(verdicts, weights[:, None], valid[:, None])
    assert scores.shape == ok.shape == (b, k, g)
    for idx in np.ndindex(b, k, g):
        w = np.where(valid[idx[0], idx[2]], weights[idx[0], idx[2]], 0)
        positive = w[w > 0].sum()
        expected = (w * verdicts[idx]).sum() / positive if positive > 0 else 0.0
        assert bool(ok[idx]) == (positive > 0)
        np.testing.assert_allclose(scores[idx], expected, rtol=1e-6, atol=1e-7)


def _padded(rows):
    m = max(len(p) for p in rows)
    weights = np.zeros((len(rows), m), np.int32)
    valid = np.zeros((len(rows), m), bool)
    for i, points in enumerate(rows):
        weights[i, : len(points)] = points
        valid[i, : len(points)] = True
    return weights, valid


def _patterns(points):
    n = len(points)
    return {
        "all met": [True] * n,
        "only positive met": [p > 0 for p in points],
        "only negative met": [p < 0 for p in points],
        "alternate": [i % 2 == 0 for i in range(n)],
        "none met": [False] * n,
    }


def test_healthbench_rows_match_reference_formula():
    rows = _healthbench_points()
    weights, valid = _padded(rows)
    verdicts = np.zeros((len(rows), 5, weights.shape[1]), bool)
    for i, points in enumerate(rows):
        for j, met in enumerate(_patterns(points).values()):
            verdicts[i, j, : len(points)] = met
    scores, ok = genrubric_score(verdicts, weights[:, None], valid[:, None])
    clipped, _ = genrubric_score(verdicts, weights[:, None], valid[:, None], clip=True)
    assert bool(jnp.all(ok))
    for i, points in enumerate(rows):
        for j, met in enumerate(_patterns(points).values()):
            reference = _healthbench_reference(points, met)
            np.testing.assert_allclose(scores[i, j], reference, rtol=1e-6, atol=1e-7)
            np.testing.assert_allclose(clipped[i, j], min(max(reference, 0), 1), atol=1e-7)
    np.testing.assert_allclose(scores[:, 1], 1.0, rtol=1e-6)
    assert float(jnp.min(scores[:, 2])) < 0 and float(jnp.max(scores[:, 4])) == 0.0


def test_healthbench_rows_random_verdicts_under_jit():
    rows = _healthbench_points()
    weights, valid = _padded(rows)
    verdicts = np.random.default_rng(1).integers(0, 2, weights.shape).astype(bool)
    scores, ok = jax.jit(genrubric_score)(verdicts, weights, valid)
    assert bool(jnp.all(ok))
    for i, points in enumerate(rows):
        reference = _healthbench_reference(points, verdicts[i, : len(points)])
        np.testing.assert_allclose(scores[i], reference, rtol=1e-6, atol=1e-7)


def test_jit_and_vmap_agree_with_eager():
    rng = np.random.default_rng(2)
    p_yes = jnp.asarray(rng.random((6, 4, 3, 5)), jnp.float32)
    weights = jnp.asarray(rng.integers(1, 6, (6, 1, 3, 5)))
    valid = jnp.asarray(rng.random((6, 1, 3, 5)) < 0.7)
    for score_fn in (dynamic_rubric_score, genrubric_score):
        eager = score_fn(p_yes, weights, valid)
        jitted = jax.jit(score_fn)(p_yes, weights, valid)
        mapped = jax.vmap(score_fn)(p_yes, weights, valid)
        for a, b, c in zip(eager, jitted, mapped):
            np.testing.assert_allclose(a, b, rtol=1e-6)
            np.testing.assert_allclose(a, c, rtol=1e-6)
    clipped = jax.jit(genrubric_score, static_argnames="clip")(p_yes, weights, valid, clip=True)
    assert clipped[0].shape == (6, 4, 3)
