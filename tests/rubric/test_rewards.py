"""Generator rewards (DynamicRubric and GenRubric) on hand-computed cases."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrubric.rewards import credit
from jaxrubric.rewards import dynamic_rubric as dr
from jaxrubric.rewards import genrubric as gr
from jaxrubric.rl.grpo import group_advantages


# Jitted aliases: one compilation per shape is much cheaper than eager op-by-op dispatch.
anchor_ranking = jax.jit(dr.anchor_ranking, static_argnames="normalize")
discriminability = jax.jit(dr.discriminability, static_argnames="mode")
genrubric_rewards = jax.jit(gr.genrubric_rewards, static_argnames=("spread", "soft_items", "clip_scores"))
item_nonredundant = jax.jit(gr.item_nonredundant, static_argnames="soft")
item_discriminative = jax.jit(gr.item_discriminative, static_argnames="soft")
generator_advantages = jax.jit(dr.generator_advantages, static_argnames=("combine", "mode"))
preference_pairs = dr.preference_pairs


def log_sigmoid(x):
    return -math.log1p(math.exp(-x))


# ------------------------------------------------------------------------------------------
# DynamicRubric: discriminability
# ------------------------------------------------------------------------------------------

# K = 4 responses, M = 3 items: item 0 passed by all, item 1 by none, item 2 by half.
VERDICTS = np.array([[1, 0, 1], [1, 0, 0], [1, 0, 1], [1, 0, 0]], np.float32)
WEIGHTS = np.array([2.0, 3.0, 5.0], np.float32)
ALL_ITEMS = np.ones(3, bool)


def test_unanimous_items_carry_no_discriminability():
    only_unanimous = np.array([True, True, False])
    assert float(discriminability(VERDICTS, WEIGHTS, only_unanimous)) == 0.0
    assert float(discriminability(VERDICTS, WEIGHTS, only_unanimous, mode="score_variance")) == 0.0


def test_half_split_item_gives_quarter_weight_share():
    np.testing.assert_allclose(discriminability(VERDICTS, WEIGHTS, ALL_ITEMS), 5 * 0.25 / 10, rtol=1e-6)
    # masking the item that all responses pass changes only the denominator
    mask = np.array([False, True, True])
    np.testing.assert_allclose(discriminability(VERDICTS, WEIGHTS, mask), 5 * 0.25 / 8, rtol=1e-6)


def test_score_variance_by_hand():
    # E = (2 + 5 v_2) / 10 -> [0.7, 0.2, 0.7, 0.2], variance 0.0625
    got = discriminability(VERDICTS, WEIGHTS, ALL_ITEMS, mode="score_variance")
    np.testing.assert_allclose(got, 0.0625, rtol=1e-6)


def test_soft_verdicts_and_response_mask():
    rng = np.random.default_rng(0)
    v = rng.uniform(size=(5, 3)).astype(np.float32)
    w = np.array([1.0, 4.0, 2.0], np.float32)
    resp = np.array([True, True, False, True, False])
    p = v[resp].mean(0)
    np.testing.assert_allclose(
        discriminability(v, w, ALL_ITEMS, response_mask=resp), (w * p * (1 - p)).sum() / w.sum(), rtol=1e-6
    )
    e = (v[resp] * w).sum(-1) / w.sum()
    np.testing.assert_allclose(
        discriminability(v, w, ALL_ITEMS, response_mask=resp, mode="score_variance"), e.var(), rtol=1e-5
    )


def test_no_valid_item_gives_zero_and_bad_mode_raises():
    none = np.zeros(3, bool)
    for mode in ("item_variance", "score_variance"):
        assert float(discriminability(VERDICTS, WEIGHTS, none, mode=mode)) == 0.0
    with pytest.raises(ValueError):
        discriminability(VERDICTS, WEIGHTS, ALL_ITEMS, mode="bogus")


def test_discriminability_leading_dims_vmap_and_jit():
    rng = np.random.default_rng(1)
    v = (rng.uniform(size=(2, 3, 6, 4)) < 0.5).astype(np.float32)
    w = rng.integers(1, 6, (2, 3, 4)).astype(np.float32)
    mask = rng.uniform(size=(2, 3, 4)) < 0.8
    want = np.array(
        [[float(discriminability(v[i, j], w[i, j], mask[i, j])) for j in range(3)] for i in range(2)]
    )
    np.testing.assert_allclose(jax.jit(dr.discriminability)(v, w, mask), want, rtol=1e-6)
    np.testing.assert_allclose(jax.vmap(jax.vmap(dr.discriminability))(v, w, mask), want, rtol=1e-6)


# ------------------------------------------------------------------------------------------
# DynamicRubric: anchor ranking
# ------------------------------------------------------------------------------------------


def test_anchor_ranking_n3_by_hand():
    # omega_12 = 1/(1*1) = 1, omega_13 = 1/(2*1) = 0.5, omega_23 = 1/(1*2) = 0.5, sum 2.
    # scores [2, 1, 0]: 1*logσ(1) + 0.5*logσ(2) + 0.5*logσ(1) = 1.5*(-0.3132617) + 0.5*(-0.1269280)
    unnormalised = 1.5 * log_sigmoid(1.0) + 0.5 * log_sigmoid(2.0)
    np.testing.assert_allclose(unnormalised, -0.5333565, atol=1e-6)
    scores = np.array([2.0, 1.0, 0.0], np.float32)
    np.testing.assert_allclose(anchor_ranking(scores, normalize=False), unnormalised, rtol=1e-6)
    np.testing.assert_allclose(anchor_ranking(scores), -0.2666783, atol=1e-6)


def test_reversing_the_anchor_order_lowers_the_reward():
    scores = jnp.array([0.9, 0.6, 0.4, 0.1])
    assert float(anchor_ranking(scores[::-1])) < float(anchor_ranking(scores))
    # a swap at the top costs more than the same swap at the bottom
    top = jnp.array([0.6, 0.9, 0.4, 0.1])
    bottom = jnp.array([0.9, 0.6, 0.1, 0.4])
    assert float(anchor_ranking(top)) < float(anchor_ranking(bottom))
    # a rubric that ties everything scores -log 2
    np.testing.assert_allclose(anchor_ranking(jnp.zeros(5)), -math.log(2), rtol=1e-6)


def test_anchor_ranking_matches_bruteforce():
    rng = np.random.default_rng(2)
    s = rng.normal(size=6)
    num = den = 0.0
    for i in range(1, 7):
        for j in range(i + 1, 7):
            w = 1.0 / ((j - i) * 2 ** (i - 1))
            num += w * log_sigmoid(s[i - 1] - s[j - 1])
            den += w
    np.testing.assert_allclose(anchor_ranking(s.astype(np.float32)), num / den, rtol=1e-5)
    np.testing.assert_allclose(anchor_ranking(s.astype(np.float32), normalize=False), num, rtol=1e-5)


def test_anchor_ranking_masks():
    want = anchor_ranking(jnp.array([2.0, 1.0, 0.0]))
    padded = anchor_ranking(
        jnp.array([2.0, 1.0, 0.0, 99.0, jnp.nan]), list_mask=jnp.array([1, 1, 1, 0, 0], bool)
    )
    holey = anchor_ranking(jnp.array([2.0, -50.0, 1.0, 0.0]), list_mask=jnp.array([1, 0, 1, 1], bool))
    np.testing.assert_allclose(padded, want, rtol=1e-6)
    np.testing.assert_allclose(holey, want, rtol=1e-6)
    single = anchor_ranking(jnp.array([1.0, 2.0]), list_mask=jnp.array([True, False]))
    assert float(single) == 0.0


def test_dynamic_rubric_rewards_combine_and_batch():
    rng = np.random.default_rng(3)
    b, g, k, m, n = 2, 3, 5, 4, 4
    v = rng.uniform(size=(b, g, k, m)).astype(np.float32)
    w = rng.integers(1, 6, (b, g, m)).astype(np.float32)
    item_mask = rng.uniform(size=(b, g, m)) < 0.8
    item_mask[0, 1] = False  # a group with no valid item
    anchors = rng.normal(size=(b, g, n)).astype(np.float32)
    resp = rng.uniform(size=(b, k)) < 0.8
    anchor_mask = np.array([[1, 1, 1, 0], [1, 1, 1, 1]], bool)
    fn = jax.jit(functools.partial(dr.dynamic_rubric_rewards, lam=0.5))
    reward, parts = fn(v, w, item_mask, anchors, response_mask=resp, anchor_mask=anchor_mask)
    assert reward.shape == (b, g)
    for i in range(b):
        for j in range(g):
            d = discriminability(v[i, j], w[i, j], item_mask[i, j], response_mask=resp[i])
            a = anchor_ranking(anchors[i, j], list_mask=anchor_mask[i])
            np.testing.assert_allclose(reward[i, j], dr.generator_reward(d, a, 0.5), rtol=1e-5)
            np.testing.assert_allclose(parts["disc"][i, j], d, rtol=1e-6)
    assert parts["group_valid"].tolist() == [[True, False, True], [True, True, True]]
    assert float(parts["disc"][0, 1]) == 0.0


# ------------------------------------------------------------------------------------------
# GenRubric
# ------------------------------------------------------------------------------------------


def hand_case():
    """G = 3 groups, M = 2 items, verdicts v[g_resp, g_rub, m]."""
    weights = np.array([[2, 1], [1, -1], [3, 1]], np.int32)
    item_valid = np.array([[True, True], [True, True], [True, False]])
    v = np.zeros((3, 3, 2), np.float32)
    v[0] = [[1, 0], [1, 0], [0, 1]]  # r0: S0 = 2/3, S1 = 1, S2 = 0
    v[1] = [[1, 1], [0, 1], [1, 1]]  # r1: S0 = 1, S1 = -1, S2 = 1 (item 1 of g2 invalid)
    v[2] = [[0, 1], [1, 1], [0, 0]]  # r2: S0 = 1/3, S1 = 0, S2 = 0
    return v, weights, item_valid


def test_group_scores_and_comprehensiveness_by_hand():
    v, w, iv = hand_case()
    s = gr.group_scores(v, w, iv)
    np.testing.assert_allclose(s, [[2 / 3, 1, 0], [1, -1, 1], [1 / 3, 0, 0]], atol=1e-6)
    valid = gr.group_validity(w, iv)
    assert valid.tolist() == [True, True, True]
    # comprehensiveness of g = mean of S_{g'}(r_g) over g' != g
    np.testing.assert_allclose(
        gr.cross_rubric_comprehensiveness(s, valid), [(1 + 0) / 2, (1 + 1) / 2, (1 / 3 + 0) / 2], atol=1e-6
    )


def test_group_discrimination_by_hand():
    v, w, iv = hand_case()
    s = gr.group_scores(v, w, iv)
    valid = gr.group_validity(w, iv)
    columns = np.array([[2 / 3, 1, 1 / 3], [1, -1, 0], [0, 1, 0]])
    np.testing.assert_allclose(gr.group_discrimination(s, valid), columns.std(1), atol=1e-6)
    np.testing.assert_allclose(gr.group_discrimination(s, valid, spread="range"), [2 / 3, 2, 1], atol=1e-6)
    only_two = np.array([True, False, True])
    np.testing.assert_allclose(
        gr.group_discrimination(s, valid, response_valid=only_two), columns[:, [0, 2]].std(1), atol=1e-6
    )
    # Pairs: the share of response pairs a group scores apart. Group 2 scores r0 and r2 alike.
    np.testing.assert_allclose(gr.group_discrimination(s, valid, spread="pairs"), [1, 1, 2 / 3],
                               atol=1e-6)
    np.testing.assert_allclose(gr.group_discrimination(s, valid, response_valid=only_two,
                                                       spread="pairs"), [1, 1, 0], atol=1e-6)
    with pytest.raises(ValueError):
        gr.group_discrimination(s, valid, spread="iqr")


def test_pairs_spread_rewards_resolution_not_coarseness():
    """Over three answers, one all-or-nothing item (scores 0, 0, 1) has a larger std than a
    rubric that resolves all three (0, 1/2, 1), but separates fewer pairs."""
    coarse, fine = [0.0, 0.0, 1.0], [0.0, 0.5, 1.0]
    s = jnp.asarray(np.stack([coarse, fine, fine], -1))  # [response, rubric]
    valid = jnp.asarray([True, True, True])
    std = np.asarray(gr.group_discrimination(s, valid))
    pairs = np.asarray(gr.group_discrimination(s, valid, spread="pairs"))
    assert std[0] > std[1]
    np.testing.assert_allclose(pairs, [2 / 3, 1, 1], atol=1e-6)


def test_duplicated_item_is_redundant_and_unanimous_item_not_discriminative():
    # one group of interest (g = 0) with 4 items over 3 responses; groups 1, 2 are fillers
    g, m = 3, 4
    v = np.zeros((g, g, m), np.float32)
    v[:, 0, 0] = [1, 0, 1]  # item 0
    v[:, 0, 1] = [1, 0, 1]  # item 1: duplicate of item 0
    v[:, 0, 2] = [1, 1, 1]  # item 2: everyone passes
    v[:, 0, 3] = [0, 1, 1]  # item 3: distinct and discriminative
    w = np.ones((g, m), np.int32)
    iv = np.ones((g, m), bool)
    gv = gr.group_validity(w, iv)
    nonred = item_nonredundant(v, iv, gv)
    disc = item_discriminative(v, iv, gv)
    np.testing.assert_array_equal(nonred[0], [0, 0, 1, 1])
    np.testing.assert_array_equal(disc[0], [1, 1, 0, 1])
    _, item = genrubric_rewards(v, w, iv)
    np.testing.assert_allclose(item[0], [0.5, 0.5, 0.5, 1.0])
    # invalidating the duplicate makes item 0 unique again
    iv2 = iv.copy()
    iv2[0, 1] = False
    np.testing.assert_array_equal(item_nonredundant(v, iv2, gv)[0], [1, 0, 1, 1])


def test_soft_item_rewards():
    rng = np.random.default_rng(4)
    g, m = 3, 3
    v = rng.uniform(size=(g, g, m)).astype(np.float32)
    w = np.ones((g, m), np.int32)
    iv = np.ones((g, m), bool)
    gv = gr.group_validity(w, iv)
    p = v.mean(0)  # [g_rub, m]
    np.testing.assert_allclose(item_discriminative(v, iv, gv, soft=True), 4 * p * (1 - p), rtol=1e-5)
    want = np.zeros((g, m))
    for gg in range(g):
        for mm in range(m):
            want[gg, mm] = min(np.abs(v[:, gg, mm] - v[:, gg, o]).mean() for o in range(m) if o != mm)
    np.testing.assert_allclose(item_nonredundant(v, iv, gv, soft=True), want, rtol=1e-5)


def test_malformed_group_is_zero_and_excluded():
    rng = np.random.default_rng(5)
    g, m = 4, 3
    v = (rng.uniform(size=(g, g, m)) < 0.5).astype(np.float32)
    w = rng.integers(1, 4, (g, m)).astype(np.int32)
    w[0, 2] = -2
    iv = rng.uniform(size=(g, m)) < 0.9
    iv[:, 0] = True
    for bad_weights, bad_valid in ((w[2], np.zeros(m, bool)), (-np.abs(w[2]), np.ones(m, bool))):
        w_bad, iv_bad = w.copy(), iv.copy()
        w_bad[2], iv_bad[2] = bad_weights, bad_valid
        assert gr.group_validity(w_bad, iv_bad).tolist() == [True, True, False, True]
        for spread in ("std", "range"):
            seq, item = map(np.asarray, genrubric_rewards(v, w_bad, iv_bad, spread=spread))
            assert float(seq[2]) == 0.0 and np.all(np.asarray(item[2]) == 0)
            keep = np.array([0, 1, 3])
            seq_r, item_r = genrubric_rewards(v[keep][:, keep], w_bad[keep], iv_bad[keep], spread=spread)
            np.testing.assert_allclose(seq[keep], seq_r, atol=1e-6)
            np.testing.assert_allclose(item[keep], item_r, atol=1e-6)
            assert np.all(np.asarray(seq_r) != 0)


def test_genrubric_rewards_combination_and_coefficients():
    v, w, iv = hand_case()
    valid = gr.group_validity(w, iv)
    for clip in (True, False):  # S1(r1) = -1 reads as 0 when clipped
        s = gr.group_scores(v, w, iv, clip=clip)
        assert float(s[1, 1]) == (0.0 if clip else -1.0)
        comp = gr.cross_rubric_comprehensiveness(s, valid)
        disc = gr.group_discrimination(s, valid)
        seq, item = genrubric_rewards(v, w, iv, comprehensiveness_coef=2.0,
                                      discrimination_coef=0.5, discriminative_coef=1.0,
                                      nonredundant_coef=0.0, clip_scores=clip)
        np.testing.assert_allclose(seq, 2 * comp + 0.5 * disc, atol=1e-6)
    np.testing.assert_allclose(item, item_discriminative(v, iv, valid), atol=1e-6)
    assert float(item[2, 1]) == 0.0  # invalid item


def test_token_level_advantages_by_hand():
    seq_adv = jnp.array([1.0, -1.0])
    item_adv = jnp.array([[0.5, -0.5, 0.0], [2.0, 0.25, 0.0]])
    idx = jnp.array([[-1, 0, 0, -1, 1, 1, -1], [-1, 1, -1, 0, 0, -1, -1]])
    got = credit.token_level_advantages(seq_adv, item_adv, idx)
    want = [[1.0, 1.5, 1.5, 1.0, 0.5, 0.5, 1.0], [-1.0, -0.75, -1.0, 1.0, 1.0, -1.0, -1.0]]
    np.testing.assert_allclose(got, want)


def test_item_advantages_are_z_scored_over_valid_items_of_the_query():
    item_reward = jnp.array([[1.0, 0.5, 0.0], [0.0, 1.0, 0.7]])
    mask = jnp.array([[True, True, False], [True, True, False]])
    got = credit.item_advantages(item_reward, mask)
    vals = np.array([1.0, 0.5, 0.0, 1.0])
    z = (vals - vals.mean()) / (vals.std() + 1e-6)
    np.testing.assert_allclose(got, [[z[0], z[1], 0.0], [z[2], z[3], 0.0]], rtol=1e-5)


def test_genrubric_token_advantages_composes():
    v, w, iv = hand_case()
    seq, item = genrubric_rewards(v, w, iv)
    mask = iv & np.asarray(gr.group_validity(w, iv))[:, None]
    idx = jnp.array([[-1, 0, 1, -1], [0, -1, 1, -1], [-1, 0, 0, -1]])
    got = gr.genrubric_token_advantages(seq, item, mask, idx, mode="no_std")
    want = credit.token_level_advantages(group_advantages(seq, mode="no_std"),
                                     credit.item_advantages(item, mask, mode="no_std"), idx)
    np.testing.assert_allclose(got, want, atol=1e-6)
    np.testing.assert_allclose(got[:, 0], np.asarray(seq) - np.mean(seq), atol=1e-6)


def test_genrubric_leading_batch_dims_and_jit():
    rng = np.random.default_rng(6)
    b, g, m, length = 2, 4, 3, 6
    v = rng.uniform(size=(b, g, g, m)).astype(np.float32)
    w = rng.integers(-1, 4, (b, g, m)).astype(np.int32)
    iv = rng.uniform(size=(b, g, m)) < 0.8
    iv[1, 3] = False
    idx = rng.integers(-1, m, (b, g, length)).astype(np.int32)

    @jax.jit
    def pipeline(v, w, iv, idx):
        seq, item = genrubric_rewards(v, w, iv, soft_items=True, spread="range")
        mask = iv & gr.group_validity(w, iv)[..., None]
        return seq, item, gr.genrubric_token_advantages(seq, item, mask, idx)

    seq, item, tok = pipeline(v, w, iv, idx)
    assert seq.shape == (b, g) and item.shape == (b, g, m) and tok.shape == (b, g, length)
    for i in range(b):
        s_i, it_i = genrubric_rewards(v[i], w[i], iv[i], soft_items=True, spread="range")
        np.testing.assert_allclose(seq[i], s_i, atol=1e-6)
        np.testing.assert_allclose(item[i], it_i, atol=1e-6)
        mask_i = iv[i] & np.asarray(gr.group_validity(w[i], iv[i]))[:, None]
        want_tok = gr.genrubric_token_advantages(s_i, it_i, mask_i, idx[i])
        np.testing.assert_allclose(tok[i], want_tok, atol=1e-5)


def _z(x):
    return (x - x.mean(-1, keepdims=True)) / (x.std(-1, keepdims=True) + 1e-6)


def _rank_last(x, valid):
    low = np.where(valid, x, np.inf).min(-1, keepdims=True)
    return np.where(valid.any(-1, keepdims=True), np.where(valid, x, low - 1.0), 0.0)


@pytest.mark.parametrize("combine", ["advantage", "reward"])
def test_generator_advantages_match_numpy(combine):
    """`advantage` (the paper's): adv(J_disc) + λ adv(J_anchor), each over the prompt's G
    rubrics; `reward`: adv(J_disc + λ J_anchor). Invalid rubrics ranked last first."""
    rng = np.random.default_rng(3)
    disc = rng.uniform(0, 0.25, (5, 6)).astype(np.float32)
    anchor = rng.uniform(-1.3, -0.3, (5, 6)).astype(np.float32)
    valid = rng.uniform(size=(5, 6)) < 0.8
    valid[0] = False  # a prompt with no valid rubric: no signal
    got = generator_advantages(disc, anchor, valid, lam=0.7, combine=combine)
    if combine == "advantage":
        want = _z(_rank_last(disc, valid)) + 0.7 * _z(_rank_last(anchor, valid))
    else:
        want = _z(_rank_last(disc + 0.7 * anchor, valid))
    np.testing.assert_allclose(got, want, atol=1e-4)
    np.testing.assert_allclose(got[0], 0.0, atol=1e-6)


def test_the_advantage_level_combination_weighs_both_rewards_whatever_their_spread():
    """The anchor reward's spread is larger than J_disc's: summed as rewards, the anchor term
    alone picks the best rubric; normalised first, the best discriminator can win."""
    disc = np.array([[0.25, 0.0, 0.0]], np.float32)
    anchor = np.array([[-0.9, -0.5, -1.0]], np.float32)
    valid = np.ones((1, 3), bool)
    by_reward = np.asarray(generator_advantages(disc, anchor, valid, combine="reward"))
    by_advantage = np.asarray(generator_advantages(disc, anchor, valid, combine="advantage"))
    assert by_reward.argmax() == 1 and by_advantage.argmax() == 0


@pytest.mark.parametrize("combine", ["advantage", "reward"])
def test_an_invalid_rubric_ends_below_a_valid_one_that_reverses_the_anchors(combine):
    """A valid rubric that orders the anchors backwards scores J_anchor ~ -1.06, below the -1
    an invalid rubric used to get: ranked last, the invalid one is still the lowest."""
    reversed_anchor = float(anchor_ranking(jnp.array([0.0, 0.5, 1.0])))
    assert reversed_anchor < -1.0
    disc = np.array([[0.0, 0.1, 0.0]], np.float32)
    anchor = np.array([[reversed_anchor, -0.5, 0.0]], np.float32)
    valid = np.array([[True, True, False]])
    adv = np.asarray(generator_advantages(disc, anchor, valid, combine=combine))
    assert adv[0, 2] < adv[0, :2].min()


def test_tied_reference_ranks_make_no_pair():
    """Ranked [1, 2, 2]: only the first answer is preferred; a rubric that invents an order
    between the two tied ones earns nothing for it."""
    ranks = jnp.array([1, 2, 2])
    one_way = anchor_ranking(jnp.array([1.0, 0.6, 0.2]), ranks=ranks)
    other_way = anchor_ranking(jnp.array([1.0, 0.2, 0.6]), ranks=ranks)
    assert float(one_way) == pytest.approx(float(other_way))
    pairs = [(0, 1, 1.0), (0, 2, 1.0)]  # (i, j, omega): both from rank 1, rank gap 1
    s = np.array([1.0, 0.6, 0.2])
    want = sum(w * np.log(1 / (1 + np.exp(-(s[i] - s[j])))) for i, j, w in pairs) / 2
    assert float(one_way) == pytest.approx(want, rel=1e-5)
    # A strictly ordered list gives what the list order gives.
    scores = jnp.array([0.3, 0.9, 0.1, 0.5])
    assert float(anchor_ranking(scores, ranks=jnp.array([1, 2, 3, 4]))) == pytest.approx(
        float(anchor_ranking(scores)))
    np.testing.assert_array_equal(
        preference_pairs(ranks, jnp.ones(3, bool)),
        [[False, True, True], [False, False, False], [False, False, False]])



def test_shuffle_among_valid_permutes_valid_entries_in_place_of_valid_ones():
    values = jnp.asarray([[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], [10.0, 20.0, 30.0, 40.0, 50.0, 60.0]])
    valid = jnp.asarray([[True, False, True, True, False, True],
                         [False, True, True, False, True, True]])
    seen = set()
    for seed in range(20):
        out = np.asarray(gr.shuffle_among_valid(values, valid, jax.random.key(seed)))
        for row, ok, got in zip(np.asarray(values), np.asarray(valid), out):
            np.testing.assert_array_equal(got[~ok], row[~ok])  # invalid entries stay put
            assert sorted(got[ok]) == sorted(row[ok])  # the valid ones are permuted among them
        seen.add(tuple(out[0]))
    assert len(seen) > 10  # a random permutation, not a fixed one (4! = 24 possible)
    jitted = jax.jit(gr.shuffle_among_valid)
    np.testing.assert_array_equal(jitted(values, valid, jax.random.key(3)),
                                  gr.shuffle_among_valid(values, valid, jax.random.key(3)))


def test_clipped_scores_leave_no_gain_in_piling_negative_weight_on_a_light_positive_item():
    """Rubrics that tell three answers apart by the same item ``b``: ``[5] a, [-5] b`` (twice)
    and ``[1] a, [-5] b, [-5] c`` (``c`` met by the answers ``b`` is). Unclipped, the latter's
    scores spread over [-9, 1] and its discrimination is 10 times the former's; read clipped
    to [0, 1], as the rewards do, the two are equal."""
    weights = np.array([[5, -5, 0], [1, -5, -5], [5, -5, 0]], np.int32)
    item_valid = np.array([[True, True, False], [True, True, True], [True, True, False]])
    # verdicts[resp, rubric, item]: every answer meets a; answers 1 and 2 meet b (and c).
    v = np.zeros((3, 3, 3), np.float32)
    v[:, :, 0] = 1
    v[1:, :, 1:] = 1
    valid = gr.group_validity(weights, item_valid)
    spread = {clip: np.asarray(gr.group_discrimination(
        gr.group_scores(v, weights, item_valid, clip=clip), valid)) for clip in (False, True)}
    assert spread[False][1] == pytest.approx(10 * spread[False][0])
    assert spread[True][1] == pytest.approx(spread[True][0])


def test_item_rewards_are_each_items_rewards_as_a_one_item_rubric():
    """`item_rewards`: an item's discriminability and anchor ranking equal those of the rubric
    made of that item alone (weight 1), with a response mask, a short anchor list and tied
    reference ranks; padding items get 0."""
    rng = np.random.default_rng(7)
    b, g, k, m, n = 2, 3, 4, 3, 4
    v = (rng.uniform(size=(b, g, k, m)) > 0.5).astype(np.float32)
    av = rng.uniform(size=(b, g, n, m)).astype(np.float32)
    item_mask = rng.uniform(size=(b, g, m)) > 0.2
    response_mask = np.array([[1, 1, 1, 0], [1, 1, 1, 1]], bool)
    anchor_mask = np.array([[1, 1, 1, 0], [1, 1, 1, 1]], bool)
    ranks = np.array([[1, 2, 2, 4], [1, 2, 3, 4]])
    disc, anchor = jax.jit(dr.item_rewards)(v, av, item_mask, response_mask=response_mask,
                                            anchor_mask=anchor_mask, anchor_ranks=ranks)
    for row in range(b):
        for group in range(g):
            for item in range(m):
                if not item_mask[row, group, item]:
                    assert disc[row, group, item] == 0 and anchor[row, group, item] == 0
                    continue
                _, parts = dr.dynamic_rubric_rewards(
                    v[row, group, None, :, item, None], np.ones((1, 1)), np.ones((1, 1), bool),
                    av[row, group, None, :, item], response_mask=response_mask[row],
                    anchor_mask=anchor_mask[row], anchor_ranks=ranks[row])
                np.testing.assert_allclose(disc[row, group, item], parts["disc"][0], atol=1e-6)
                np.testing.assert_allclose(anchor[row, group, item], parts["anchor"][0],
                                           atol=1e-6)
    p = v[0, 0, :3, 0].mean()  # row 0 masks its fourth response
    if item_mask[0, 0, 0]:
        np.testing.assert_allclose(disc[0, 0, 0], p * (1 - p), atol=1e-6)
