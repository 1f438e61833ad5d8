"""The plan's models without their weights: each role's `ModelConfig` (a local folder, the hub
cache or a built-in architecture table; never a download), its parameter shards on a mesh
(`nnx.eval_shape` of the real `Decoder`, sharded by the training rules) and the optimiser
state `train.make_optimizer` keeps for them."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx
from huggingface_hub import try_to_load_from_cache
from jax.sharding import AbstractMesh

from jaxrubric import sharding as shd
from jaxrubric.models.config import LoraConfig, ModelConfig, tiny_config
from jaxrubric.models.hf import load_tokenizer, read_config_json
from jaxrubric.models.transformer import Decoder
from jaxrubric.plan.errors import PlanError
from jaxrubric.roles import Role
from jaxrubric.train import make_optimizer

# The config.json fields of hub checkpoints the recipes name, for planning offline (no
# download, no cache): only what `ModelConfig.from_hf_dict` reads.
KNOWN_ARCHITECTURES: dict[str, dict[str, Any]] = {
    "Qwen/Qwen3-0.6B": {
        "model_type": "qwen3", "vocab_size": 151936, "hidden_size": 1024,
        "intermediate_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16,
        "num_key_value_heads": 8, "head_dim": 128, "rms_norm_eps": 1e-6, "rope_theta": 1e6,
        "tie_word_embeddings": True, "max_position_embeddings": 40960,
        "bos_token_id": 151643, "eos_token_id": 151645,
    },
    "Qwen/Qwen3-8B": {
        "model_type": "qwen3", "vocab_size": 151936, "hidden_size": 4096,
        "intermediate_size": 12288, "num_hidden_layers": 36, "num_attention_heads": 32,
        "num_key_value_heads": 8, "head_dim": 128, "rms_norm_eps": 1e-6, "rope_theta": 1e6,
        "tie_word_embeddings": False, "max_position_embeddings": 40960,
        "bos_token_id": 151643, "eos_token_id": 151645,
    },
    **{name: {
        "model_type": "llama", "vocab_size": 128256, "hidden_size": 4096,
        "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
        "num_key_value_heads": 8, "head_dim": 128, "rms_norm_eps": 1e-5, "rope_theta": 5e5,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        "tie_word_embeddings": False, "max_position_embeddings": 131072,
        "bos_token_id": 128000, "eos_token_id": eos,
    } for name, eos in (("meta-llama/Llama-3.1-8B-Instruct", [128001, 128008, 128009]),
                        ("meta-llama/Llama-3.1-8B", 128001))},
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def tokenizer_source(config: ml_collections.ConfigDict) -> str:
    """Where the trainer reads the shared tokenizer from."""
    return config.tokenizer or config.policy.path


def load_tokenizer_offline(source: str) -> Any | None:
    """The tokenizer of a local folder, or of a hub id already in the local cache; None when
    neither exists (planning never downloads)."""
    if not source:
        return None
    folder = Path(source).expanduser()
    if folder.is_dir():  # a weights-only folder has no tokenizer to read
        has_files = any((folder / f).is_file() for f in TOKENIZER_FILES)
        return load_tokenizer(folder) if has_files else None
    from transformers import (
        AutoTokenizer,  # here: it adds ~1 s to every `jaxrubric` start
    )
    try:
        return AutoTokenizer.from_pretrained(source, local_files_only=True)
    except (OSError, ValueError):
        return None


def hf_config(path: str) -> tuple[dict[str, Any], str]:
    """config.json of a local folder, a cached hub id or a built-in architecture, and where
    it came from."""
    folder = Path(path).expanduser()
    if folder.is_dir():
        return read_config_json(folder), f"{folder}/config.json"
    cached = try_to_load_from_cache(path, "config.json")
    if isinstance(cached, str):
        return json.loads(Path(cached).read_text()), f"{path} (local hub cache)"
    if path in KNOWN_ARCHITECTURES:
        return KNOWN_ARCHITECTURES[path], f"{path} (built-in architecture table)"
    raise PlanError(f"{path}: no such local folder, not in the local hub cache, and not a "
                    f"built-in architecture ({', '.join(KNOWN_ARCHITECTURES)}); pass a folder "
                    "holding its config.json")


def role_model_config(role: ml_collections.ConfigDict, tokenizer: Any, mesh: AbstractMesh,
                      config_tokenizer: str = "", lora: LoraConfig | None = None
                      ) -> tuple[ModelConfig, str]:
    """The `ModelConfig` the trainer builds for a role (see `train.role_model`: with `lora`,
    adapters in `param_dtype` over a base held in the compute dtype), and its source; an
    empty path is the tiny random Qwen3 over the tokenizer's vocabulary."""
    common = dict(dtype=role.dtype, param_dtype=role.param_dtype, remat=role.remat,
                  attention_chunk=role.attention_chunk, attention_impl=role.attention_impl,
                  scan_layers=role.scan_layers,
                  vocab_multiple=shd.vocab_multiple(mesh),
                  lora=lora)
    if role.path:
        hf, source = hf_config(role.path)
        return ModelConfig.from_hf_dict(hf, source=source, **common), source
    if tokenizer is None:
        raise PlanError("an empty role path means a tiny random model over the tokenizer's "
                        f"vocabulary, but the tokenizer {config_tokenizer!r} cannot be read "
                        "offline")
    return tiny_config("qwen3", vocab_size=len(tokenizer), eos_token_ids=(tokenizer.eos_token_id,),
                       pad_token_id=tokenizer.pad_token_id, **common), "tiny random Qwen3"


def shard_shape(shape: Sequence[int], spec: Any, mesh_shape: Mapping[str, int]) -> tuple[int, ...]:
    """One device's slice of an array of `shape` partitioned by `spec`."""
    out = []
    for dim, entry in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec))):
        axes = () if entry is None else ((entry,) if isinstance(entry, str) else entry)
        out.append(dim // math.prod(mesh_shape[a] for a in axes))
    return tuple(out)


def tree_bytes(tree: Any) -> int:
    """Bytes of a pytree of arrays or shapes."""
    return sum(math.prod(x.shape) * jnp.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree))


@dataclasses.dataclass(frozen=True)
class RoleParams:
    """A role's parameters: model config, global counts, and this device's shards: the
    trained ones (all of them, or a LoRA role's adapters) and a LoRA role's frozen base."""

    config: ModelConfig
    source: str
    count: int  # every parameter, adapters included
    trained_count: int  # the parameters that train: a LoRA role's adapters only
    layer_count: int  # parameters of one layer
    shards: list[jax.ShapeDtypeStruct]  # what trains (and what the optimiser holds)
    base_shards: list[jax.ShapeDtypeStruct] = dataclasses.field(default_factory=list)

    @property
    def bytes(self) -> int:
        return tree_bytes(self.shards)

    @property
    def base_bytes(self) -> int:
        return tree_bytes(self.base_shards)


    @property
    def reference_dtype(self) -> str:
        """The dtype `train.reference_params` stores this role's frozen copy in."""
        compute, stored = jnp.dtype(self.config.dtype), jnp.dtype(self.config.param_dtype)
        return str(compute if compute.itemsize < stored.itemsize else stored)

    @property
    def reference_bytes(self) -> int:
        size = jnp.dtype(self.reference_dtype).itemsize
        return sum(math.prod(x.shape) * size for x in self.shards)


def role_params(model_config: ModelConfig, source: str, mesh: AbstractMesh) -> RoleParams:
    """Shapes from `nnx.eval_shape` of the real model, sharded by the training rules; a LoRA
    role's base in its compute dtype (`methods.data.base_weights`)."""
    abstract = nnx.eval_shape(lambda: Decoder(model_config, rngs=nnx.Rngs(0)))
    lora = model_config.lora is not None
    shards, base, count, trained, layer_count = [], [], 0, 0, 0
    for _, var in nnx.to_flat_state(nnx.state(abstract, nnx.Param)):
        axes = var.get_metadata()["logical_axes"]
        spec = shd.logical_to_spec(axes, var.shape, mesh)
        adapter = isinstance(var, nnx.LoRAParam)
        dtype = model_config.dtype if lora and not adapter else var.dtype
        shard = jax.ShapeDtypeStruct(shard_shape(var.shape, spec, mesh.shape), dtype)
        (base if lora and not adapter else shards).append(shard)
        count += math.prod(var.shape)
        trained += math.prod(var.shape) if adapter or not lora else 0
        if axes[0] == "layers":
            layer_count += math.prod(var.shape[1:])
    return RoleParams(model_config, source, count, trained, layer_count, shards, base)


def optimizer_bytes(config: ml_collections.ConfigDict, role: Role, params: RoleParams) -> int:
    """The trainer's optimiser state for one role, per device: AdamW is element-wise, so its
    state for a parameter shard is its state for the whole parameter, sliced."""
    return tree_bytes(jax.eval_shape(make_optimizer(config, role).init, params.shards))
