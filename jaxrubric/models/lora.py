"""LoRA adapters of the decoder's projections: their shapes, their draw and their forward.

An adapted projection computes `x W + (alpha / rank) * (x A) B`, with `A [in..., rank]` drawn
like PEFT's (uniform in +-1/sqrt(fan_in)) and `B [rank, out...]` zero, so a fresh adapter
leaves the model exactly as it was. Adapters are `nnx.LoRAParam`s stored beside the weights
they adapt, stacked along `layers` like them (`q_proj_lora_a`, `q_proj_lora_b`, ...): the
scanned layer slices them with everything else, and `nnx.state(model, nnx.LoRAParam)` is the
trainable part.

Why not `qwix`: its LoRA provider intercepts each `einsum` / `dot_general` and finds the weight
by looking the operand up among the current module's parameters. Our layers run under
`lax.scan` over stacked weights that are sliced and cast before the einsum, all in one module,
so no operand is a parameter it can find and no module path tells `q_proj` from `o_proj`.
Twenty lines in the layer do the same job and keep the logical axes in our rules table.

Adding adapters to a loaded model and folding them away: `jaxrubric.models.adapters`; the PEFT
export: `jaxrubric.models.hf.save_peft_adapter`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp

from jaxrubric.models.config import LORA_TARGETS, LoraConfig

# projection -> (input letters, weight letters, output letters): each weight is `[in..., out...]`.
PROJECTIONS = {
    "q_proj": ("d", "dnh", "nh"),
    "k_proj": ("d", "dkh", "kh"),
    "v_proj": ("d", "dkh", "kh"),
    "o_proj": ("nh", "nhd", "d"),
    "gate_proj": ("d", "df", "f"),
    "up_proj": ("d", "df", "f"),
    "down_proj": ("f", "fd", "d"),
}
A_SUFFIX, B_SUFFIX = "_lora_a", "_lora_b"
RANK_AXIS = "lora_rank"  # never sharded: a rank is a few dozen


def adapter_shapes(name: str, weight_shape: Sequence[int], weight_axes: Sequence[str],
                   rank: int) -> tuple[tuple[tuple[int, ...], tuple[str, ...]], ...]:
    """((A shape, A axes), (B shape, B axes)) of a projection whose per-layer weight has
    `weight_shape` / `weight_axes`; both with the leading `layers` axis."""
    n_in = len(PROJECTIONS[name][0])
    shape, axes = tuple(weight_shape), tuple(weight_axes)
    return (((*shape[:1 + n_in], rank), (*axes[:1 + n_in], RANK_AXIS)),
            ((shape[0], rank, *shape[1 + n_in:]), (axes[0], RANK_AXIS, *axes[1 + n_in:])))


def init_a(key: jax.Array, shape: tuple[int, ...], dtype: jnp.dtype) -> jax.Array:
    """PEFT's default draw for A (kaiming-uniform with a = sqrt(5): +-1/sqrt(fan_in))."""
    fan_in = math.prod(shape[1:-1])
    bound = 1.0 / math.sqrt(fan_in)
    return jax.random.uniform(key, shape, dtype, -bound, bound)


def matmul(x: jax.Array, weight: jax.Array, n_in: int,
           preferred_element_type: jnp.dtype | None = None) -> jax.Array:
    """`x [..., in...]` times `weight [in..., out...]` as one 2-D matrix product
    `[rows, in] @ [in, out]` (reshapes of contiguous dims are free): with the rows' dims and the
    contracted dims each merged into one, the backward's weight gradient contracts a single
    dim. As an einsum over `bt...`, XLA:CPU transposed the gate/up cotangent `[B, T, F]` to
    `[F, B * T]` in a strided loop for that gradient, ~30x slower than the elementwise work it
    was fused into."""
    lead, ins = x.shape[:x.ndim - n_in], x.shape[x.ndim - n_in:]
    size_in = math.prod(ins)
    y = jnp.matmul(x.reshape(-1, size_in), weight.reshape(size_in, -1),
                   preferred_element_type=preferred_element_type)
    return y.reshape(*lead, *weight.shape[n_in:])


def project(name: str, x: jax.Array, w: dict[str, jax.Array], lora: LoraConfig | None,
            drop_key: jax.Array | None = None) -> jax.Array:
    """`x [B, T, in...]` through projection `name` of one layer's weights `w`, adapted when
    `lora` targets it. `drop_key [B]` (typed keys, one per row): dropout on the adapter's input,
    each row its own mask, so micro-batching does not change a row's draw."""
    n_in = len(PROJECTIONS[name][0])
    y = matmul(x, w[name], n_in)
    if lora is None or name not in lora.targets:
        return y
    if drop_key is not None and lora.dropout > 0:
        keep = 1.0 - lora.dropout
        masks = jax.vmap(lambda k: jax.random.bernoulli(
            jax.random.fold_in(k, LORA_TARGETS.index(name)), keep, x.shape[1:]))(drop_key)
        x = jnp.where(masks, x / keep, 0).astype(x.dtype)
    low = matmul(x, w[name + A_SUFFIX], n_in)
    return y + lora.scale * matmul(low, w[name + B_SUFFIX], 1)
