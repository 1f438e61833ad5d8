"""One configuration for the decoder family: Qwen3 and Llama 3.x differ only in a few fields.

The config is a frozen, hashable dataclass so it can be a static argument of jitted functions.
`from_hf_dict` / `to_hf_dict` translate Hugging Face `config.json` in both spellings found in the
wild (older `rope_theta` + `rope_scaling`, newer `rope_parameters`).
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import Any, Literal, Union

import jax.numpy as jnp
import numpy as np

SUPPORTED_ARCHITECTURES = {"qwen3": "Qwen3ForCausalLM", "llama": "LlamaForCausalLM"}
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")
REMAT_POLICIES = ("none", "full", "dots_saveable", "dots_with_no_batch_dims_saveable")
# The attention backends (`jaxrubric.models.attention`): `auto` picks by the platform the
# program is compiled for (TPU: splash, GPU: cudnn, CPU: xla, the einsum form).
ATTENTION_IMPLS = ("auto", "xla", "splash", "cudnn")
# The compute and storage dtypes a model may use (the ones safetensors files are read in).
DTYPES = ("float32", "bfloat16", "float16")
# A dtype as JAX users write it: a name, a NumPy dtype, or a scalar type (`jnp.bfloat16`).
DTypeLike = Union[str, np.dtype, type]


class ConfigError(ValueError):
    """A model configuration that jaxrubric cannot build, with the field that is wrong."""


def did_you_mean(word: Any, names: Any) -> str:
    """` (did you mean 'x'?)` for the name in `names` closest to a misspelt `word`, or ''."""
    close = difflib.get_close_matches(str(word), list(names), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def dtype_name(dtype: DTypeLike, *, field: str = "dtype") -> str:
    """The name in `DTYPES` of a dtype given any way JAX accepts one, so configs store
    JSON-serialisable, hashable names; a ConfigError naming `field` otherwise."""
    try:
        name = None if dtype is None else jnp.dtype(dtype).name
    except TypeError:
        name = None
    if name not in DTYPES:
        raise ConfigError(f"{field} {dtype!r} is not one of {list(DTYPES)}"
                          f"{did_you_mean(dtype, DTYPES)}")
    return name


@dataclasses.dataclass(frozen=True)
class RopeConfig:
    """Rotary embedding: base `theta` plus an optional frequency scaling."""

    theta: float = 10000.0
    type: Literal["default", "linear", "llama3"] = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


# The projections a LoRA adapter may target (Hugging Face names; `jaxrubric.models.lora`).
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclasses.dataclass(frozen=True)
class LoraConfig:
    """Rank, scale (`alpha / rank`), dropout on the adapter's input, and the projections adapted
    (names as in Hugging Face: `q_proj`, ..., `down_proj`)."""

    rank: int = 16
    alpha: float = 32.0
    dropout: float = 0.0
    targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")

    def __post_init__(self) -> None:
        object.__setattr__(self, "targets", tuple(self.targets))
        if self.rank < 1:
            raise ConfigError(f"lora.rank must be >= 1, got {self.rank}")
        if self.alpha <= 0:
            raise ConfigError(f"lora.alpha must be > 0, got {self.alpha}")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"lora.dropout must be in [0, 1), got {self.dropout}")
        unknown = [t for t in self.targets if t not in LORA_TARGETS]
        if unknown or not self.targets:
            raise ConfigError(f"lora.targets {list(self.targets)}: choose one or more of "
                              f"{list(LORA_TARGETS)}")

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Shape and numerics of a Qwen3 / Llama 3 decoder.

    `vocab_size` is the tokenizer-facing vocabulary; `padded_vocab_size` may be larger so the
    vocabulary dimension divides a mesh axis. Padded logits are masked so they are never sampled.
    `dtype` is the compute dtype; `param_dtype` the storage dtype of the weights: either given
    as a name or a JAX / NumPy dtype, and stored as its name (`dtype_name`).
    `attention_chunk` > 0 computes attention over blocks of that many queries when a call has
    more queries than that, so one layer holds `[rows, heads, chunk, S]` scores instead of
    `[rows, heads, T, S]` (long prompts, many branches of a shared prefix); 0 keeps the single
    einsum.
    `attention_impl`: the attention backend, one of `ATTENTION_IMPLS` (decoding steps and
    explicit masks always take the einsum form).
    `lora`: LoRA adapters beside the targeted projections' weights (None: none); `param_dtype`
    is then the adapters' storage dtype (a LoRA role's frozen base is loaded in `dtype`).
    """

    model_type: Literal["qwen3", "llama"]
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope: RopeConfig = RopeConfig()
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 4096
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    pad_token_id: int | None = None
    vocab_multiple: int = 1
    dtype: str = "float32"
    param_dtype: str = "float32"
    scan_layers: bool = True
    remat: str = "none"
    attention_chunk: int = 0
    attention_impl: str = "auto"
    lora: LoraConfig | None = None  # adapters on some projections (jaxrubric.models.lora)

    def __post_init__(self) -> None:
        if self.model_type not in SUPPORTED_ARCHITECTURES:
            raise ConfigError(
                f"model_type {self.model_type!r} is not supported; supported: "
                f"{sorted(SUPPORTED_ARCHITECTURES)}"
            )
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                     "num_kv_heads", "head_dim", "vocab_multiple"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(
                f"num_kv_heads ({self.num_kv_heads}) must divide num_heads ({self.num_heads})"
            )
        if self.head_dim % 2:
            raise ConfigError(f"head_dim must be even for rotary embeddings, got {self.head_dim}")
        if self.rope.type not in SUPPORTED_ROPE_TYPES:
            raise ConfigError(
                f"rope type {self.rope.type!r} is not supported; supported: {SUPPORTED_ROPE_TYPES}"
            )
        if self.attention_chunk < 0:
            raise ConfigError(f"attention_chunk must be >= 0 (0: off), got {self.attention_chunk}")
        if self.attention_impl not in ATTENTION_IMPLS:
            raise ConfigError(
                f"attention_impl {self.attention_impl!r} is not one of {list(ATTENTION_IMPLS)}"
                f"{did_you_mean(self.attention_impl, ATTENTION_IMPLS)}")
        if self.remat not in REMAT_POLICIES:
            raise ConfigError(f"remat {self.remat!r} is not one of {REMAT_POLICIES}")
        for name in ("dtype", "param_dtype"):
            object.__setattr__(self, name, dtype_name(getattr(self, name), field=name))

    @property
    def qk_norm(self) -> bool:
        """Qwen3 normalises queries and keys per head before RoPE; Llama does not."""
        return self.model_type == "qwen3"

    @property
    def padded_vocab_size(self) -> int:
        m = self.vocab_multiple
        return -(-self.vocab_size // m) * m

    def replace(self, **changes: Any) -> "ModelConfig":
        return dataclasses.replace(self, **changes)

    # ---------------------------------------------------------------- HF translation
    @classmethod
    def from_hf_dict(cls, hf: dict[str, Any], *, source: str = "config.json", **overrides: Any
                     ) -> "ModelConfig":
        """Reads a Hugging Face `config.json` dict; `source` names the file in errors."""
        model_type = hf.get("model_type")
        if model_type not in SUPPORTED_ARCHITECTURES:
            archs = hf.get("architectures")
            raise ConfigError(
                f"{source}: architecture {model_type or archs!r} is not supported; supported: "
                f"{sorted(SUPPORTED_ARCHITECTURES.values())} (model_type {sorted(SUPPORTED_ARCHITECTURES)})"
            )

        def need(key: str) -> Any:
            if key not in hf:
                raise ConfigError(f"{source}: missing field {key!r}")
            return hf[key]

        if hf.get("use_sliding_window"):
            raise ConfigError(f"{source}: use_sliding_window=true is not supported")
        for flag in ("attention_bias", "mlp_bias"):
            if hf.get(flag):
                raise ConfigError(f"{source}: {flag}=true is not supported (Qwen3/Llama 3 use false)")
        if hf.get("hidden_act", "silu") != "silu":
            raise ConfigError(f"{source}: hidden_act {hf['hidden_act']!r} is not supported (silu)")

        num_heads = need("num_attention_heads")
        hidden = need("hidden_size")
        head_dim = hf.get("head_dim") or hidden // num_heads
        eos = hf.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, (list, tuple)) else (() if eos is None else (eos,))
        fields = dict(
            model_type=model_type,
            vocab_size=need("vocab_size"),
            hidden_size=hidden,
            intermediate_size=need("intermediate_size"),
            num_layers=need("num_hidden_layers"),
            num_heads=num_heads,
            num_kv_heads=hf.get("num_key_value_heads") or num_heads,
            head_dim=head_dim,
            rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
            rope=_rope_from_hf(hf, source),
            tie_word_embeddings=hf.get("tie_word_embeddings", False),
            max_position_embeddings=hf.get("max_position_embeddings", 4096),
            bos_token_id=hf.get("bos_token_id"),
            eos_token_ids=eos_ids,
            pad_token_id=hf.get("pad_token_id"),
        )
        fields.update(overrides)
        return cls(**fields)

    def to_hf_dict(self, torch_dtype: str | None = None) -> dict[str, Any]:
        """The `config.json` fields transformers needs to rebuild this model."""
        rope: dict[str, Any] = {"rope_type": self.rope.type, "rope_theta": self.rope.theta}
        if self.rope.type == "linear":
            rope["factor"] = self.rope.factor
        elif self.rope.type == "llama3":
            rope.update(
                factor=self.rope.factor,
                low_freq_factor=self.rope.low_freq_factor,
                high_freq_factor=self.rope.high_freq_factor,
                original_max_position_embeddings=self.rope.original_max_position_embeddings,
            )
        eos: Any = list(self.eos_token_ids)
        if len(eos) == 1:
            eos = eos[0]
        return {
            "architectures": [SUPPORTED_ARCHITECTURES[self.model_type]],
            "model_type": self.model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_parameters": rope,
            "rope_theta": self.rope.theta,
            "rope_scaling": None if self.rope.type == "default" else rope,
            "tie_word_embeddings": self.tie_word_embeddings,
            "max_position_embeddings": self.max_position_embeddings,
            "attention_bias": False,
            "attention_dropout": 0.0,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": eos if eos != [] else None,
            "pad_token_id": self.pad_token_id,
            "torch_dtype": torch_dtype or self.param_dtype,
            "dtype": torch_dtype or self.param_dtype,
            "use_cache": True,
        }


def _rope_from_hf(hf: dict[str, Any], source: str) -> RopeConfig:
    """Both spellings: `rope_parameters` (transformers >= 4.56/5) or `rope_theta` + `rope_scaling`."""
    params = dict(hf.get("rope_parameters") or {})
    scaling = dict(hf.get("rope_scaling") or {})
    merged = {**scaling, **params}
    theta = merged.get("rope_theta", hf.get("rope_theta", 10000.0))
    rope_type = merged.get("rope_type", merged.get("type", "default"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ConfigError(
            f"{source}: rope type {rope_type!r} is not supported; supported: {SUPPORTED_ROPE_TYPES}"
        )
    kwargs: dict[str, Any] = {"theta": float(theta), "type": rope_type}
    if rope_type in ("linear", "llama3"):
        kwargs["factor"] = float(merged.get("factor", 1.0))
    if rope_type == "llama3":
        kwargs["low_freq_factor"] = float(merged.get("low_freq_factor", 1.0))
        kwargs["high_freq_factor"] = float(merged.get("high_freq_factor", 4.0))
        kwargs["original_max_position_embeddings"] = int(
            merged.get("original_max_position_embeddings", hf.get("max_position_embeddings", 8192))
        )
    return RopeConfig(**kwargs)


def tiny_config(model_type: Literal["qwen3", "llama"] = "qwen3", **overrides: Any) -> ModelConfig:
    """A few-thousand-parameter model for tests and the smoke command."""
    fields: dict[str, Any] = dict(
        model_type=model_type, vocab_size=257, hidden_size=64, intermediate_size=128,
        num_layers=2, num_heads=4, num_kv_heads=2, head_dim=32, max_position_embeddings=512,
        rope=RopeConfig(theta=10000.0), eos_token_ids=(1,), bos_token_id=0, pad_token_id=2,
    )
    fields.update(overrides)
    return ModelConfig(**fields)
