"""The compiled GenRubric round on tiny models under the 8-device mesh, and its token credit."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import changed_roles, round_case, tiny_tokenizer, trained_params

from jaxrubric.methods import GENRUBRIC
from jaxrubric.methods import genrubric as gr_method
from jaxrubric.methods.data import RoundResult, role_weights
from jaxrubric.methods.genrubric import GenRubricConfig
from jaxrubric.methods.round_config import RoleConfig
from jaxrubric.rewards.genrubric import group_validity
from jaxrubric.roles import TRAINED, Role
from jaxrubric.rubric import grammar as grammar_lib

WEIGHTS = (-5, -4, -3, -2, -1, 1, 2, 3, 4, 5)


def test_signed_weights_are_the_methods():
    assert GENRUBRIC.weights == grammar_lib.SIGNED_WEIGHTS == WEIGHTS


@pytest.mark.slow
def test_round_updates_both_models_and_compiles_once(round_mesh):
    # An untrained verifier says "no" to everything; its p_yes still varies, so soft verdicts
    # give both roles a reward signal (and adam without weight decay moves only on gradients).
    config = GenRubricConfig(num_rubrics=3, response_tokens=12, logprob_chunk=8, soft_verdicts=True)
    case = round_case(GENRUBRIC, config, round_mesh, anchors=[["1 2 3"], ["tac"]])
    setup, state, frozen, batch = case.setup, case.state, case.frozen, case.batch
    before = trained_params(state)

    step = case.round_step()
    for r in range(2):
        state, out = step(state, batch, jax.random.key(r))
    assert isinstance(out, RoundResult) and isinstance(out.outputs, gr_method.Outputs)
    scalars, outputs = jax.device_get(out.scalars), jax.device_get(out.outputs)

    assert int(state.round) == 2
    assert step.jitted._cache_size() == 1
    assert all(np.isfinite(v) for v in scalars.values()), scalars
    assert scalars["generator/grad_norm"] > 0 and scalars["policy/grad_norm"] > 0
    assert changed_roles(before, state) == set(TRAINED)
    assert outputs.responses.shape == (2, 3, 12)
    assert outputs.scores.shape == (2, 3, 3)

    # The frozen-evaluator / frozen-policy flags drop the updates (traced only, not compiled).
    frozen_setup = dataclasses.replace(setup, config=dataclasses.replace(
        config, policy=dataclasses.replace(config.policy, freeze=True),
        generator=dataclasses.replace(config.generator, freeze=True)))
    assert all(frozen_setup.roles[role].compiled_out for role in TRAINED)
    _, traced = jax.eval_shape(functools.partial(GENRUBRIC.round, frozen_setup), state,
                               frozen, batch, jax.random.key(0))
    assert not {"generator/loss", "policy/loss"} & set(traced.scalars)
    assert {"generator/loss", "policy/loss"} <= set(scalars)
    # Two responses per group (traced): the policy learns from all six of a query's.
    two_setup = dataclasses.replace(setup, config=dataclasses.replace(config, induced_responses=2))
    _, traced = jax.eval_shape(functools.partial(GENRUBRIC.round, two_setup), state, frozen,
                               batch, jax.random.key(0))
    assert traced.outputs.responses.shape == (2, 6, 12)
    assert traced.outputs.scores.shape == (2, 6, 3) and traced.outputs.policy_reward.shape == (2, 6)
    assert traced.outputs.generator_reward.shape == (2, 3)
    assert {"generator/loss", "policy/loss"} <= set(traced.scalars)

    # The rubric metrics agree with a host-side parse of the sampled rubric tokens.
    parsed = grammar_lib.parse_rubric_tokens(outputs.rubrics, jax.device_put(setup.grammar),
                                             setup.pad_id)
    weights, valid = np.asarray(parsed.weights), np.asarray(parsed.valid)
    np.testing.assert_array_equal(weights, outputs.judgement.weights)
    assert set(weights[valid].tolist()) <= set(WEIGHTS)
    assert np.asarray(parsed.complete).all()  # the grammar always lets a rubric finish
    group_valid = np.asarray(group_validity(weights, valid))
    np.testing.assert_array_equal(group_valid, outputs.judgement.group_valid)
    assert scalars["rubric/valid_rate"] == pytest.approx(group_valid.mean())
    assert scalars["rubric/items"] == pytest.approx(valid.sum(-1).mean())
    assert 1 <= scalars["rubric/items"] <= 3
    assert scalars["rubric/negative_items"] == pytest.approx((valid & (weights < 0)).sum(-1).mean())
    assert 0 <= scalars["rubric/negative_items"] <= scalars["rubric/items"]
    # Malformed groups are rewarded 0 and score nothing.
    assert np.all(outputs.generator_reward[~group_valid] == 0)
    assert np.all(outputs.scores.transpose(0, 2, 1)[~group_valid] == 0)


@pytest.mark.slow
def test_token_advantages_put_item_credit_on_item_tokens():
    tok = tiny_tokenizer()
    grammar = grammar_lib.build_rubric_grammar(tok, weights=WEIGHTS, max_items=3,
                                               max_item_tokens=8)
    texts = ["[3] Mentions the dose\n[-2] Recommends aspirin\n",
             "[5] Says to see a doctor\n[2] Mentions the dose\n",
             "[-4] Gives a wrong fact\n"]  # no positive weight: malformed
    ids = [tok.encode(t, add_special_tokens=False) + [tok.eos_token_id] for t in texts]
    length = max(map(len, ids)) + 2
    tokens = np.full((1, 3, length), tok.pad_token_id, np.int32)
    for g, row in enumerate(ids):
        tokens[0, g, :len(row)] = row
    parsed = grammar_lib.parse_rubric_tokens(tokens, jax.device_put(grammar), tok.pad_token_id)
    assert np.asarray(parsed.complete).all()
    np.testing.assert_array_equal(parsed.weights[0], [[3, -2, 0], [5, 2, 0], [-4, 0, 0]])

    # verdicts[resp, rubric, item]; r2 (induced by the malformed group), the malformed group's
    # column and the empty item slot hold ones that must not count.
    v = np.ones((1, 3, 3, 3), np.float32)
    v[0, 0, 0, :2] = [1, 0]  # S_0(r0) = 3/3
    v[0, 1, 0, :2] = [1, 1]  # S_0(r1) = (3-2)/3
    v[0, 0, 1, :2] = [1, 1]  # S_1(r0) = 7/7
    v[0, 1, 1, :2] = [0, 1]  # S_1(r1) = 2/7
    credit = jax.device_get(gr_method.generator_credit(parsed, jnp.asarray(v)))

    # sequence = comprehensiveness (the other valid group on r_g) + std over valid responses
    seq = np.array([1 + 1 / 3, 1 / 3 + 5 / 14, 0.0])
    np.testing.assert_allclose(credit.sequence_reward[0], seq, rtol=1e-5)
    np.testing.assert_array_equal(credit.group_valid[0], [True, True, False])
    # items: 0.5 discriminative (some but not all of r0, r1 meet it) + 0.5 non-redundant
    np.testing.assert_allclose(credit.item_reward[0], [[0.5, 1, 0], [1, 0.5, 0], [0, 0, 0]])
    # The malformed group's advantage is the lowest: its reward is ranked 1 below the lowest
    # well-formed group's (`rl.grpo.rank_invalid_last`) before the z-score over the G groups.
    ranked = np.array([seq[0], seq[1], seq[1] - 1])
    seq_adv = (ranked - ranked.mean()) / (ranked.std() + 1e-6)
    item_adv = np.array([[-1, 1, 0], [1, -1, 0], [0, 0, 0]], np.float32) * 0.25 / (0.25 + 1e-6)

    token_item = np.asarray(parsed.token_item[0])
    adv = credit.token_advantages[0]
    for g in range(3):
        for m, line in enumerate(texts[g].splitlines()):
            marked = token_item[g] == m
            assert tok.decode(tokens[0, g][marked]).strip() == line.split("] ", 1)[1]
            np.testing.assert_allclose(adv[g][marked], seq_adv[g] + item_adv[g, m], rtol=1e-5)
        structural = token_item[g] == -1
        assert structural.sum() >= 5  # "[", weight, "]", newline, end token, padding
        np.testing.assert_allclose(adv[g][structural], seq_adv[g], rtol=1e-5)


@pytest.mark.slow
def test_the_control_shuffles_rewards_among_well_formed_groups_and_valid_items():
    """`shuffle_key` (round.shuffle_generator_credit): the same rewards, permuted among each
    query's well-formed groups (items among its valid items); a malformed group keeps reward 0
    and the lowest advantage."""
    tok = tiny_tokenizer()
    grammar = grammar_lib.build_rubric_grammar(tok, weights=WEIGHTS, max_items=2,
                                               max_item_tokens=8)
    texts = [["[3] Mentions the dose\n[-2] Recommends aspirin\n", "[5] Says to see a doctor\n",
              "[2] Mentions the dose\n[4] Is short\n", "[-4] Gives a wrong fact\n"]] * 2
    ids = [[tok.encode(t, add_special_tokens=False) + [tok.eos_token_id] for t in q] for q in texts]
    length = max(len(r) for q in ids for r in q) + 2
    tokens = np.full((2, 4, length), tok.pad_token_id, np.int32)
    for b, q in enumerate(ids):
        for g, row in enumerate(q):
            tokens[b, g, :len(row)] = row
    parsed = grammar_lib.parse_rubric_tokens(tokens, jax.device_put(grammar), tok.pad_token_id)
    verdicts = jax.random.bernoulli(jax.random.key(0), 0.5, (2, 4, 4, 2)).astype(jnp.float32)
    plain = jax.device_get(gr_method.generator_credit(parsed, verdicts))
    orders = set()
    for seed in range(8):
        shuffled = jax.device_get(gr_method.generator_credit(parsed, verdicts,
                                                             shuffle_key=jax.random.key(seed)))
        valid = plain.group_valid
        np.testing.assert_array_equal(valid, [[True, True, True, False]] * 2)
        for b in range(2):
            assert sorted(shuffled.sequence_reward[b][valid[b]]) == pytest.approx(
                sorted(plain.sequence_reward[b][valid[b]]))
            mask = plain.item_valid[b] & valid[b][:, None]
            assert sorted(shuffled.item_reward[b][mask]) == pytest.approx(
                sorted(plain.item_reward[b][mask]))
            assert shuffled.sequence_reward[b, 3] == 0
            # A rubric's first token ("[") is structure: it carries the sequence advantage.
            sequence_advantage = shuffled.token_advantages[b, :, 0]
            assert sequence_advantage[3] < sequence_advantage[:3].min()
        orders.add(tuple(shuffled.sequence_reward[0].round(6)))
    assert len(orders) > 1


@pytest.mark.slow
@pytest.mark.parametrize("common, per_group", [(False, 1), (True, 1), (True, 2)])
def test_common_noise_makes_one_querys_identical_rubrics_induce_one_response(
        round_mesh, common, per_group):
    """`round.induce_common_noise`: the i-th induced responses of a query's groups draw one
    noise stream, so rubrics that say the same thing induce the same responses; otherwise each
    draws its own (as a group's N responses always do)."""
    config = GenRubricConfig(num_rubrics=3, response_tokens=10, induce_common_noise=common,
                             induced_responses=per_group, policy=RoleConfig(temperature=1.0))
    case = round_case(GENRUBRIC, config, round_mesh, anchors=[["1 2 3"], ["tac"]])
    policy = role_weights(case.state, case.frozen, Role.POLICY)
    generator = role_weights(case.state, case.frozen, Role.GENERATOR)

    @jax.jit
    def induce(generator, policy, question, rng):
        keys = gr_method.round_keys(rng)
        rubrics = gr_method.write(case.setup, generator, question, keys.write).samples
        # every group shown its query's first rubric
        rubrics = jax.tree.map(lambda x: jnp.broadcast_to(x[:, :1], x.shape), rubrics)
        return gr_method.induce(case.setup, policy, question, rubrics, keys.induce).responses

    responses = jax.device_get(induce(generator, policy, case.batch.question, jax.random.key(1)))
    assert responses.tokens.shape == (2, 3 * per_group, 10)
    sets = responses.tokens.reshape(2, 3, per_group, 10)  # [query, group, i, token]
    same = [np.array_equal(q[0, i], q[g, i]) for q in sets for g in (1, 2)
            for i in range(per_group)]
    assert all(same) if common else not any(same)
    if per_group > 1:
        assert not np.array_equal(sets[:, :, 0], sets[:, :, 1])


@pytest.mark.slow
def test_several_induced_responses_average_the_rewards_of_their_response_sets():
    """`responses_per_group` N: the generator's rewards are the mean of the rewards each set of
    one response per group earns; the policy's reward of a response leaves out its own
    group's rubric; N = 1 is the paper's round."""
    tok = tiny_tokenizer()
    grammar = grammar_lib.build_rubric_grammar(tok, weights=WEIGHTS, max_items=2,
                                               max_item_tokens=8)
    texts = ["[3] Mentions the dose\n[-2] Recommends aspirin\n", "[5] Says to see a doctor\n",
             "[2] Mentions the dose\n[4] Is short\n", "[-4] Gives a wrong fact\n"]
    ids = [tok.encode(t, add_special_tokens=False) + [tok.eos_token_id] for t in texts]
    tokens = np.full((1, 4, max(map(len, ids)) + 2), tok.pad_token_id, np.int32)
    for g, row in enumerate(ids):
        tokens[0, g, :len(row)] = row
    parsed = grammar_lib.parse_rubric_tokens(tokens, jax.device_put(grammar), tok.pad_token_id)
    # verdicts of 3 responses per group: [query, group * 3 + i, rubric, item]
    verdicts = jax.random.bernoulli(jax.random.key(2), 0.5, (1, 12, 4, 2)).astype(jnp.float32)
    kwargs = dict(coefficients=dict(discriminative_coef=0.5, nonredundant_coef=0.25))
    both = jax.device_get(gr_method.generator_credit(parsed, verdicts, responses_per_group=3,
                                                     **kwargs))
    sets = [jax.device_get(gr_method.generator_credit(parsed, verdicts[:, i::3], **kwargs))
            for i in range(3)]
    for field in ("sequence_reward", "item_reward"):
        np.testing.assert_allclose(getattr(both, field),
                                   np.mean([getattr(c, field) for c in sets], 0), rtol=1e-6)
    np.testing.assert_allclose(both.scores[:, 1::3], sets[1].scores, rtol=1e-6)

    reward, valid = gr_method.induced_response_rewards(both.scores, both.group_valid)
    judges = np.array([[False, True, True, False], [True, False, True, False],
                       [True, True, False, False], [True, True, True, False]])  # group 3 malformed
    want = [(both.scores[0, r] * judges[r // 3]).sum() / judges[r // 3].sum() for r in range(12)]
    np.testing.assert_allclose(reward[0], want, rtol=1e-6)
    assert np.asarray(valid).all()


def test_the_policys_advantages_take_its_own_mode():
    """The policy's `advantage_mode` reaches the GenRubric policy's advantages over a query's
    responses, whatever the generator's."""
    scores = jax.random.uniform(jax.random.key(4), (2, 4, 4))  # [query, response, rubric]
    group_valid = jnp.array([[True, True, True, False], [True, True, True, True]])
    reward, valid, _ = gr_method.policy_credit(scores, group_valid, GenRubricConfig())
    reward, valid = np.asarray(reward, np.float64), np.asarray(valid)
    assert valid.all() and np.ptp(reward, -1).min() > 0
    centred = reward - reward.mean(-1, keepdims=True)
    for config, want in ((GenRubricConfig(policy=RoleConfig(advantage_mode="no_std")), centred),
                         (GenRubricConfig(policy=RoleConfig(advantage_mode="no_std"),
                                          generator=RoleConfig(advantage_mode="no_std")), centred),
                         (GenRubricConfig(policy=RoleConfig(advantage_mode="group_std"),
                                          generator=RoleConfig(advantage_mode="no_std")),
                          centred / (reward.std(-1, keepdims=True) + 1e-6))):
        _, _, advantages = gr_method.policy_credit(scores, group_valid, config)
        np.testing.assert_allclose(np.asarray(advantages), want, rtol=1e-5, atol=1e-6)
