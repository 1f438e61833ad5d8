"""What both toy worlds' warm starts share: a fresh tiny model, endless SFT batches, the
optimizer, and saving the result where the world's stages look for it."""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import optax

import jaxrubric
from jaxrubric import sft
from jaxrubric import sharding as shd


def new_model(tokenizer: Any, mesh: Any, seed: int, hidden: int, layers: int, *,
              scan_layers: bool = True) -> Any:
    """A freshly initialised Qwen3-style decoder of the toy's size, sharded on `mesh`."""
    config = jaxrubric.tiny_config(
        "qwen3", vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden,
        num_layers=layers, num_heads=4, num_kv_heads=2, head_dim=hidden // 4,
        eos_token_ids=(tokenizer.eos_token_id,), pad_token_id=tokenizer.pad_token_id,
        vocab_multiple=shd.vocab_multiple(mesh), scan_layers=scan_layers)
    return shd.shard_model(jaxrubric.init_model(config, seed=seed), mesh)


def sft_batches(tokenizer: Any, make: Callable[[random.Random, int], tuple[list, list]],
                rng: random.Random, size: int, multiple: int = 8) -> Iterator[sft.SFTBatch]:
    """Endless SFT batches of `make(rng, size)` pairs, each padded to a multiple of `multiple`
    tokens (few distinct widths: few compilations)."""
    while True:
        prompts, targets = make(rng, size)
        width = max(len(p) + len(t) for p, t in zip(prompts, targets))
        width = -(-width // multiple) * multiple
        yield sft.encode_examples(None, prompts, targets, max_len=width,
                                  pad_id=tokenizer.pad_token_id)


def sft_optimizer(lr: float, steps: int) -> optax.GradientTransformation:
    """AdamW with a short warm-up and a cosine decay to a tenth of `lr`: every warm start's."""
    return optax.adamw(optax.warmup_cosine_decay_schedule(
        0.0, lr, min(50, steps // 5), steps, end_value=lr / 10))


def saved(out: Path) -> bool:
    """Whether a warm start (or an exported run) is saved at `out`: the stages' cache test."""
    return (out / "config.json").exists()


def save_warm_start(model: Any, out: Path, history: list[dict[str, Any]]) -> Path:
    """The trained role as an HF checkpoint at `out`, its SFT log beside it."""
    jaxrubric.save_pretrained(model, out)
    (out / "sft_history.json").write_text(json.dumps(history, indent=1))
    return out
