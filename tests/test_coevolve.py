"""The compiled DynamicRubric round on tiny models under the 8-device mesh."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from tokenizer_fixtures import byte_level_bpe

import jaxrubric
from jaxrubric import coevolve
from jaxrubric import sharding as shd

QUESTIONS = ["Sort the digits 3 1 2.", "Reverse the word cat."]
ANCHORS = [["1 2 3", "1 3 2", "3 2 1"], ["tac", "act"]]


def _setup(config, mesh):
    tok = byte_level_bpe()
    cfg = jaxrubric.tiny_config("qwen3", vocab_size=len(tok), eos_token_ids=(tok.eos_token_id,),
                                pad_token_id=tok.pad_token_id)
    models = [shd.shard_model(jaxrubric.init_model(cfg, seed=s), mesh) for s in (1, 2, 3)]
    policy, generator, verifier = models
    setup = coevolve.build_setup(
        config, tok, policy, generator, verifier, max_items=3, max_item_tokens=6,
        policy_optimizer=optax.adam(1e-3), generator_optimizer=optax.adam(1e-3))
    state = coevolve.init_state(setup, policy, generator)
    frozen = {"verifier": nnx_params(verifier), "policy_ref": nnx_params(policy),
              "generator_ref": nnx_params(generator)}
    batch = coevolve.encode_batch(tok, QUESTIONS, ANCHORS, prompt_tokens=16,
                                  policy_tokens=32, anchor_tokens=8, num_anchors=3)
    batch = {k: jax.device_put(v, shd.batch_sharding(mesh, v.ndim)) for k, v in batch.items()}
    return setup, state, frozen, batch


def nnx_params(model):
    from flax import nnx
    return jax.tree.map(jnp.copy, nnx.state(model, nnx.Param))


@pytest.fixture(scope="module")
def mesh():
    return shd.make_mesh({"data": 2, "fsdp": 1, "tensor": 4})


def test_round_updates_both_models_and_compiles_once(mesh):
    # Soft verdicts: an untrained verifier says "no" to nearly everything, so 0/1 verdicts
    # would give zero rewards and zero gradients.
    config = coevolve.RoundConfig(num_responses=4, num_rubrics=2, response_tokens=12,
                                  logprob_chunk=8, soft_verdicts=True)
    setup, state, frozen, batch = _setup(config, mesh)
    before = jax.tree.map(np.asarray, {k: state[k] for k in ("policy", "generator")})
    step = coevolve.make_round_step(setup, frozen)
    for r in range(2):
        state, out = step(state, batch, jax.random.key(r))
    scalars = jax.device_get(out["scalars"])
    assert int(state["round"]) == 2
    assert all(np.isfinite(v) for v in scalars.values()), scalars
    assert scalars["rubric/valid_rate"] == 1.0 and 1 <= scalars["rubric/items"] <= 3
    assert scalars["policy/grad_norm"] > 0 and scalars["generator/grad_norm"] > 0
    for role in ("policy", "generator"):
        changed = jax.tree.map(lambda a, b: not np.allclose(a, np.asarray(b)), before[role],
                               state[role])
        assert any(jax.tree.leaves(changed)), role
    assert step.jitted._cache_size() == 1
    assert out["outputs"]["responses"].shape == (2, 4, 12)
    assert out["outputs"]["scores"].shape == (2, 4, 2)


def test_static_rubrics_and_the_oracle_reward(mesh):
    """`rubric_source="static"`: the generator's prompt holds the question alone; the policy
    can be rewarded by a ground-truth function instead of rubric scores."""
    config = coevolve.RoundConfig(num_responses=2, num_rubrics=2, response_tokens=4,
                                  rubric_source="static", policy_reward="oracle",
                                  freeze_generator=True, freeze_policy=True)
    with pytest.raises(ValueError, match="oracle_reward"):
        _setup(config, mesh)
    with pytest.raises(ValueError, match="rubric_source"):
        coevolve.RoundConfig(rubric_source="both")
    setup, state, frozen, batch = _setup(coevolve.RoundConfig(
        num_responses=2, num_rubrics=2, response_tokens=4, rubric_source="static",
        freeze_generator=True, freeze_policy=True), mesh)
    assert setup.generator_template.slots == ("prompt",)
    oracle = lambda tokens, lengths, batch: lengths.astype(jnp.float32)  # noqa: E731
    setup = dataclasses.replace(setup, config=dataclasses.replace(
        setup.config, policy_reward="oracle"), oracle_reward=oracle)
    out = jax.jit(lambda s, f, b, r: coevolve.dynamic_rubric_rollout(setup, s, f, b, r))(
        state, frozen, batch, jax.random.key(0))
    np.testing.assert_array_equal(np.asarray(out.judged.policy_reward), np.asarray(out.text_len))
    assert out.rubrics.tokens.shape[:2] == (batch["prompt"].shape[0], 2)


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
