"""LoRA roles: adapters that start as the identity, fold into their weights exactly, are the only
thing a round trains (on the 8-device mesh), draw their dropout per row, resume bit for bit, and
export both ways: merged safetensors for transformers, a PEFT adapter folder for `peft`."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from helpers import round_case, stopped_after, tiny_models, tiny_tokenizer
from hf_fixtures import hf_logits, make_hf_model, save_hf_model

import jaxrubric
from jaxrubric import sharding as shd
from jaxrubric.config import ConfigFileError, load_config
from jaxrubric.methods.data import base_weights, role_weights
from jaxrubric.methods.dynamic_rubric import DynamicRubricConfig
from jaxrubric.methods.genrubric import GenRubricConfig
from jaxrubric.methods.round_config import RoleConfig
from jaxrubric.models import adapters
from jaxrubric.models import lora as lora_lib
from jaxrubric.models.config import LoraConfig, tiny_config
from jaxrubric.models.transformer import KVCache, init_model
from jaxrubric.roles import TRAINED, Role

ALL = LoraConfig(rank=4, alpha=8.0, targets=lora_lib.LORA_TARGETS)
IDS = jnp.array([[5, 17, 42, 7, 9, 11], [3, 8, 13, 21, 34, 55]])


def _randomise_b(model, seed: int = 1) -> None:
    """B is zero at the start; give it values so the adapters change the outputs."""
    for i, (name, p) in enumerate(sorted(model.layers.items())):
        if name.endswith(lora_lib.B_SUFFIX):
            p[...] = 0.05 * jax.random.normal(jax.random.key(seed + i), p.shape)


@pytest.mark.slow
def test_fresh_adapters_are_the_identity_and_merge_exactly():
    base = init_model(tiny_config(), seed=0)
    model = init_model(tiny_config(lora=ALL), seed=0)
    np.testing.assert_array_equal(model(IDS), base(IDS))  # B = 0 and the same base draws
    _randomise_b(model)
    adapted = model(IDS)
    assert float(jnp.abs(adapted - base(IDS)).max()) > 1e-2
    merged = adapters.merged(model)
    assert merged.config.lora is None and not nnx.state(merged, nnx.LoRAParam)
    np.testing.assert_allclose(merged(IDS), adapted, atol=1e-5)
    # The decode path (unrolled layers, a KV cache) adapts the same way.
    cache = KVCache.empty(model.config, IDS.shape[0], IDS.shape[1])
    logits, _ = model.unstacked()(IDS, cache=cache)
    np.testing.assert_allclose(logits, adapted, atol=1e-5)


@pytest.mark.slow
def test_dropout_draws_each_rows_own_mask():
    model = init_model(tiny_config(lora=LoraConfig(rank=4, dropout=0.5)), seed=0)
    _randomise_b(model)
    keys = jax.random.split(jax.random.key(0), IDS.shape[0])
    dropped = model(IDS, lora_drop_keys=keys)
    assert float(jnp.abs(dropped - model(IDS)).max()) > 1e-3  # dropout is on
    # A row's draw depends on its own key only: the same alone as in the batch.
    np.testing.assert_allclose(model(IDS[1:], lora_drop_keys=keys[1:]), dropped[1:], atol=1e-6)


def _lora_models(tokenizer, mesh, lora: LoraConfig):
    models = tiny_models(tokenizer, mesh)
    for role in TRAINED:
        adapters.add_adapters(models[role], lora, seed=7, mesh=mesh)
    return models


@pytest.mark.slow
@pytest.mark.parametrize("method", ["dynamic_rubric", "genrubric"])
def test_a_lora_round_trains_only_the_adapters_on_the_mesh(method):
    mesh = shd.make_mesh({"fsdp": 4, "tensor": 2})
    tokenizer = tiny_tokenizer()
    lora = LoraConfig(rank=4, alpha=8.0, dropout=0.1, targets=("q_proj", "v_proj", "down_proj"))
    models = _lora_models(tokenizer, mesh, lora)
    base = {role: jax.device_get(base_weights(models[role])) for role in TRAINED}
    # Soft verdicts (rewards from p(yes)): a random tiny verifier's p(yes) sits near 1/2, so its
    # hard verdicts are a matter of rounding; under one compile they all came out "yes", every
    # advantage was 0 and nothing could move. p(yes) always varies.
    shared = dict(num_rubrics=2, response_tokens=6, update_micro_batches=2, soft_verdicts=True,
                  policy=RoleConfig(beta=0.04), generator=RoleConfig(beta=0.04))
    config = {"dynamic_rubric": DynamicRubricConfig(num_responses=4, **shared),
              "genrubric": GenRubricConfig(**shared)}[method]
    case = round_case(method, config, mesh, tokenizer=tokenizer, models=models,
                      questions=["Sort 3 1 2."] * 8, anchors=[["1 2 3", "3 2 1"]] * 8)
    for role in TRAINED:
        names = set(case.state.role(role).params["layers"])
        assert names == {f"{t}{s}" for t in lora.targets
                         for s in (lora_lib.A_SUFFIX, lora_lib.B_SUFFIX)}
        assert case.frozen.reference(role) is None and case.frozen.base(role) is not None
        # AdamW moments for the adapters only.
        sizes = {x.size for x in jax.tree.leaves(case.state.role(role).opt_state) if x.ndim}
        assert sizes <= {x.size for x in jax.tree.leaves(case.state.role(role).params)}
    before = jax.device_get(case.state)
    state, result = case.round_step()(case.state, case.batch, jax.random.key(0))
    scalars = jax.device_get(result.scalars)
    for role in TRAINED:
        # The policy starts as its base, which is its KL reference: no divergence yet.
        assert abs(scalars[f"{role}/kl"]) < 1e-6, scalars[f"{role}/kl"]
        after = jax.device_get(state.role(role).params)["layers"]
        for name, value in before.role(role).params["layers"].items():
            # B starts at zero, so A gets no gradient in the first step: B moves, A waits.
            moved = not np.array_equal(value[...], after[name][...])
            assert moved == name.endswith(lora_lib.B_SUFFIX), (role, name)
        # The base is an argument of the round, never an output: it cannot have changed.
        jax.tree.map(np.testing.assert_array_equal, base[role],
                     jax.device_get(case.frozen.base(role)))


def test_lora_config_keys_are_checked_before_loading(tmp_path):
    config = str(Path(__file__).parents[2] / "configs" / "tiny_dynamic_rubric.py")
    with pytest.raises(ConfigFileError, match=r"config\.policy\.lora\.targets"):
        load_config(config, ["policy.lora.rank=4", "policy.lora.targets=q_proj,qkv"])
    with pytest.raises(ConfigFileError, match=r"config\.generator\.lora\.rank"):
        load_config(config, ["generator.lora.rank=-1"])
    with pytest.raises(ConfigFileError, match="verifier"):
        load_config(config, ["verifier.lora.rank=4"])


# ------------------------------------------------------------------- training and export
LORA_FLAGS = ["--config.policy.lora.rank=4", "--config.generator.lora.rank=4",
              "--config.policy.lora.targets=q_proj,v_proj,o_proj,up_proj,down_proj",
              "--config.policy.lora.alpha=16", "--config.round.response_tokens=8",
              "--config.rubric.max_items=2",
              # p(yes) as rewards, so the random verifier's verdicts cannot all tie (as in
              # `test_a_lora_round_trains_only_the_adapters_on_the_mesh`)
              "--config.round.soft_verdicts=true"]


def _base_checkpoint(folder: Path) -> Path:
    """A tiny random Qwen3 written by transformers over the tiny config's tokenizer."""
    tokenizer = jaxrubric.load_tokenizer(
        Path(__file__).parents[2] / "configs" / "assets" / "tiny_tokenizer")
    hf = make_hf_model("qwen3", seed=3, vocab_size=len(tokenizer),
                       eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    return save_hf_model(hf, folder)


@pytest.mark.slow
def test_lora_training_resumes_bit_for_bit_and_exports_both_ways(tmp_path):
    import peft
    import transformers

    from jaxrubric.cli import main
    from jaxrubric.train import CoevolveTask
    from jaxrubric.train_loop import restore_checkpoint

    config_file = str(Path(__file__).parents[2] / "configs" / "tiny_dynamic_rubric.py")
    base = _base_checkpoint(tmp_path / "base")
    flags = [*LORA_FLAGS, *(f"--config.{r}.path={base}" for r in ("policy", "generator",
                                                                   "verifier"))]

    def train(workdir: Path, rounds: int) -> int:
        return main(["train", "--config", config_file, f"--config.rounds={rounds}",
                     "--workdir", str(workdir), *flags])

    assert train(tmp_path / "straight", 2) == 0
    assert train(stopped_after(tmp_path / "straight", tmp_path / "resumed", 1), 2) == 0
    task = CoevolveTask(load_config(config_file, [f.removeprefix("--config.") for f in flags]))
    straight, meta = restore_checkpoint(str(tmp_path / "straight"), task.abstract_state())
    resumed, _ = restore_checkpoint(str(tmp_path / "resumed"), task.abstract_state())
    assert meta["round"] == 2
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(straight),
                 jax.device_get(resumed))
    # The checkpoint holds the adapters (and their moments), not the base.
    assert all(name.endswith(("_lora_a", "_lora_b")) for name in straight.policy.params["layers"])

    ours = nnx.merge(task.setup.graph(Role.POLICY),
                     role_weights(resumed, task.frozen, Role.POLICY))
    ids = np.array([[5, 17, 42, 7, 99, 3]])
    expected = np.asarray(ours(ids))[..., :len(task.tokenizer)]
    assert float(np.abs(expected - hf_logits(transformers.AutoModelForCausalLM.from_pretrained(
        base, dtype="float32").eval(), ids)).max()) > 1e-4  # the adapters moved the policy

    merged = tmp_path / "merged"
    assert main(["export", "--workdir", str(tmp_path / "resumed"), "--out", str(merged)]) == 0
    hf_merged = transformers.AutoModelForCausalLM.from_pretrained(merged, dtype="float32").eval()
    np.testing.assert_allclose(hf_logits(hf_merged, ids), expected, atol=1e-5)

    adapter = tmp_path / "adapter"
    assert main(["export", "--workdir", str(tmp_path / "resumed"), "--adapter",
                 "--out", str(adapter)]) == 0
    assert json.loads((adapter / "adapter_config.json").read_text())["r"] == 4
    hf_base = transformers.AutoModelForCausalLM.from_pretrained(base, dtype="float32").eval()
    with_adapter = peft.PeftModel.from_pretrained(hf_base, adapter).eval()
    np.testing.assert_allclose(hf_logits(with_adapter, ids), expected, atol=1e-5)


# ------------------------------------------------------------------------ plan and recipes
COLAB = Path(__file__).parents[2] / "configs" / "colab_qwen3_0p6b_dynamic_rubric.py"
TINY_DR = Path(__file__).parents[2] / "configs" / "tiny_dynamic_rubric.py"


def _device_bytes(tree) -> int:
    """What the first device holds of a tree of (sharded) arrays."""
    return sum(x.addressable_shards[0].data.nbytes for x in jax.tree.leaves(tree))


def test_the_plan_counts_what_a_lora_run_holds():
    """The plan's state rows against the arrays `CoevolveTask` really builds (8 devices)."""
    from jaxrubric import plan
    from jaxrubric.train import CoevolveTask

    overrides = ["policy.lora.rank=4", "generator.lora.rank=8",
                 "generator.lora.targets=q_proj,up_proj", "policy.dtype=bfloat16",
                 "generator.dtype=bfloat16"]
    config = load_config(TINY_DR, overrides)
    rows = dict(plan.plan_memory(config, plan.parse_bytes("1GiB"), devices=8)["state"])
    task = CoevolveTask(load_config(TINY_DR, overrides))
    state = task.init_state(jax.random.key(0))
    for role in TRAINED:
        lora = task.models[role].config.lora
        assert rows[f"{role} base, frozen (bfloat16)"] == _device_bytes(task.frozen.base(role))
        assert rows[f"{role} LoRA adapters, rank {lora.rank} (float32)"] == _device_bytes(
            state.role(role).params)
        assert f"{role} reference (bfloat16)" not in rows  # the base is the reference
    assert rows["AdamW state, both roles"] == _device_bytes(
        [state.role(r).opt_state for r in TRAINED])


def test_the_colab_recipe_fits_one_16gb_chip_with_lora_and_not_without():
    from jaxrubric import plan

    config = load_config(COLAB)
    fits = plan.plan_memory(config, plan.parse_bytes("15GiB"), devices=1)
    assert fits["fits"], fits["total"] / 2**30
    full = load_config(COLAB, [f"{r}.lora.rank=0" for r in ("policy", "generator")])
    assert not plan.plan_memory(full, plan.parse_bytes("15GiB"), devices=1)["fits"]


@pytest.mark.slow
def test_the_colab_recipe_trains_a_round_at_reduced_size(tmp_path):
    """The recipe's own code path (LoRA on every projection, bf16 base, fp32 adapters, remat,
    chunked attention, micro-batches of prompts under shared-prefix updates) on tiny random
    models over the tiny tokenizer."""
    from jaxrubric.train import train

    assets = Path(__file__).parents[2] / "configs" / "assets"
    config = load_config(COLAB, [
        *(f"{r}.path=" for r in ("policy", "generator", "verifier")),
        f"tokenizer={assets / 'tiny_tokenizer'}", f"data.train={assets / 'tiny_anchors.jsonl'}",
        "rounds=1", "data.prompt_tokens=24", "data.policy_tokens=40", "data.anchor_tokens=12",
        "data.num_anchors=3", "round.response_tokens=8", "rubric.max_items=2",
        "rubric.max_item_tokens=6", "round.num_responses=4", "round.logprob_chunk=16",
        "round.update_micro_batches=2", "round.share_prefix=true"])
    config.policy.attention_chunk = config.generator.attention_chunk = 16
    summary = train(config, tmp_path)
    assert summary["final_round"] == 1
    assert np.isfinite(summary["metrics"]["policy/loss"]), summary["metrics"]


@pytest.mark.slow
def test_qwen3_0p6b_shapes_forward_and_sample_with_lora():
    """A random model with Qwen3-0.6B's shapes (as the Colab recipe loads it: bf16 base, fp32
    rank-16 adapters on every projection): one forward and one short sampling call. Two of its
    28 layers: every shape is there, at a third of the time (the suite's compile draws random
    weights slowly: 35 s for all 28 layers, 11 s for two)."""
    from jaxrubric import sampling
    from jaxrubric.models.config import ModelConfig
    from jaxrubric.plan.models import KNOWN_ARCHITECTURES

    cfg = ModelConfig.from_hf_dict({**KNOWN_ARCHITECTURES["Qwen/Qwen3-0.6B"],
                                    "num_hidden_layers": 2}, dtype="bfloat16",
                                   param_dtype="bfloat16")
    model = init_model(cfg, seed=0)
    model.config = model.config.replace(param_dtype="float32")
    adapters.add_adapters(model, LoraConfig(rank=16, targets=lora_lib.LORA_TARGETS))
    ids = jnp.array([[151643, 872, 311, 3555, 30, 151645, 198, 151644]])
    logits = model(ids)
    assert logits.shape == (1, 8, cfg.padded_vocab_size) and bool(jnp.isfinite(logits).all())
    out = sampling.sample(model, ids, jnp.ones_like(ids, bool), jnp.array([8]),
                          jax.random.key(0), num_samples=2, max_new_tokens=4)
    assert out.tokens.shape == (1, 2, 4)
