"""Hugging Face checkpoints in and out: `config.json` + safetensors <-> a sharded `Decoder`.

Loading never builds a whole copy of the model on one device: each Hugging Face tensor is read
(memory-mapped) once, transposed to our layout, and only the slices each device owns are copied
to it. Peak host memory is about one tensor beyond the per-device slices of the parameter being
placed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from safetensors import safe_open
from safetensors.numpy import save_file

from jaxrubric import sharding as shd
from jaxrubric.models import adapters
from jaxrubric.models import lora as lora_lib
from jaxrubric.models.config import DTYPES, DTypeLike, ModelConfig, dtype_name
from jaxrubric.models.transformer import Decoder, layer_param_names

NP_DTYPES = {name: np.dtype(jnp.dtype(name)) for name in DTYPES}
_HUB_PATTERNS = ["*.json", "*.safetensors", "tokenizer*", "*.model", "*.tiktoken", "*.txt",
                 "*.jinja"]
DEFAULT_MAX_SHARD_BYTES = 5 * 1024**3


class CheckpointError(ValueError):
    """A checkpoint that cannot be read as asked, naming the file or tensor at fault."""


# ------------------------------------------------------------------------- name mapping
def _hf_layer_name(name: str, layer: int) -> str:
    prefix = f"model.layers.{layer}."
    return prefix + {
        "input_norm": "input_layernorm.weight",
        "post_attention_norm": "post_attention_layernorm.weight",
        "q_proj": "self_attn.q_proj.weight",
        "k_proj": "self_attn.k_proj.weight",
        "v_proj": "self_attn.v_proj.weight",
        "o_proj": "self_attn.o_proj.weight",
        "q_norm": "self_attn.q_norm.weight",
        "k_norm": "self_attn.k_norm.weight",
        "gate_proj": "mlp.gate_proj.weight",
        "up_proj": "mlp.up_proj.weight",
        "down_proj": "mlp.down_proj.weight",
    }[name]


def _hf_shape(name: str, cfg: ModelConfig) -> tuple[int, ...]:
    """Shape of a per-layer tensor in the Hugging Face file (torch Linear is [out, in])."""
    d, f, h = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    return {
        "input_norm": (d,), "post_attention_norm": (d,), "q_norm": (h,), "k_norm": (h,),
        "q_proj": (cfg.num_heads * h, d), "k_proj": (cfg.num_kv_heads * h, d),
        "v_proj": (cfg.num_kv_heads * h, d), "o_proj": (d, cfg.num_heads * h),
        "gate_proj": (f, d), "up_proj": (f, d), "down_proj": (d, f),
    }[name]


def _to_ours(name: str, t: np.ndarray, cfg: ModelConfig) -> np.ndarray:
    h = cfg.head_dim
    if name in ("q_proj", "k_proj", "v_proj"):
        return t.T.reshape(cfg.hidden_size, -1, h)
    if name == "o_proj":
        return t.T.reshape(cfg.num_heads, h, cfg.hidden_size)
    if name in ("gate_proj", "up_proj", "down_proj"):
        return t.T
    return t


def _to_hf(name: str, t: np.ndarray, cfg: ModelConfig) -> np.ndarray:
    if name in ("q_proj", "k_proj", "v_proj"):
        return t.reshape(cfg.hidden_size, -1).T
    if name == "o_proj":
        return t.reshape(-1, cfg.hidden_size).T
    if name in ("gate_proj", "up_proj", "down_proj"):
        return t.T
    return t


# ------------------------------------------------------------------------------ reading
def resolve_checkpoint(path: str | os.PathLike) -> Path:
    """A local folder as is; otherwise a hub id fetched through huggingface_hub."""
    local = Path(path).expanduser()
    if local.is_dir():
        return local
    if local.exists():
        raise CheckpointError(f"{local} is a file; expected a checkpoint folder")
    try:
        from huggingface_hub import snapshot_download
        return Path(snapshot_download(str(path), allow_patterns=_HUB_PATTERNS))
    except Exception as err:  # offline, unknown repo, no permission: say what was tried
        raise CheckpointError(
            f"{path}: no such local folder, and fetching it as a Hugging Face hub id failed "
            f"({type(err).__name__}: {err})"
        ) from err


def read_config_json(folder: Path) -> dict:
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise CheckpointError(f"missing file {config_file}")
    return _read_json(config_file)


def _read_json(path: Path) -> dict:
    """A checkpoint's JSON file; malformed JSON is an error naming the file."""
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise CheckpointError(f"{path}: not valid JSON ({err})") from err


def checkpoint_dtype(hf_config: dict) -> str:
    """The storage dtype a config.json declares (either spelling), float32 if none or unknown."""
    name = str(hf_config.get("torch_dtype") or hf_config.get("dtype") or "float32")
    name = name.removeprefix("torch.")
    return name if name in NP_DTYPES else "float32"


class _TensorReader:
    """Memory-mapped access to the tensors of single or sharded safetensors files."""

    def __init__(self, folder: Path):
        index_file = folder / "model.safetensors.index.json"
        if index_file.is_file():
            weight_map = _read_json(index_file).get("weight_map")
            if not isinstance(weight_map, dict):
                raise CheckpointError(f"{index_file}: has no \"weight_map\" object (tensor name "
                                      "-> shard file)")
        elif (folder / "model.safetensors").is_file():
            weight_map = None
        else:
            raise CheckpointError(
                f"missing file {folder / 'model.safetensors'} (nor a sharded "
                f"{index_file.name} beside it)"
            )
        self.folder = folder
        self._handles: dict[str, object] = {}
        if weight_map is None:
            handle = self._open("model.safetensors")
            self.weight_map = {k: "model.safetensors" for k in handle.keys()}
        else:
            self.weight_map = weight_map

    def _open(self, filename: str):
        if filename not in self._handles:
            file = self.folder / filename
            if not file.is_file():
                raise CheckpointError(f"missing file {file} (listed in the safetensors index)")
            self._handles[filename] = safe_open(str(file), framework="numpy")
        return self._handles[filename]

    def __contains__(self, name: str) -> bool:
        return name in self.weight_map

    def read(self, name: str, expected_shape: tuple[int, ...]) -> np.ndarray:
        if name not in self.weight_map:
            raise CheckpointError(f"{self.folder}: tensor {name!r} is missing from the checkpoint")
        tensor = self._open(self.weight_map[name]).get_tensor(name)
        if tuple(tensor.shape) != tuple(expected_shape):
            raise CheckpointError(
                f"{self.folder / self.weight_map[name]}: tensor {name!r} has shape "
                f"{tuple(tensor.shape)}, the config expects {tuple(expected_shape)}"
            )
        return tensor


def _place_stacked(shape, dtype, sharding: NamedSharding,
                   read_layer: Callable[[int], np.ndarray]) -> jax.Array:
    """A `[layers, ...]` array built one layer tensor at a time into per-device slices."""
    index_map = sharding.addressable_devices_indices_map(shape)
    buffers: dict[tuple, tuple[tuple[slice, ...], np.ndarray]] = {}
    for index in index_map.values():
        key = tuple(s.indices(n) for s, n in zip(index, shape))
        if key not in buffers:
            shard_shape = tuple(len(range(*k)) for k in key)
            buffers[key] = (index, np.empty(shard_shape, dtype))
    for layer in range(shape[0]):
        owners = [(idx, buf) for key, (idx, buf) in buffers.items() if layer in range(*key[0])]
        if not owners:
            continue
        tensor = read_layer(layer)
        for idx, buf in owners:
            buf[layer - range(*idx[0].indices(shape[0])).start] = tensor[idx[1:]]
    pieces = []
    for device, index in index_map.items():
        key = tuple(s.indices(n) for s, n in zip(index, shape))
        pieces.append(jax.device_put(buffers[key][1], device))
    return jax.make_array_from_single_device_arrays(shape, sharding, pieces)


def load_pretrained(path: str | os.PathLike, *, dtype: DTypeLike | None = None,
                    param_dtype: DTypeLike | None = None, mesh: Mesh | None = None,
                    rules: shd.Rules = shd.TRAINING_RULES, scan_layers: bool = True,
                    remat: str = "none", attention_chunk: int = 0,
                    attention_impl: str = "auto") -> Decoder:
    """Loads a Qwen3 / Llama 3 Hugging Face checkpoint (local folder or hub id) onto `mesh`.

    `dtype` is the compute dtype and, unless `param_dtype` is given, the storage dtype too;
    both default to the checkpoint's dtype. Either is a name or a JAX / NumPy dtype
    (`jnp.bfloat16`). Without a mesh everything lands on the first device.
    """
    dtype = None if dtype is None else dtype_name(dtype)
    param_dtype = None if param_dtype is None else dtype_name(param_dtype, field="param_dtype")
    folder = resolve_checkpoint(path)
    hf_config = read_config_json(folder)
    dtype = dtype or checkpoint_dtype(hf_config)
    param_dtype = param_dtype or dtype
    mesh = mesh or shd.single_device_mesh()
    cfg = ModelConfig.from_hf_dict(
        hf_config, source=str(folder / "config.json"), dtype=dtype, param_dtype=param_dtype,
        vocab_multiple=shd.vocab_multiple(mesh, rules), scan_layers=scan_layers, remat=remat,
        attention_chunk=attention_chunk, attention_impl=attention_impl)
    reader = _TensorReader(folder)
    np_dtype = NP_DTYPES[param_dtype]

    abstract = nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(abstract)
    pad = cfg.padded_vocab_size - cfg.vocab_size

    def place(variable: nnx.Variable, path: tuple) -> jax.Array:
        sharding = shd.variable_sharding(variable, mesh, rules)
        shape = variable.shape
        name = path[-1]
        if path[0] == "layers":
            hf_shape = _hf_shape(name, cfg)
            return _place_stacked(shape, np_dtype, sharding, lambda layer: _to_ours(
                name, reader.read(_hf_layer_name(name, layer), hf_shape), cfg).astype(np_dtype))
        if name == "embed":
            full = reader.read("model.embed_tokens.weight", (cfg.vocab_size, cfg.hidden_size))
            full = np.pad(full.astype(np_dtype), ((0, pad), (0, 0)))
        elif name == "lm_head":
            full = reader.read("lm_head.weight", (cfg.vocab_size, cfg.hidden_size))
            full = np.pad(full.T.astype(np_dtype), ((0, 0), (0, pad)))
        elif name == "final_norm":
            full = reader.read("model.norm.weight", (cfg.hidden_size,)).astype(np_dtype)
        else:
            raise CheckpointError(f"no Hugging Face tensor maps to parameter {'.'.join(path)}")
        return shd.assemble_array(shape, np_dtype, sharding, lambda index: full[index])

    flat = nnx.to_flat_state(state)
    values = {tuple(map(str, p)): place(v, tuple(map(str, p))) for p, v in flat}
    loaded = jax.tree_util.tree_map_with_path(
        lambda p, v: v.replace(values[_path_key(p)]), state,
        is_leaf=lambda x: isinstance(x, nnx.Variable),
    )
    return nnx.merge(graphdef, loaded)


def _path_key(path) -> tuple[str, ...]:
    out = []
    for entry in path:
        key = getattr(entry, "key", getattr(entry, "name", getattr(entry, "idx", entry)))
        out.append(str(key))
    return tuple(out)


# The generic fast tokenizer's class names (transformers 5 and 4): what `AutoTokenizer` would
# pick for such a folder is this class itself.
GENERIC_TOKENIZER_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")


def load_tokenizer(path: str | os.PathLike):
    """The transformers tokenizer of a checkpoint, with its chat template.

    A folder whose `tokenizer_config.json` names the generic fast class is loaded by that class
    directly: `AutoTokenizer` imports transformers' model configs, which import torch where it
    is installed (~5 s in each process of the toy world's workers on a 2-core box)."""
    folder = resolve_checkpoint(path)
    config_file = folder / "tokenizer_config.json"
    if config_file.is_file():
        if _read_json(config_file).get("tokenizer_class") in GENERIC_TOKENIZER_CLASSES:
            from transformers import PreTrainedTokenizerFast
            return PreTrainedTokenizerFast.from_pretrained(str(folder))
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(folder))


# ------------------------------------------------------------------------------ writing
def _host(array: jax.Array) -> np.ndarray:
    if not array.is_fully_addressable:
        from jax.experimental import multihost_utils
        return np.asarray(multihost_utils.process_allgather(array, tiled=True))
    return np.asarray(jax.device_get(array))


def _hf_tensors(model: Decoder, np_dtype: np.dtype) -> Iterator[tuple[str, np.ndarray]]:
    """(name, tensor) in Hugging Face layout, one parameter gathered to the host at a time."""
    cfg = model.config
    yield "model.embed_tokens.weight", _host(model.embed[...])[: cfg.vocab_size].astype(np_dtype)
    for name in layer_param_names(cfg):
        stacked = _host(model.layers[name][...])
        for layer in range(cfg.num_layers):
            yield _hf_layer_name(name, layer), np.ascontiguousarray(
                _to_hf(name, stacked[layer], cfg).astype(np_dtype))
    yield "model.norm.weight", _host(model.final_norm[...]).astype(np_dtype)
    if not cfg.tie_word_embeddings:
        head = _host(model.lm_head[...])[:, : cfg.vocab_size]
        yield "lm_head.weight", np.ascontiguousarray(head.T.astype(np_dtype))


def save_pretrained(model: Decoder, path: str | os.PathLike, *, dtype: DTypeLike | None = None,
                    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES) -> Path:
    """Writes `config.json` and safetensors (sharded above `max_shard_bytes`) that
    `transformers.AutoModelForCausalLM.from_pretrained` loads, in `dtype` (a name or a JAX /
    NumPy dtype; default: the model's storage dtype). Only process 0 writes. LoRA adapters
    are folded into their weights (`adapters.merged`): the checkpoint is a plain model."""
    model = adapters.merged(model)
    cfg = model.config
    dtype = cfg.param_dtype if dtype is None else dtype_name(dtype)
    out = Path(path)
    writer = jax.process_index() == 0
    if writer:
        out.mkdir(parents=True, exist_ok=True)
    # Shards are written as they fill (host memory ~ one shard); their final names need the
    # shard count, so they are renamed at the end.
    weight_map: dict[str, int] = {}
    shard: dict[str, np.ndarray] = {}
    written: list[Path] = []
    total = 0

    def flush() -> None:
        if writer and shard:
            part = out / f"model-part{len(written) + 1:05d}.safetensors"
            save_file(shard, str(part), metadata={"format": "pt"})
            written.append(part)
        shard.clear()

    for name, tensor in _hf_tensors(model, NP_DTYPES[dtype]):
        if shard and sum(t.nbytes for t in shard.values()) + tensor.nbytes > max_shard_bytes:
            flush()
        shard[name] = tensor
        weight_map[name] = len(written) + 1
        total += tensor.nbytes
    flush()
    if not writer:
        return out
    if len(written) == 1:
        written[0].rename(out / "model.safetensors")
    else:
        names = {i: f"model-{i:05d}-of-{len(written):05d}.safetensors"
                 for i in range(1, len(written) + 1)}
        for i, part in enumerate(written, 1):
            part.rename(out / names[i])
        index = {"metadata": {"total_size": total},
                 "weight_map": {k: names[i] for k, i in weight_map.items()}}
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    hf_config = cfg.to_hf_dict(torch_dtype=dtype)
    (out / "config.json").write_text(json.dumps(hf_config, indent=2))
    return out


def peft_tensors(model: Decoder, np_dtype: np.dtype) -> Iterator[tuple[str, np.ndarray]]:
    """(name, tensor) of the adapters as PEFT stores them for a `*ForCausalLM`: `lora_A.weight
    [rank, in]`, `lora_B.weight [out, rank]` (torch Linear layout, flattened heads)."""
    lora = model.config.lora
    for name in lora.targets:
        a = _host(model.layers[name + lora_lib.A_SUFFIX][...])
        b = _host(model.layers[name + lora_lib.B_SUFFIX][...])
        for layer in range(model.config.num_layers):
            base = "base_model.model." + _hf_layer_name(name, layer).removesuffix(".weight")
            yield f"{base}.lora_A.weight", np.ascontiguousarray(
                a[layer].reshape(-1, lora.rank).T.astype(np_dtype))
            yield f"{base}.lora_B.weight", np.ascontiguousarray(
                b[layer].reshape(lora.rank, -1).T.astype(np_dtype))


def save_peft_adapter(model: Decoder, path: str | Path, base_model: str, *,
                      dtype: str | None = None) -> Path:
    """Writes `adapter_config.json` + `adapter_model.safetensors`, the folder
    `peft.PeftModel.from_pretrained(base, path)` loads onto the base checkpoint `base_model`."""
    lora = model.config.lora
    if lora is None:
        raise ValueError("this model has no LoRA adapters to export (config.<role>.lora.rank "
                         "is 0); export the merged weights instead")
    out = Path(path)
    if jax.process_index() != 0:
        list(peft_tensors(model, np.float32))  # every process joins the gathers
        return out
    out.mkdir(parents=True, exist_ok=True)
    dtype = dtype or model.config.param_dtype
    save_file(dict(peft_tensors(model, NP_DTYPES[dtype])), str(out / "adapter_model.safetensors"),
              metadata={"format": "pt"})
    config = {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_model,
        "r": lora.rank, "lora_alpha": lora.alpha, "lora_dropout": lora.dropout,
        "target_modules": list(lora.targets), "bias": "none", "fan_in_fan_out": False,
        "use_rslora": False, "use_dora": False, "inference_mode": True,
        "init_lora_weights": True, "modules_to_save": None,
    }
    (out / "adapter_config.json").write_text(json.dumps(config, indent=2))
    return out
