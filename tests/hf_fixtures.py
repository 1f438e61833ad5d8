"""Tiny random Hugging Face checkpoints written by transformers itself, for parity tests."""

from __future__ import annotations

from pathlib import Path

import torch
import transformers

BASE = dict(
    vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
    rms_norm_eps=1e-6, bos_token_id=0, eos_token_id=1, pad_token_id=2,
)


def make_hf_model(model_type: str = "qwen3", seed: int = 0, **overrides):
    """A randomly initialised transformers model in fp32 (eval mode)."""
    fields = {**BASE, **overrides}
    if model_type == "qwen3":
        config = transformers.Qwen3Config(**fields)
        cls = transformers.Qwen3ForCausalLM
    elif model_type == "llama":
        config = transformers.LlamaConfig(**fields)
        cls = transformers.LlamaForCausalLM
    else:
        raise ValueError(model_type)
    torch.manual_seed(seed)
    model = cls(config).eval()
    # Random init keeps norms at 1; perturb them so a mis-mapped norm cannot pass.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model


def save_hf_model(model, folder: Path, **kwargs) -> Path:
    model.save_pretrained(folder, **kwargs)
    return folder


def hf_logits(model, input_ids, attention_mask=None):
    with torch.no_grad():
        ids = torch.as_tensor(input_ids, dtype=torch.long)
        mask = None if attention_mask is None else torch.as_tensor(attention_mask)
        return model(input_ids=ids, attention_mask=mask).logits.float().numpy()
