"""Model-only orbax checkpoints: a folder with `config.json` (Hugging Face fields) and the
parameter state, restorable straight onto a mesh (each host reads only its shards)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import jax
import orbax.checkpoint as ocp
from flax import nnx
from jax.sharding import Mesh

from jaxrubric import sharding as shd
from jaxrubric.models.config import ModelConfig
from jaxrubric.models.hf import CheckpointError
from jaxrubric.models.transformer import Decoder

_STATE_DIR = "state"
_RUNTIME_FIELDS = ("dtype", "param_dtype", "vocab_multiple")


def save_model(model: Decoder, path: str | os.PathLike) -> Path:
    """Writes the model's config and parameters as an orbax checkpoint (all hosts take part)."""
    out = Path(path).absolute()
    cfg = model.config
    if jax.process_index() == 0:
        out.mkdir(parents=True, exist_ok=True)
        meta = {"hf_config": cfg.to_hf_dict(), **{f: getattr(cfg, f) for f in _RUNTIME_FIELDS}}
        (out / "config.json").write_text(json.dumps(meta, indent=2))
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(out / _STATE_DIR, nnx.to_pure_dict(nnx.state(model)), force=True)
        checkpointer.wait_until_finished()
    return out


def load_model(path: str | os.PathLike, *, mesh: Mesh | None = None,
               rules: shd.Rules = shd.TRAINING_RULES) -> Decoder:
    """Restores a model written by `save_model`, each parameter placed by the rules table."""
    folder = Path(path).absolute()
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise CheckpointError(f"missing file {config_file}")
    meta = json.loads(config_file.read_text())
    cfg = ModelConfig.from_hf_dict(meta["hf_config"], source=str(config_file),
                                   **{f: meta[f] for f in _RUNTIME_FIELDS})
    mesh = mesh or shd.single_device_mesh()
    abstract = nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(abstract)
    shardings = shd.state_shardings(state, mesh, rules)
    target = jax.tree.map(
        lambda v, s: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=s),
        nnx.to_pure_dict(state), nnx.to_pure_dict(shardings),
    )
    with ocp.StandardCheckpointer() as checkpointer:
        restored = checkpointer.restore(folder / _STATE_DIR, target)
    nnx.replace_by_pure_dict(state, restored)
    return nnx.merge(graphdef, state)
