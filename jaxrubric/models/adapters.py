"""A decoder's LoRA adapters added and folded away: how a loaded checkpoint becomes a LoRA role
(`add_adapters`), and how a trained one becomes a plain model again (`merged`), for export."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxrubric import sharding as shd
from jaxrubric.models.config import LoraConfig
from jaxrubric.models.lora import A_SUFFIX, B_SUFFIX, PROJECTIONS
from jaxrubric.models.transformer import Decoder, adapter_params


def add_adapters(model: Decoder, lora: LoraConfig, *, seed: int = 0,
                 mesh: jax.sharding.Mesh | None = None) -> Decoder:
    """`model` (in place, returned) with fresh adapters (`B = 0`: its outputs are unchanged),
    placed on `mesh` by the rules table: how a loaded checkpoint becomes a LoRA role."""
    if model.config.lora is not None:
        raise ValueError("the model already has LoRA adapters")
    model.config = model.config.replace(lora=lora)
    adapters = adapter_params(model.config, nnx.Rngs(params=jax.random.key(seed)))
    if mesh is not None:
        adapters = {name: p.replace(jax.device_put(p[...], shd.variable_sharding(p, mesh)))
                    for name, p in adapters.items()}
    for name, p in adapters.items():
        model.layers[name] = p
    return model


def merged(model: Decoder) -> Decoder:
    """A copy of `model` with every adapter folded into its weight (`W + scale * A B`, in
    float32, stored back in the weight's dtype) and no adapters left."""
    lora = model.config.lora
    if lora is None:
        return model
    cfg = model.config.replace(lora=None)
    abstract = nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(abstract)
    layers = {name: p[...] for name, p in model.layers.items()}

    def fold(name: str, w: jax.Array) -> jax.Array:
        if name not in lora.targets:
            return w
        a, b = layers[name + A_SUFFIX], layers[name + B_SUFFIX]
        ins, _, outs = PROJECTIONS[name]
        added = jnp.einsum(f"l{ins}r,lr{outs}->l{ins}{outs}", a.astype(jnp.float32),
                           b.astype(jnp.float32))
        return (w.astype(jnp.float32) + lora.scale * added).astype(w.dtype)

    values = nnx.state(model, nnx.Not(nnx.LoRAParam))
    values["layers"] = {name: fold(name, v[...]) for name, v in values["layers"].items()}
    pure = nnx.to_pure_dict(values)
    nnx.replace_by_pure_dict(state, pure)
    return nnx.merge(graphdef, state)
