"""The compiled DynamicRubric round on tiny models under the 8-device mesh."""

import dataclasses

import helpers
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import changed_roles, round_case, trained_params
from jax.sharding import NamedSharding, PartitionSpec

import jaxrubric
from jaxrubric.methods import DYNAMIC_RUBRIC, dynamic_rubric
from jaxrubric.methods.data import RoundResult, RoundState
from jaxrubric.methods.dynamic_rubric import DynamicRubricConfig
from jaxrubric.methods.programs import round_program
from jaxrubric.methods.round_config import RoleConfig, RoundConfig
from jaxrubric.methods.shapes import check_micro_batches
from jaxrubric.roles import TRAINED, Role


@pytest.mark.slow
def test_round_updates_both_models_and_compiles_once(round_mesh):
    # Soft verdicts: an untrained verifier says "no" to nearly everything, so 0/1 verdicts
    # would give zero rewards and zero gradients.
    config = DynamicRubricConfig(num_responses=4, num_rubrics=2, response_tokens=12,
                                 logprob_chunk=8, soft_verdicts=True)
    case = round_case(DYNAMIC_RUBRIC, config, round_mesh)
    state = case.state
    before = trained_params(state)
    step = case.round_step()
    for r in range(2):
        state, out = step(state, case.batch, jax.random.key(r))
    assert isinstance(state, RoundState) and isinstance(out, RoundResult)
    assert isinstance(out.outputs, dynamic_rubric.Outputs)
    scalars = jax.device_get(out.scalars)
    assert int(state.round) == 2
    assert all(np.isfinite(v) for v in scalars.values()), scalars
    assert scalars["rubric/valid_rate"] == 1.0 and 1 <= scalars["rubric/items"] <= 3
    assert scalars["policy/grad_norm"] > 0 and scalars["generator/grad_norm"] > 0
    assert changed_roles(before, state) == set(TRAINED)
    assert step.jitted._cache_size() == 1
    assert out.outputs.responses.shape == (2, 4, 12)
    assert out.outputs.scores.shape == (2, 4, 2)


@pytest.mark.slow
def test_static_rubrics_and_the_oracle_reward(round_mesh):
    """`rubric_source="static"`: the generator's prompt holds the question alone; the policy
    can be rewarded by a ground-truth function instead of rubric scores."""
    config = DynamicRubricConfig(num_responses=2, num_rubrics=2, response_tokens=4,
                                 rubric_source="static", policy_reward="oracle",
                                 policy=RoleConfig(freeze=True), generator=RoleConfig(freeze=True))
    with pytest.raises(ValueError, match="oracle_reward"):
        round_case(DYNAMIC_RUBRIC, config, round_mesh)
    with pytest.raises(ValueError, match="rubric_source"):
        DynamicRubricConfig(rubric_source="both")
    # GenRubric's settings are not DynamicRubric's: its config type has none of them.
    for key in ("shuffle_generator_credit", "induce_common_noise", "induced_responses"):
        with pytest.raises(TypeError, match=key):
            DynamicRubricConfig(**{key: 2})
    case = round_case(DYNAMIC_RUBRIC, DynamicRubricConfig(
        num_responses=2, num_rubrics=2, response_tokens=4, rubric_source="static",
        policy=RoleConfig(freeze=True), generator=RoleConfig(freeze=True)), round_mesh)
    assert case.setup.generator_template.slots == ("prompt",)
    # A reward that differs between a prompt's answers; the policy's advantages centred per
    # prompt and not divided by their spread (the policy's `advantage_mode="no_std"`).
    oracle = lambda tokens, lengths, question: tokens.sum(-1).astype(jnp.float32)  # noqa: E731
    setup = dataclasses.replace(case.setup, config=dataclasses.replace(
        case.setup.config, policy_reward="oracle",
        policy=dataclasses.replace(case.setup.config.policy, advantage_mode="no_std")),
        oracle_reward=oracle)
    out = jax.jit(lambda s, f, b, r: dynamic_rubric.rollout(
        setup, s, f, b, dynamic_rubric.round_keys(r)))(
        case.state, case.frozen, case.batch, jax.random.key(0))
    rewards = np.asarray(out.responses.tokens, np.float64).sum(-1)
    np.testing.assert_allclose(np.asarray(out.rewards.policy_reward), rewards, rtol=1e-6)
    assert np.ptp(rewards, axis=-1).min() > 0, rewards
    assert not np.allclose(np.ptp(rewards, axis=-1), 2), rewards  # where group_std would agree
    np.testing.assert_allclose(np.asarray(out.rewards.policy_advantages),
                               rewards - rewards.mean(-1, keepdims=True), rtol=1e-5, atol=1e-3)
    assert out.rubrics.samples.tokens.shape[:2] == (case.batch.question.tokens.shape[0], 2)


def test_each_role_has_its_own_advantage_mode():
    config = RoundConfig(policy=RoleConfig(advantage_mode="no_std"),
                         generator=RoleConfig(advantage_mode="batch_std"))
    assert (config.roles[Role.POLICY].advantage_mode,
            config.roles[Role.GENERATOR].advantage_mode) == ("no_std", "batch_std")
    with pytest.raises(ValueError, match="policy.advantage_mode 'std' is not one of"):
        RoundConfig(policy=RoleConfig(advantage_mode="std"))


def test_entropy_bonus_is_per_role_and_never_negative():
    config = RoundConfig(generator=RoleConfig(entropy=0.05))
    assert (config.generator.entropy, config.policy.entropy) == (0.05, 0.0)
    with pytest.raises(ValueError, match="generator.entropy must be >= 0"):
        RoundConfig.from_tree({"generator": {"entropy": -0.1}})


def test_methods_are_registered_by_name():
    from jaxrubric.methods import GENRUBRIC, METHODS, get_method

    assert METHODS == {"dynamic_rubric": DYNAMIC_RUBRIC, "genrubric": GENRUBRIC}
    assert get_method("dynamic_rubric") is DYNAMIC_RUBRIC and get_method("genrubric") is GENRUBRIC
    with pytest.raises(ValueError, match="'genrubrik' is not one of .*did you mean 'genrubric'"):
        get_method("genrubrik")
    assert DYNAMIC_RUBRIC.evaluates and GENRUBRIC.evaluates


def _rewards(**fields) -> dynamic_rubric.Rewards:
    """A reward stage's output with only `fields` set."""
    return dynamic_rubric.Rewards(*[None] * len(dynamic_rubric.Rewards._fields))._replace(
        **fields)


@pytest.mark.slow
def test_evaluation_gaps_the_listed_anchor_pairs_under_the_valid_groups():
    """`anchor_delta_gap`: the mean score difference of every better-worse pair of listed
    anchor answers, each scored by the mean of the valid groups."""
    anchor_scores = jnp.asarray([[[0.9, 0.0], [0.5, 1.0], [0.2, 1.0], [0.1, 0.0]],
                                 [[0.6, 0.3], [0.7, 0.1], [0.0, 0.0], [0.0, 0.0]]])
    group_valid = jnp.asarray([[True, False], [True, True]])
    scores = jnp.asarray([[[0.2, 1.0], [0.4, 1.0]], [[1.0, 0.0], [0.5, 0.5]]])  # [B, K, G]
    mask = jnp.asarray([[True, True, True, False], [True, True, False, False]])
    judged = dynamic_rubric.Judged(None, None, scores, anchor_scores)
    rewards = _rewards(group_valid=group_valid, scoring=group_valid)
    strict = jnp.asarray([[1, 2, 3, 4], [1, 2, 3, 4]])
    anchors = dynamic_rubric.Anchors(None, None, mask, strict)
    metrics = jax.device_get(dynamic_rubric.held_out_metrics(None, anchors, judged, rewards))
    # Row 0 (group 0 only): 0.9, 0.5, 0.2 -> gaps 0.4, 0.7, 0.3; row 1: 0.45, 0.4 -> 0.05.
    assert metrics["anchor_delta_gap"] == pytest.approx((0.4 + 0.7 + 0.3 + 0.05) / 4)
    assert metrics["anchor_pair_accuracy"] == 1.0
    assert metrics["policy_score"] == pytest.approx((0.2 + 0.4 + 0.5 + 0.5) / 4)
    assert metrics["rubric_valid_rate"] == pytest.approx(0.75)
    assert "quality" not in metrics and "delta_gap" not in metrics
    # Tied reference ranks make no pair: row 0 ranked [1, 2, 2] keeps 0.9-0.5 and 0.9-0.2.
    tied = dynamic_rubric.Anchors(None, None, mask, jnp.asarray([[1, 2, 2, 4], [1, 2, 3, 4]]))
    metrics = jax.device_get(dynamic_rubric.held_out_metrics(None, tied, judged, rewards))
    assert metrics["anchor_delta_gap"] == pytest.approx((0.4 + 0.7 + 0.05) / 3)


@pytest.mark.slow
def test_evaluation_gaps_the_policys_own_answers_ordered_by_the_ground_truth():
    """The paper's Δgap: the evaluator's score of the better minus the worse of each pair of
    the policy's own answers, pairs ordered by the oracle; and the share ordered right."""
    judged = dynamic_rubric.Judged(None, None, jnp.zeros((2, 3, 1)), jnp.zeros((2, 1, 1)))
    rewards = _rewards(group_valid=jnp.ones((2, 1), bool), scoring=jnp.ones((2, 1), bool),
                       oracle_reward=jnp.asarray([[1.0, 0.5, 0.5], [0.2, 0.0, 0.9]]),
                       rubric_reward=jnp.asarray([[0.8, 0.3, 0.9], [0.5, 0.5, 0.7]]))
    anchors = dynamic_rubric.Anchors(None, None, jnp.ones((2, 1), bool), jnp.ones((2, 1)))
    metrics = jax.device_get(dynamic_rubric.held_out_metrics(None, anchors, judged, rewards))
    # Row 0: (0>1) 0.5, (0>2) -0.1 (wrong); the tie 1~2 makes no pair. Row 1: (0>1) 0.0 (a
    # tie in score: half right), (2>0) 0.2, (2>1) 0.2.
    assert metrics["delta_gap"] == pytest.approx((0.5 - 0.1 + 0.0 + 0.2 + 0.2) / 5)
    assert metrics["pair_accuracy"] == pytest.approx((1 + 0 + 0.5 + 1 + 1) / 5)
    # Its standard error clustered by question, by hand: the rows' summed gaps g = 0.4, 0.4
    # over n = 2, 3 pairs; residuals g - 0.16 n = 0.08, -0.08.
    assert metrics["delta_gap_se"] == pytest.approx(np.sqrt(2 * 0.08 ** 2) / 5)
    per_question = np.asarray([2 / 3, 1.1 / 3])
    assert metrics["quality"] == pytest.approx(per_question.mean())
    assert metrics["quality_se"] == pytest.approx(per_question.std() / np.sqrt(2))


@pytest.mark.slow
@pytest.mark.parametrize("dtype, param_dtype, stored", [
    ("bfloat16", "float32", "bfloat16"), ("float32", "bfloat16", "bfloat16"),
    ("float32", "float32", "float32")])
def test_reference_is_stored_in_the_compute_dtype_and_gives_the_same_logits(
        dtype, param_dtype, stored):
    """The forward casts weights to the compute dtype first, so a reference kept in it (never
    wider than the weights) computes exactly what the model does."""
    from flax import nnx

    from jaxrubric.train import reference_params

    cfg = jaxrubric.tiny_config("qwen3", dtype=dtype, param_dtype=param_dtype, num_layers=1)
    model = jaxrubric.init_model(cfg, seed=4)
    reference = reference_params(model)
    assert {x.dtype for x in jax.tree.leaves(reference)} == {jnp.dtype(stored)}
    tokens = jnp.asarray(np.random.default_rng(0).integers(3, 250, (2, 7)))
    np.testing.assert_array_equal(nnx.merge(nnx.graphdef(model), reference)(tokens),
                                  model(tokens))


@pytest.mark.slow
def test_runtime_switches_run_every_variant_in_one_program_as_its_own_round():
    """`round.runtime_switches`: the co-evolving, frozen-generator and oracle-reward runs are
    one compiled program (their lowered programs are the same text, and one jitted round
    serves all three through `Frozen.switches`), and each gives the round of its own
    compiled-out program: the same weights and rewards."""
    mesh = jaxrubric.sharding.single_device_mesh()
    oracle = lambda tokens, lengths, question: lengths.astype(jnp.float32) / 12  # noqa: E731
    base = DynamicRubricConfig(num_responses=4, num_rubrics=2, response_tokens=12, logprob_chunk=8,
                               soft_verdicts=True, policy=RoleConfig(beta=0.04),
                               generator=RoleConfig(beta=0.04))
    frozen_generator = dataclasses.replace(base.generator, freeze=True)
    runs = {"coevolve": {}, "frozen": {"generator": frozen_generator},
            "oracle": {"generator": frozen_generator, "policy_reward": "oracle"}}
    replicated = NamedSharding(mesh, PartitionSpec())

    def switched(name):
        config = dataclasses.replace(base, runtime_switches=True, **runs[name])
        case = round_case(DYNAMIC_RUBRIC, config, mesh, oracle_reward=oracle)
        return case, case.frozen._replace(
            switches=jax.device_put(config.switches(), replicated))

    texts = set()
    for name in runs:
        case, frozen = switched(name)
        program = round_program(case.setup, DYNAMIC_RUBRIC.round,
                                jax.tree.map(lambda x: x.sharding, case.state))
        texts.add(program.lower(case.state, frozen, case.batch, jax.random.key(0)).as_text())
    assert len(texts) == 1

    case, _ = switched("coevolve")
    program = round_program(case.setup, DYNAMIC_RUBRIC.round,
                            jax.tree.map(lambda x: x.sharding, case.state))
    for name, flags in runs.items():
        state, frozen = switched(name)[0].state, switched(name)[1]
        plain = round_case(DYNAMIC_RUBRIC, dataclasses.replace(base, **flags), mesh,
                           oracle_reward=oracle)
        plain_state, plain_step = plain.state, plain.round_step()
        for r in range(2):
            state, out = program(state, frozen, case.batch, jax.random.key(r))
            plain_state, plain_out = plain_step(plain_state, plain.batch, jax.random.key(r))
        for role in TRAINED:
            np.testing.assert_allclose(helpers.flat(state.role(role).params),
                                       helpers.flat(plain_state.role(role).params),
                                       atol=1e-6, err_msg=f"{name}: {role}")
        scalars, plain_scalars = jax.device_get((out.scalars, plain_out.scalars))
        for key, value in plain_scalars.items():
            np.testing.assert_allclose(scalars[key], value, rtol=1e-5, atol=1e-6,
                                       err_msg=f"{name}: {key}")
        skipped = set(scalars) - set(plain_scalars)  # a switched-off update's zeros
        assert all(k.startswith("generator/") and scalars[k] == 0 for k in skipped), skipped
        assert bool(skipped) == (name != "coevolve")
    assert program._cache_size() == 1


@pytest.mark.slow
def test_evaluation_micro_batches_give_the_same_metrics():
    """`round.eval_micro_batches`: the held-out rollout in pieces samples and judges the same
    rows as in one piece (the toy world evaluates 256 prompts in 32)."""
    mesh = jaxrubric.sharding.single_device_mesh()
    oracle = lambda tokens, lengths, question: lengths.astype(jnp.float32) / 12  # noqa: E731
    config = DynamicRubricConfig(num_responses=2, num_rubrics=2, response_tokens=8,
                                 soft_verdicts=True, eval_micro_batches=2)
    assert config.for_evaluation().rollout_micro_batches == 2
    assert dataclasses.replace(config, eval_micro_batches=0).for_evaluation() == \
        dataclasses.replace(config, eval_micro_batches=0)
    with pytest.raises(ValueError, match="eval_micro_batches must be >= 0"):
        RoundConfig(eval_micro_batches=-1)
    with pytest.raises(ValueError, match=r"eval_micro_batches=2 must divide the held-out "
                                         r"prompts \(data.eval_batch_size\), 3"):
        check_micro_batches(config, {Role.POLICY: 2, Role.GENERATOR: 2},
                            {Role.GENERATOR: (4, 2), Role.POLICY: (4, 2)}, eval_prompts=3)
    case = round_case(DYNAMIC_RUBRIC, config, mesh, oracle_reward=oracle)
    metrics = [jax.device_get(jax.jit(lambda s, f, b, r, c=c: DYNAMIC_RUBRIC.evaluate(
        dataclasses.replace(case.setup, config=c), s, f, b, r))(
            case.state, case.frozen, case.batch, jax.random.key(3)))
        for c in (config, config.for_evaluation())]
    assert set(metrics[0]) == set(metrics[1]) and "quality" in metrics[0]
    # The metrics are means and differences of scores in [0, 1]: a difference near 0
    # (anchor_delta_gap, -5e-4) moves by the float32 rounding of its terms when the verifier's
    # products run over half the rows (3e-8 measured), hence an absolute tolerance in that unit.
    for key, value in metrics[0].items():
        np.testing.assert_allclose(metrics[1][key], value, rtol=1e-6, atol=1e-6, err_msg=key)
