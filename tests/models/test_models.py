"""The decoder against transformers: logits, export round trip, KV cache, tree masks, meshes."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import transformers
from hf_fixtures import hf_logits, make_hf_model, save_hf_model

import jaxrubric
from jaxrubric import sharding as shd
from jaxrubric.models.config import ConfigError, ModelConfig
from jaxrubric.models.hf import CheckpointError
from jaxrubric.models.transformer import KVCache

TOL = 1e-4
LLAMA3_ROPE = {
    "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
    "high_freq_factor": 4.0, "original_max_position_embeddings": 32,
}

PARITY_GRID = {
    "qwen3-untied-kv2": ("qwen3", dict(tie_word_embeddings=False)),
    "qwen3-tied-kv1": ("qwen3", dict(tie_word_embeddings=True, num_key_value_heads=1)),
    "qwen3-kv-equal-heads": ("qwen3", dict(num_key_value_heads=4)),
    "qwen3-headdim-differs": ("qwen3", dict(head_dim=24, num_attention_heads=4, hidden_size=64)),
    "qwen3-vocab-odd": ("qwen3", dict(vocab_size=1000)),
    "llama-untied-kv2": ("llama", dict(tie_word_embeddings=False)),
    "llama-tied-kv1": ("llama", dict(tie_word_embeddings=True, num_key_value_heads=1)),
    "llama-kv-equal-heads-headdim-differs": ("llama", dict(num_key_value_heads=4, head_dim=8)),
    "llama3-rope-scaling": ("llama", dict(rope_parameters=LLAMA3_ROPE)),
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """name -> (transformers model, folder), built lazily once per module."""
    cache = {}

    def get(name):
        if name not in cache:
            model_type, overrides = PARITY_GRID[name]
            hf = make_hf_model(model_type, **overrides)
            folder = save_hf_model(hf, tmp_path_factory.mktemp(name))
            cache[name] = (hf, folder)
        return cache[name]

    return get


def _ids(vocab, shape, seed=0):
    return np.random.RandomState(seed).randint(3, vocab, shape)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(PARITY_GRID))
def test_logits_match_transformers(checkpoints, name):
    hf, folder = checkpoints(name)
    vocab = hf.config.vocab_size
    long = name == "llama3-rope-scaling"
    ids = _ids(vocab, (2, 120 if long else 11))  # 120 positions > 32 original context
    ours = jaxrubric.load_pretrained(folder)
    got = np.asarray(ours(jnp.asarray(ids)))
    assert got.shape[-1] == vocab
    err = np.abs(got - hf_logits(hf, ids)).max()
    assert err <= TOL, err


def test_right_padded_batch_matches_transformers(checkpoints):
    hf, folder = checkpoints("qwen3-untied-kv2")
    ids = _ids(300, (3, 10), seed=1)
    mask = np.ones_like(ids)
    mask[0, 6:] = 0
    mask[2, 3:] = 0
    ours = jaxrubric.load_pretrained(folder)
    got = np.asarray(ours(jnp.asarray(ids), attention_mask=jnp.asarray(mask)))
    ref = hf_logits(hf, ids, mask)
    valid = mask.astype(bool)
    assert np.abs(got[valid] - ref[valid]).max() <= TOL


def test_left_padding_does_not_change_a_row():
    model = jaxrubric.init_model(jaxrubric.tiny_config("llama"))
    row = _ids(257, (1, 7))
    padded = np.concatenate([np.zeros((1, 3), int), row], axis=1)
    mask = np.concatenate([np.zeros((1, 3), int), np.ones((1, 7), int)], axis=1)
    alone = np.asarray(model(jnp.asarray(row)))
    with_pad = np.asarray(model(jnp.asarray(padded), attention_mask=jnp.asarray(mask)))
    assert np.abs(alone - with_pad[:, 3:]).max() <= 1e-5


def test_old_rope_spelling_reads_the_same(checkpoints, tmp_path):
    hf, folder = checkpoints("llama3-rope-scaling")
    config = json.loads((folder / "config.json").read_text())
    params = config.pop("rope_parameters")
    config["rope_theta"] = params.pop("rope_theta")
    config["rope_scaling"] = {"type" if k == "rope_type" else k: v for k, v in params.items()}
    old = tmp_path / "old"
    old.mkdir()
    (old / "config.json").write_text(json.dumps(config))
    (old / "model.safetensors").symlink_to(folder / "model.safetensors")
    new_cfg = jaxrubric.load_pretrained(folder).config
    old_cfg = jaxrubric.load_pretrained(old).config
    assert old_cfg.rope == new_cfg.rope and old_cfg.rope.type == "llama3"


@pytest.mark.parametrize("tied", [False, True])
def test_export_round_trip_through_transformers(tmp_path, tied):
    hf = make_hf_model("qwen3", seed=3, tie_word_embeddings=tied)
    src = save_hf_model(hf, tmp_path / "src")
    ours = jaxrubric.load_pretrained(src)
    # Small shard limit: the export must shard and write an index.
    out = jaxrubric.save_pretrained(ours, tmp_path / "out", max_shard_bytes=40_000)
    assert (out / "model.safetensors.index.json").is_file()
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(out, dtype="float32").eval()
    ids = _ids(300, (2, 9), seed=4)
    np.testing.assert_allclose(hf_logits(reloaded, ids), hf_logits(hf, ids), atol=1e-5)
    again = jaxrubric.load_pretrained(out)
    np.testing.assert_allclose(np.asarray(again(jnp.asarray(ids))),
                               np.asarray(ours(jnp.asarray(ids))), atol=1e-6)
    index = out / "model.safetensors.index.json"
    index.write_text("{not json")
    with pytest.raises(CheckpointError, match="index.json: not valid JSON"):
        jaxrubric.load_pretrained(out)
    index.write_text("{}")
    with pytest.raises(CheckpointError, match='index.json: has no "weight_map"'):
        jaxrubric.load_pretrained(out)


def test_bf16_checkpoint_loads_and_stays_close(tmp_path):
    hf = make_hf_model("llama", seed=5)
    folder = save_hf_model(hf.to(dtype=__import__("torch").bfloat16), tmp_path / "bf16")
    ours = jaxrubric.load_pretrained(folder)
    assert ours.config.param_dtype == "bfloat16"
    assert ours.embed[...].dtype == jnp.bfloat16
    fp32 = jaxrubric.load_pretrained(folder, dtype="float32")
    ids = jnp.asarray(_ids(300, (1, 8), seed=6))
    diff = np.abs(np.asarray(ours(ids)) - np.asarray(fp32(ids))).max()
    assert diff < 0.1


@pytest.mark.slow
@pytest.mark.parametrize("scan", [True, False])
def test_kv_cache_decoding_equals_full_forward(scan):
    cfg = jaxrubric.tiny_config("qwen3", scan_layers=scan)
    model = jaxrubric.init_model(cfg, seed=1)
    ids = jnp.asarray(_ids(257, (2, 9), seed=2))
    full = np.asarray(model(ids))
    cache = KVCache.empty(cfg, batch=2, length=12)
    logits, cache = model(ids[:, :4], cache=cache)  # prefill
    steps = [np.asarray(logits)]
    for t in range(4, 9):  # then one token at a time
        logits, cache = model(ids[:, t:t + 1], cache=cache)
        steps.append(np.asarray(logits))
    assert int(cache.index) == 9
    assert np.abs(np.concatenate(steps, axis=1) - full).max() <= 1e-5


@pytest.mark.slow
def test_tree_mask_branches_equal_separate_runs():
    cfg = jaxrubric.tiny_config("llama")
    model = jaxrubric.init_model(cfg, seed=2)
    prefix = _ids(257, (5,), seed=3)
    branches = [_ids(257, (n,), seed=10 + n) for n in (3, 1, 4)]
    tokens = np.concatenate([prefix, *branches])
    total = len(tokens)
    branch_of = np.concatenate([np.full(len(prefix), -1)] +
                               [np.full(len(b), i) for i, b in enumerate(branches)])
    idx = np.arange(total)
    causal = idx[None, :] <= idx[:, None]
    same_or_prefix = (branch_of[None, :] == -1) | (branch_of[None, :] == branch_of[:, None])
    mask = causal & same_or_prefix
    positions = np.concatenate([np.arange(len(prefix))] +
                               [len(prefix) + np.arange(len(b)) for b in branches])
    tree = np.asarray(model(jnp.asarray(tokens[None]), positions=jnp.asarray(positions[None]),
                            attention_mask=jnp.asarray(mask[None])))[0]
    for i, branch in enumerate(branches):
        alone = np.asarray(model(jnp.asarray(np.concatenate([prefix, branch])[None])))[0]
        rows = np.where(branch_of == i)[0]
        assert np.abs(tree[rows] - alone[len(prefix):]).max() <= 1e-5
        assert np.abs(tree[: len(prefix)] - alone[: len(prefix)]).max() <= 1e-5


def test_segment_ids_pack_independent_sequences():
    model = jaxrubric.init_model(jaxrubric.tiny_config("qwen3"), seed=4)
    a, b = _ids(257, (4,), seed=5), _ids(257, (6,), seed=6)
    packed = jnp.asarray(np.concatenate([a, b])[None])
    segments = jnp.asarray(np.array([[0] * 4 + [1] * 6]))
    out = np.asarray(model(packed, segment_ids=segments))[0]
    np.testing.assert_allclose(out[:4], np.asarray(model(jnp.asarray(a[None])))[0], atol=1e-5)
    np.testing.assert_allclose(out[4:], np.asarray(model(jnp.asarray(b[None])))[0], atol=1e-5)


@pytest.mark.slow
def test_scan_unrolled_and_remat_agree():
    cfg = jaxrubric.tiny_config("llama")
    ids = jnp.asarray(_ids(257, (2, 6)))
    ref = np.asarray(jaxrubric.init_model(cfg, seed=7)(ids))
    for change in (dict(scan_layers=False), dict(remat="full"), dict(remat="dots_saveable")):
        got = np.asarray(jaxrubric.init_model(cfg.replace(**change), seed=7)(ids))
        np.testing.assert_allclose(got, ref, atol=1e-5)


def test_loading_onto_a_2x4_mesh(checkpoints):
    hf, folder = checkpoints("qwen3-untied-kv2")
    mesh = shd.make_mesh({"fsdp": 2, "tensor": 4})
    sharded = jaxrubric.load_pretrained(folder, mesh=mesh)
    single = jaxrubric.load_pretrained(folder)
    # The vocabulary (300) is padded to a multiple of the 4-way tensor axis: 300 already is.
    assert sharded.embed[...].sharding.spec == jax.sharding.PartitionSpec("tensor", "fsdp")
    assert sharded.layers["q_proj"][...].sharding.spec == jax.sharding.PartitionSpec(
        None, "fsdp", "tensor", None)
    # Two kv heads cannot split four ways: replicated over `tensor`, still FSDP over `embed`.
    assert sharded.layers["k_proj"][...].sharding.spec == jax.sharding.PartitionSpec(
        None, "fsdp", None, None)
    assert sharded.layers["gate_proj"][...].sharding.spec == jax.sharding.PartitionSpec(
        None, "fsdp", "tensor")
    ids = jnp.asarray(_ids(300, (4, 7), seed=8))
    np.testing.assert_allclose(np.asarray(jax.jit(lambda m, x: m(x))(sharded, ids)),
                               np.asarray(single(ids)), atol=1e-5)


def test_vocab_padded_for_the_mesh_is_never_sampled(tmp_path):
    hf = make_hf_model("llama", vocab_size=301)
    folder = save_hf_model(hf, tmp_path / "odd")
    mesh = shd.make_mesh({"tensor": 4, "fsdp": 2})
    model = jaxrubric.load_pretrained(folder, mesh=mesh)
    assert model.config.padded_vocab_size == 304
    ids = _ids(301, (1, 5))
    logits = np.asarray(model(jnp.asarray(ids)))
    assert logits.shape[-1] == 304 and (logits[..., 301:] <= -1e8).all()
    np.testing.assert_allclose(logits[..., :301], hf_logits(hf, ids), atol=TOL)


def test_clear_errors(tmp_path, checkpoints):
    with pytest.raises(CheckpointError, match="no such local folder"):
        jaxrubric.load_pretrained(tmp_path / "nowhere")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CheckpointError, match="missing file .*config.json"):
        jaxrubric.load_pretrained(empty)
    (empty / "config.json").write_text(json.dumps({"model_type": "gpt2",
                                                   "architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(ConfigError, match="gpt2.*Qwen3ForCausalLM"):
        jaxrubric.load_pretrained(empty)
    _, folder = checkpoints("qwen3-untied-kv2")
    config = json.loads((folder / "config.json").read_text())
    wrong = tmp_path / "wrong"
    wrong.mkdir()
    (wrong / "config.json").write_text(json.dumps({**config, "intermediate_size": 80}))
    (wrong / "model.safetensors").symlink_to(folder / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"mlp\.\w+_proj\.weight' has shape \((96, 64|64, 96)\), the config expects"):
        jaxrubric.load_pretrained(wrong)
    no_weights = tmp_path / "no_weights"
    no_weights.mkdir()
    (no_weights / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="missing file .*model.safetensors"):
        jaxrubric.load_pretrained(no_weights)


def test_generic_tokenizer_loads_without_auto_tokenizer_and_as_auto_tokenizer_would(tmp_path):
    """A folder of the generic fast class skips `AutoTokenizer` (whose import pulls in torch)
    and loads the tokenizer `AutoTokenizer` gives; a named class still goes through it."""
    import shutil

    from jaxrubric.toy import digits_task as task

    folder = task.build_tokenizer(tmp_path / "generic")
    ours, auto = jaxrubric.load_tokenizer(folder), transformers.AutoTokenizer.from_pretrained(
        str(folder))
    assert type(ours) is type(auto)
    text = "big 381729 [3] has 8\n"
    assert ours.encode(text) == auto.encode(text)
    chat = [{"role": "user", "content": "big 381729"}]
    assert (ours.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
            == auto.apply_chat_template(chat, add_generation_prompt=True, tokenize=False))
    assert (ours.eos_token_id, ours.pad_token_id) == (auto.eos_token_id, auto.pad_token_id)

    named = tmp_path / "named"
    shutil.copytree(folder, named)
    config = json.loads((named / "tokenizer_config.json").read_text())
    (named / "tokenizer_config.json").write_text(
        json.dumps({**config, "tokenizer_class": "Qwen2Tokenizer"}))
    assert type(jaxrubric.load_tokenizer(named)).__name__ == "Qwen2Tokenizer"
    (named / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="tokenizer_config.json: not valid JSON"):
        jaxrubric.load_tokenizer(named)


def test_config_checks():
    with pytest.raises(ConfigError, match="must divide"):
        jaxrubric.tiny_config(num_kv_heads=3)
    with pytest.raises(ConfigError, match="rope type"):
        ModelConfig.from_hf_dict({**jaxrubric.tiny_config().to_hf_dict(),
                                  "rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4}})


@pytest.mark.parametrize("tied", [True, False])
def test_token_logits_are_the_logits_of_those_tokens(tied):
    """`Decoder.token_logits` (a verifier's yes/no readout) against the full vocabulary's
    logits at the same ids, tied and untied heads, ids in any order, padded vocabulary."""
    cfg = jaxrubric.tiny_config(tie_word_embeddings=tied, vocab_multiple=128)
    model = jaxrubric.init_model(cfg, seed=5)
    hidden = jax.random.normal(jax.random.key(0), (2, 3, cfg.hidden_size))
    ids = (7, 1, cfg.vocab_size - 1)
    np.testing.assert_allclose(np.asarray(model.token_logits(hidden, ids)),
                               np.asarray(model.logits(hidden))[..., list(ids)],
                               rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        model.token_logits(hidden, (cfg.vocab_size,))
