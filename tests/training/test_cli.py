"""The command line and model-only orbax checkpoints."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hf_fixtures import make_hf_model, save_hf_model

import jaxrubric
from jaxrubric import checkpoint
from jaxrubric import sharding as shd
from jaxrubric.cli import main


def test_smoke_without_a_model_prints_logits(capsys):
    assert main(["smoke", "--prompt", "hello", "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "logits (1, 5, 257)" in out
    assert out.count("logit +") + out.count("logit -") == 3


@pytest.mark.slow
def test_convert_hf_orbax_hf_round_trip(tmp_path):
    hf = make_hf_model("llama", seed=11)
    src = save_hf_model(hf, tmp_path / "hf")
    assert main(["convert", "--to", "orbax", str(src), str(tmp_path / "orbax")]) == 0
    assert main(["convert", "--to", "hf", str(tmp_path / "orbax"), str(tmp_path / "back")]) == 0
    ids = jnp.asarray(np.random.RandomState(0).randint(3, 300, (2, 6)))
    ref = np.asarray(jaxrubric.load_pretrained(src)(ids))
    np.testing.assert_allclose(np.asarray(jaxrubric.load_pretrained(tmp_path / "back")(ids)), ref,
                               atol=1e-6)
    mesh = shd.make_mesh({"fsdp": 2, "tensor": 4})
    restored = checkpoint.load_model(tmp_path / "orbax", mesh=mesh)
    assert restored.layers["up_proj"][...].sharding.spec == jax.sharding.PartitionSpec(
        None, "fsdp", "tensor")
    np.testing.assert_allclose(np.asarray(jax.jit(lambda m, x: m(x))(restored, ids)), ref,
                               atol=1e-5)


@pytest.mark.slow
def test_sample_prints_completions_of_chat_prompts(tmp_path, capsys):
    from tokenizer_fixtures import byte_level_bpe

    tok = byte_level_bpe()
    cfg = jaxrubric.tiny_config("qwen3", vocab_size=len(tok), eos_token_ids=(tok.eos_token_id,))
    folder = tmp_path / "model"
    jaxrubric.save_pretrained(jaxrubric.init_model(cfg, seed=2), folder)
    tok.save_pretrained(folder)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("What is a rubric?\n\nName a prime.\nWhy?\n")
    assert main(["sample", "--model", str(folder), "--prompts-file", str(prompts),
                 "--prompt", "Hello", "--num-samples", "2", "--max-new-tokens", "5",
                 "--batch-size", "3", "--temperature", "0.8"]) == 0
    out = capsys.readouterr().out
    assert out.count("### prompt") == 4 and out.count("--- sample") == 8
    assert "### prompt 4: Why?" in out
