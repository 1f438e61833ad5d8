"""Two aids to the DynamicRubric generator's exploration. Explorer rubrics
(`round.explorer_rubrics`, `generator.explorer`): a fixed model writes the last m of each
prompt's G rubrics; they are judged and rewarded with the group and the generator learns from
them off-policy (ratio 1, no KL), but they never score the policy. Item-level credit
(`round.item_credit`): each item token adds its item's own advantage to its rubric's."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from helpers import params_copy, round_case

import jaxrubric
from jaxrubric.config import ConfigFileError, base_config, check_config
from jaxrubric.methods import DYNAMIC_RUBRIC, dynamic_rubric, update
from jaxrubric.methods.data import RoleState
from jaxrubric.methods.dynamic_rubric import DynamicRubricConfig, explorer_groups
from jaxrubric.methods.genrubric import GenRubricConfig
from jaxrubric.methods.programs import round_program
from jaxrubric.methods.round_config import RoleConfig, RoundConfig
from jaxrubric.methods.setup import RoleSpec
from jaxrubric.roles import Role


@pytest.mark.slow
def test_off_policy_rows_take_the_plain_policy_gradient_step_and_no_kl():
    """Against the loss written out here: on-policy rows the clipped ratio to the sampler's
    log-probs (1 at the first step) plus beta times the k3 KL to the reference; off-policy rows
    -A exp(logp - stop_gradient(logp)), whatever their sampler log-probs and reference say."""
    model = jaxrubric.init_model(jaxrubric.tiny_config("qwen3", num_layers=1), seed=1)
    rng = np.random.default_rng(2)
    rows, p, n, lr, beta = 4, 5, 6, 0.5, 0.2
    prompt = jnp.asarray(rng.integers(3, 257, (rows, p)), jnp.int32)
    prompt_mask = jnp.asarray(np.arange(p)[None] >= np.array([[0], [1], [3], [0]]))
    completion = jnp.asarray(rng.integers(3, 257, (rows, n)), jnp.int32)
    mask = jnp.asarray(np.arange(n)[None] < np.array([[6], [2], [4], [3]]))
    advantages = jnp.asarray([0.7, -1.2, 1.5, -0.4])
    off = jnp.asarray([False, True, True, False])
    graph, params = nnx.graphdef(model), nnx.state(model, nnx.Param)
    ref = jax.tree.map(lambda x: x * 1.05, params)
    own = update.completion_logprobs(model, prompt, prompt_mask, completion, 4)
    # Another model's log-probs on the off-policy rows: they must not matter.
    sampler = jnp.where(off[:, None], own - 2.0, own)
    cfg = RoundConfig(num_updates=1, logprob_chunk=4)
    spec = RoleSpec(graph, optax.sgd(lr), RoleConfig(beta=beta), compiled_out=False)
    state = RoleState(params, spec.optimizer.init(params))
    new, _ = update.grpo_role_update(cfg, spec, state, None, ref, prompt, prompt_mask,
                                     completion, mask, sampler, advantages, jax.random.key(0),
                                     off_policy=off)

    ref_logp = update.completion_logprobs(nnx.merge(graph, ref), prompt, prompt_mask,
                                          completion, 4)

    def loss(prm):
        logp = update.completion_logprobs(nnx.merge(graph, prm), prompt, prompt_mask,
                                          completion, 4)
        ratio = jnp.exp(logp - jax.lax.stop_gradient(logp))  # 1, with the gradient of logp
        d = ref_logp - logp
        k3 = jnp.exp(d) - d - 1.0
        per_token = -advantages[:, None] * ratio + beta * jnp.where(off[:, None], 0.0, k3)
        return jnp.sum(per_token * mask) / jnp.sum(mask)

    grads = jax.grad(loss)(params)
    want = jax.tree.map(lambda x, g: x - lr * g, params, grads)
    for got, expected in zip(jax.tree.leaves(new.params), jax.tree.leaves(want)):
        np.testing.assert_allclose(got, expected, atol=2e-6)
    # Without the mask the off-policy rows' sampler log-probs and KL do move the update.
    plain, _ = update.grpo_role_update(cfg, spec, state, None, ref, prompt, prompt_mask,
                                       completion, mask, sampler, advantages, jax.random.key(0))
    gap = max(float(jnp.abs(a - b).max()) for a, b in
              zip(jax.tree.leaves(plain.params), jax.tree.leaves(new.params)))
    assert gap > 1e-4


@pytest.mark.slow
def test_the_explorer_writes_the_last_rubrics_which_never_score_the_policy():
    """G = 4, m = 2: the last two rubrics carry the explorer's log-probs (teacher-forced under
    the explorer, not the generator), the policy's reward is the mean of the generator's own
    valid groups, and the round with its off-policy update runs and changes the generator."""
    mesh = jaxrubric.sharding.single_device_mesh()
    config = DynamicRubricConfig(num_responses=2, num_rubrics=4, response_tokens=6, logprob_chunk=8,
                                 soft_verdicts=True, explorer_rubrics=2,
                                 generator=RoleConfig(beta=0.04))
    case = round_case(DYNAMIC_RUBRIC, config, mesh)
    explorer_model = case.models[Role.VERIFIER]  # the same tiny architecture, other weights
    frozen = case.frozen._replace(generator_explorer=params_copy(explorer_model))
    with pytest.raises(ValueError, match="explorer's weights"):
        jax.jit(lambda s, f, b, r: dynamic_rubric.rollout(
            case.setup, s, f, b, dynamic_rubric.round_keys(r)))(
            case.state, case.frozen, case.batch, jax.random.key(0))
    out = jax.jit(lambda s, f, b, r: dynamic_rubric.rollout(
        case.setup, s, f, b, dynamic_rubric.round_keys(r)))(
        case.state, frozen, case.batch, jax.random.key(0))
    rubrics, gen_input = out.rubrics.samples, out.rubrics.prompt
    b, g, length = rubrics.tokens.shape
    mask = np.arange(length) < np.asarray(rubrics.lengths)[..., None]
    for name, model in (("generator", case.models[Role.GENERATOR]),
                        ("explorer", explorer_model)):
        forced = np.asarray(update.shared_completion_logprobs(
            model, gen_input.tokens, gen_input.mask, rubrics.tokens, 8))
        close = np.abs(forced - np.asarray(rubrics.logprobs)) < 1e-4
        per_rubric = (close | ~mask).all(-1)  # [B, G]
        writer = slice(0, 2) if name == "generator" else slice(2, 4)
        assert per_rubric[:, writer].all(), name
        assert not per_rubric[:, 2:4 if name == "generator" else 0:2].any(), name

    rewards = out.rewards
    own = np.asarray(rewards.group_valid)[:, :2]
    np.testing.assert_array_equal(np.asarray(rewards.scoring), np.concatenate(
        [own, np.zeros_like(own)], axis=1))
    scores = np.asarray(out.judged.scores)[..., :2]  # [B, K, 2]
    want = (scores * own[:, None]).sum(-1) / np.maximum(own.sum(-1), 1)[:, None]
    np.testing.assert_allclose(np.asarray(rewards.rubric_reward), want, rtol=1e-6, atol=1e-7)

    program = round_program(case.setup, DYNAMIC_RUBRIC.round,
                            jax.tree.map(lambda x: x.sharding, case.state))
    before = params_copy(case.models[Role.GENERATOR])
    state, result = program(case.state, frozen, case.batch, jax.random.key(0))
    scalars = jax.device_get(result.scalars)
    assert np.isfinite(scalars["generator/explorer_advantage"])
    assert scalars["generator/grad_norm"] > 0
    assert any(float(jnp.abs(x - y).max()) > 0 for x, y in
               zip(jax.tree.leaves(state.generator.params), jax.tree.leaves(before)))


def _config(**round_keys):
    c = base_config()
    c.data.train = "some/hub-dataset"
    for key, value in round_keys.items():
        c.round[key] = value
    return c


def test_explorer_config_errors_name_the_keys():
    with pytest.raises(ValueError, match="explorer_rubrics must be in"):
        DynamicRubricConfig(num_rubrics=4, explorer_rubrics=4)
    with pytest.raises(ConfigFileError, match="go together"):
        check_config(_config(explorer_rubrics=1, num_rubrics=4))
    c = _config()
    c.generator.explorer = "/some/checkpoint"
    with pytest.raises(ConfigFileError, match="go together"):
        check_config(c)
    c = _config(explorer_rubrics=1, num_rubrics=4)
    c.generator.explorer = "/some/checkpoint"
    check_config(c)
    c.generator.lora.rank = 4
    with pytest.raises(ConfigFileError, match="fully fine-tuned generator"):
        check_config(c)
    for key, value in (("explorer_rubrics", 1), ("item_credit", 0.5)):  # not GenRubric's
        with pytest.raises(TypeError, match=key):
            GenRubricConfig(num_rubrics=4, **{key: value})
    with pytest.raises(ValueError, match="item_credit must be >= 0"):
        DynamicRubricConfig(item_credit=-1.0)
    np.testing.assert_array_equal(explorer_groups(DynamicRubricConfig(
        num_rubrics=4, explorer_rubrics=1)), [False, False, False, True])


@pytest.mark.slow
def test_item_credit_adds_each_items_advantage_to_its_tokens():
    """`round.item_credit`: per prompt the items' advantages are two z-scores over its valid
    items (mean 0 each, times the coefficient), padding items get none, and the generator's
    update advantages are its rubric's on every token plus the item's on the item's tokens."""
    mesh = jaxrubric.sharding.single_device_mesh()
    config = DynamicRubricConfig(num_responses=4, num_rubrics=3, response_tokens=6, logprob_chunk=8,
                                 soft_verdicts=True, item_credit=0.5)
    case = round_case(DYNAMIC_RUBRIC, config, mesh)
    out = jax.jit(lambda s, f, b, r: dynamic_rubric.rollout(
        case.setup, s, f, b, dynamic_rubric.round_keys(r)))(
        case.state, case.frozen, case.batch, jax.random.key(1))
    rewards, parsed = out.rewards, out.rubrics.parsed
    valid = np.asarray(parsed.valid & rewards.group_valid[..., None])
    item_adv = np.asarray(rewards.item_advantages)
    assert valid.sum() > 4 and np.all(item_adv[~valid] == 0)
    for row in range(valid.shape[0]):
        if valid[row].sum() > 1:
            assert abs(item_adv[row][valid[row]].mean()) < 1e-5
    tokens = np.asarray(rewards.generator_update_advantages)
    seq = np.asarray(rewards.generator_advantages)
    token_item = np.asarray(parsed.token_item)
    want = seq[..., None] + np.where(token_item >= 0, np.take_along_axis(
        item_adv, np.clip(token_item, 0, None), axis=-1), 0.0)
    np.testing.assert_allclose(tokens, want, atol=1e-6)
    assert (token_item >= 0).any() and (token_item < 0).any()
    step = case.round_step()
    _, result = step(case.state, case.batch, jax.random.key(1))
    scalars = jax.device_get(result.scalars)
    assert np.isfinite(scalars["generator/item_anchor"]) and scalars["generator/grad_norm"] > 0
