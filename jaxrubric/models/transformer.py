"""One decoder-only transformer for Qwen3 and Llama 3.x, in Flax NNX.

Layer weights are stored stacked along a leading `layers` axis, so the same parameters run either
under `lax.scan` (one compiled layer: fast compiles for 36-layer models) or as an unrolled loop.
Attention takes explicit positions and an explicit mask (or segment ids), so packed sequences and
tree masks need nothing special. A shared prefix under many branches (a GRPO group's prompt, a
verifier prefix under its items) has its own path, `Decoder.shared_prefix_hidden`: the prefix
encoded once, and no scores computed between branches.

Every parameter carries `logical_axes` metadata, and every activation a layer hands on is
named likewise (`_act`: the residual stream, q/k/v, the attention output, the MLP's
intermediate, the logits); `jaxrubric.sharding` maps those names to mesh axes under the layout a
program is traced in. No sharding decision lives here.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxrubric import sharding as shd
from jaxrubric.models import lora as lora_lib
from jaxrubric.models.attention import (CausalPadding, decode_attention, self_attention,
                                        shared_prefix_attention)
from jaxrubric.models.config import ModelConfig
from jaxrubric.models.rope import apply_rope, inverse_frequencies, rope_tables

# Masked logits (padded vocabulary, forbidden tokens) use a large finite value rather than -inf:
# softmax gives them exactly zero probability, and p * log p stays 0 instead of NaN.
MASKED_LOGIT = -1e9

# name -> (shape builder, logical axes); shapes exclude the leading `layers` axis.
_LAYER_PARAMS = {
    "input_norm": (lambda c: (c.hidden_size,), ("embed",)),
    "q_proj": (lambda c: (c.hidden_size, c.num_heads, c.head_dim), ("embed", "heads", "head_dim")),
    "k_proj": (lambda c: (c.hidden_size, c.num_kv_heads, c.head_dim),
               ("embed", "kv_heads", "head_dim")),
    "v_proj": (lambda c: (c.hidden_size, c.num_kv_heads, c.head_dim),
               ("embed", "kv_heads", "head_dim")),
    "o_proj": (lambda c: (c.num_heads, c.head_dim, c.hidden_size), ("heads", "head_dim", "embed")),
    "q_norm": (lambda c: (c.head_dim,), ("head_dim",)),
    "k_norm": (lambda c: (c.head_dim,), ("head_dim",)),
    "post_attention_norm": (lambda c: (c.hidden_size,), ("embed",)),
    "gate_proj": (lambda c: (c.hidden_size, c.intermediate_size), ("embed", "mlp")),
    "up_proj": (lambda c: (c.hidden_size, c.intermediate_size), ("embed", "mlp")),
    "down_proj": (lambda c: (c.intermediate_size, c.hidden_size), ("mlp", "embed")),
}
_NORMS = ("input_norm", "post_attention_norm", "q_norm", "k_norm")


def layer_param_names(config: ModelConfig) -> tuple[str, ...]:
    """The per-layer parameters this config has (q/k norms only for Qwen3)."""
    return tuple(n for n in _LAYER_PARAMS if config.qk_norm or n not in ("q_norm", "k_norm"))


class KVCache(NamedTuple):
    """Keys/values, one array per layer `[B, kv_heads, S, head_dim]`.

    One array per layer (not one stacked array) so each layer's new entries are written in
    place inside a decode loop instead of copying the whole cache every step. `valid [B, S]`
    marks slots that hold real tokens (left padding stays invalid); `index` is the next slot
    to write, shared by the batch (rows advance in lockstep). A new cache's `index` is a NumPy
    zero, known while tracing: its prefill then takes the configured attention backend
    (`_fresh`); a cache passed into a program, or written to, has a traced index.
    """

    k: tuple[jax.Array, ...]
    v: tuple[jax.Array, ...]
    valid: jax.Array
    index: jax.Array

    @classmethod
    def empty(cls, config: ModelConfig, batch: int, length: int) -> "KVCache":
        shape = (batch, config.num_kv_heads, length, config.head_dim)
        zeros = tuple(jnp.zeros(shape, jnp.dtype(config.dtype)) for _ in range(config.num_layers))
        return cls(zeros, zeros, jnp.zeros((batch, length), bool), np.zeros((), np.int32))


class SampleCache(NamedTuple):
    """The keys/values of the tokens decoded so far by S samples continuing each of B prompts:
    one array per layer `[B S, kv_heads, L, head_dim]` (rows prompt-major: sample `j` of
    prompt `i` is row `i S + j`); `index` is the next slot to write, shared by all rows.

    The prompts' own keys and values stay in their prefilled `KVCache`, once per prompt
    (`Decoder.decode_step`): copying them for each sample would hold and read the prompt S
    times over, which is most of a rollout's memory and most of a decode step's bytes when
    prompts are long (a rubric generator reading K answers).
    """

    k: tuple[jax.Array, ...]
    v: tuple[jax.Array, ...]
    index: jax.Array

    @classmethod
    def empty(cls, prompts: KVCache, samples: int, length: int) -> "SampleCache":
        batch, kv_heads, _, head_dim = prompts.k[0].shape
        shape = (batch * samples, kv_heads, length, head_dim)
        zeros = tuple(jnp.zeros(shape, prompts.k[0].dtype) for _ in prompts.k)
        return cls(zeros, zeros, jnp.zeros((), jnp.int32))


# Logical axes of the activations (`jaxrubric.sharding.ACTIVATION_RULES`), by layout.
_RESIDUAL = ("activation_batch", "activation_length", "activation_embed")  # [B, T, hidden]
_QUERIES = ("activation_batch", "activation_length", "activation_heads", "activation_head_dim")
_KEYS = ("activation_batch", "activation_kv_heads", "activation_length", "activation_head_dim")
_MLP = ("activation_batch", "activation_length", "activation_mlp")


def _act(x: jax.Array, axes: tuple[str, ...]) -> jax.Array:
    """`x` placed by the activation rules: rows over the batch axes, features as named.

    A leading batch of branches (`[B, S, L, ...]`, one more dimension than `axes` names) keeps
    its rows on the batch axes and its branches whole.
    """
    if x.ndim == len(axes) + 1:
        axes = (axes[0], None, *axes[1:])
    return shd.constrain(x, axes)


def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    """RMSNorm computed in float32 and cast back, as transformers does."""
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return weight.astype(x.dtype) * normed.astype(x.dtype)


def segment_positions(segment_ids: jax.Array) -> jax.Array:
    """Position of each token within its segment (packed sequences restart at 0)."""
    length = segment_ids.shape[-1]
    idx = jnp.broadcast_to(jnp.arange(length), segment_ids.shape)
    starts = jnp.concatenate(
        [jnp.ones_like(segment_ids[..., :1], bool), segment_ids[..., 1:] != segment_ids[..., :-1]],
        axis=-1,
    )
    return idx - jax.lax.cummax(jnp.where(starts, idx, 0), axis=segment_ids.ndim - 1)


def _attention_inputs(config: ModelConfig, w: dict, x, cos, sin, drop_key):
    """A layer's queries `[B, T, heads, D]` and keys / values `[B, kv_heads, T, D]` (RoPE
    applied; the KV-cache layout) from the residual stream `x [B, T, hidden]`."""
    def proj(name, h):
        return lora_lib.project(name, h, w, config.lora, drop_key)

    h = rms_norm(x, w["input_norm"], config.rms_norm_eps)
    q, k, v = proj("q_proj", h), proj("k_proj", h), proj("v_proj", h)
    if config.qk_norm:
        q = rms_norm(q, w["q_norm"], config.rms_norm_eps)
        k = rms_norm(k, w["k_norm"], config.rms_norm_eps)
    q = _act(apply_rope(q, cos, sin), _QUERIES)
    k = _act(apply_rope(k, cos, sin).transpose(0, 2, 1, 3), _KEYS)
    return q, k, _act(v.transpose(0, 2, 1, 3), _KEYS)


def _attention_output(config: ModelConfig, w: dict, x, attn, drop_key):
    """The rest of a pre-norm block after attention: output projection and the MLP."""
    def proj(name, h):
        return lora_lib.project(name, h, w, config.lora, drop_key)

    x = _act(x + proj("o_proj", _act(attn, _QUERIES)), _RESIDUAL)
    h = rms_norm(x, w["post_attention_norm"], config.rms_norm_eps)
    hidden = _act(jax.nn.silu(proj("gate_proj", h)) * proj("up_proj", h), _MLP)
    return _act(x + proj("down_proj", hidden), _RESIDUAL)


def _layer(config: ModelConfig, p: dict, x, cos, sin, attend, drop_key=None):
    """One pre-norm block. `attend(q, k, v) -> (attention output, cache_out)` is the layer's
    attention with whatever cache it reads and writes; `drop_key [B]`: this layer's LoRA
    dropout keys, one per row (None: no dropout)."""
    dtype = jnp.dtype(config.dtype)
    w = {name: value.astype(dtype) for name, value in p.items()}
    x = _act(x, _RESIDUAL)
    q, k, v = _attention_inputs(config, w, x, cos, sin, drop_key)
    attn, cache_out = attend(q, k, v)
    return _attention_output(config, w, x, attn, drop_key), cache_out


def _write_slot(cache: jax.Array, new: jax.Array, slot) -> jax.Array:
    """`new [B, kv_heads, T, head_dim]` written into `cache` from `slot` on, in place."""
    return _act(jax.lax.dynamic_update_slice(cache, new.astype(cache.dtype), (0, 0, slot, 0)),
                _KEYS)


def _fresh(cache: KVCache) -> bool:
    """Whether `cache` is known while tracing to hold nothing (`KVCache.empty` in the traced
    program): a prefill into it puts query `t` at slot `t`, and its later slots are empty."""
    return isinstance(cache.index, np.ndarray | np.integer) and int(cache.index) == 0


def _layer_keys(keys: jax.Array | None, layer) -> jax.Array | None:
    """Each row's LoRA dropout key for one layer (the layer folded in); None stays None."""
    return None if keys is None else jax.vmap(lambda key: jax.random.fold_in(key, layer))(keys)


def _shared_prefix_layer(config: ModelConfig, p: dict, xs, rope, masks, drop_keys):
    """One block over a prefix `[B, P, hidden]` and its branches `[B, S, L, hidden]`; `masks`:
    the prefix's and the branches' real tokens (see `Decoder.shared_prefix_hidden`)."""
    dtype = jnp.dtype(config.dtype)
    w = {name: value.astype(dtype) for name, value in p.items()}
    x_p, x_b = xs
    (cos_p, sin_p), (cos_b, sin_b) = rope
    drop_p, drop_b = drop_keys
    prefix_mask, branch_mask = masks
    b, s, l, hidden = x_b.shape
    x_p = _act(x_p, _RESIDUAL)
    q_p, k_p, v_p = _attention_inputs(config, w, x_p, cos_p, sin_p, drop_p)
    flat = _act(x_b.reshape(b * s, l, hidden), _RESIDUAL)
    q_b, k_b, v_b = _attention_inputs(config, w, flat, cos_b, sin_b, drop_b)
    def split(t: jax.Array, axes: tuple[str, ...]) -> jax.Array:  # [B S, ...] -> [B, S, ...]
        return _act(t.reshape(b, s, *t.shape[1:]), axes)

    attn_p, attn_b = shared_prefix_attention(
        q_p, k_p, v_p, prefix_mask, split(q_b, _QUERIES), split(k_b, _KEYS), split(v_b, _KEYS),
        branch_mask, impl=config.attention_impl, chunk=config.attention_chunk)
    x_p = _attention_output(config, w, x_p, attn_p, drop_p)
    x_b = _attention_output(config, w, flat, attn_b.reshape(b * s, l, *attn_b.shape[3:]),
                            drop_b)
    return x_p, _act(x_b.reshape(b, s, l, hidden), _RESIDUAL)


_REMAT = {
    "full": None,
    "dots_saveable": jax.checkpoint_policies.dots_saveable,
    "dots_with_no_batch_dims_saveable": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


class Decoder(nnx.Module):
    """Qwen3 / Llama 3 causal LM.

    Call: `model(tokens [B, T], positions=None, attention_mask=None, segment_ids=None,
    cache=None)`. Without a cache it returns logits `[B, T, padded_vocab]` (float32); with a
    cache it returns `(logits, new_cache)`.

    `attention_mask` is either `[B, T]` (1 for real tokens; padding is never attended) or an
    explicit `[B, T, S]` boolean mask (S = T without a cache, the cache length with one), used
    as given: that is how tree masks are expressed. Default positions count the real tokens
    before each one, so left- and right-padded batches both get the positions of their
    unpadded rows.
    """

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        self.config = config
        pdtype = jnp.dtype(config.param_dtype)
        init = jax.nn.initializers.normal(0.02)
        vocab = config.padded_vocab_size
        self.embed = nnx.Param(
            _zero_padded_rows(init(rngs.params(), (vocab, config.hidden_size), pdtype), config),
            logical_axes=("vocab", "embed"),
        )
        layers = {}
        for name in layer_param_names(config):
            shape_fn, axes = _LAYER_PARAMS[name]
            shape = (config.num_layers, *shape_fn(config))
            value = (jnp.ones(shape, pdtype) if name in _NORMS
                     else init(rngs.params(), shape, pdtype))
            layers[name] = nnx.Param(value, logical_axes=("layers", *axes))
        self.layers = nnx.Dict(layers)
        self.final_norm = nnx.Param(jnp.ones((config.hidden_size,), pdtype),
                                    logical_axes=("embed",))
        if not config.tie_word_embeddings:
            # Drawn vocabulary-major like the embedding: a draw is prefix-stable along its
            # leading axis, so the real tokens' weights do not depend on the padding.
            head = init(rngs.params(), (vocab, config.hidden_size), pdtype).T
            head = head.at[:, config.vocab_size:].set(0)
            self.lm_head = nnx.Param(head, logical_axes=("embed", "vocab"))
        # Drawn last, so the base weights of a seed are the same with and without adapters.
        for name, adapter in adapter_params(config, rngs).items():
            self.layers[name] = adapter

    # ----------------------------------------------------------------------- forward
    def __call__(self, tokens, positions=None, attention_mask=None, segment_ids=None, cache=None,
                 lora_drop_keys=None):
        hidden, new_cache = self.hidden_states(tokens, positions, attention_mask, segment_ids,
                                               cache, lora_drop_keys)
        logits = self.logits(hidden)
        return logits if cache is None else (logits, new_cache)

    def logits(self, hidden: jax.Array) -> jax.Array:
        """Final-norm hidden states -> float32 logits, padded vocabulary masked."""
        cfg = self.config
        out = lora_lib.matmul(hidden, self._output_head().astype(hidden.dtype), 1,
                              preferred_element_type=jnp.float32)
        if cfg.padded_vocab_size != cfg.vocab_size:
            out = jnp.where(jnp.arange(out.shape[-1]) < cfg.vocab_size, out, MASKED_LOGIT)
        lengths = ("activation_length",) * (out.ndim - 2)
        return shd.constrain(out, ("activation_batch", *lengths, "activation_vocab"))

    def token_logits(self, hidden: jax.Array, ids: Sequence[int]) -> jax.Array:
        """`logits(hidden)[..., ids]`, projecting onto those tokens' rows of the output
        embedding only: for a readout that compares a few tokens (a verifier's yes and no), the
        `[..., V]` logits and their vocabulary-wide product are never made."""
        cfg = self.config
        if not all(0 <= i < cfg.vocab_size for i in ids):
            raise ValueError(f"token ids {ids} outside the vocabulary of {cfg.vocab_size}")
        head = self._output_head()[:, jnp.asarray(ids, jnp.int32)]
        return lora_lib.matmul(hidden, head.astype(hidden.dtype), 1,
                               preferred_element_type=jnp.float32)

    def _output_head(self) -> jax.Array:
        """The output projection `[hidden, V]`: the embedding's transpose when tied."""
        return self.embed[...].T if self.config.tie_word_embeddings else self.lm_head[...]

    def hidden_states(self, tokens, positions=None, attention_mask=None, segment_ids=None,
                      cache=None, lora_drop_keys=None):
        """The final-normed hidden states `[B, T, D]` and the updated cache (or None).

        Exposed so losses can project to the vocabulary in chunks instead of holding
        `[B, T, V]` logits whole. `lora_drop_keys [B]` (typed keys, one per row) turn on the
        adapters' dropout (training only); each layer folds its index into them.
        """
        cfg = self.config
        dtype = jnp.dtype(cfg.dtype)
        batch, length = tokens.shape
        explicit_mask = attention_mask is not None and attention_mask.ndim == 3
        token_valid = (jnp.ones((batch, length), bool) if attention_mask is None or explicit_mask
                       else attention_mask.astype(bool))

        if cache is None:
            slot_valid, offset, before = token_valid, 0, 0
        else:
            slots = jnp.arange(cache.valid.shape[1])
            in_chunk = (slots >= cache.index) & (slots < cache.index + length)
            written = jax.lax.dynamic_update_slice(
                jnp.zeros_like(cache.valid), token_valid, (0, cache.index))
            slot_valid = jnp.where(in_chunk[None, :], written, cache.valid)
            offset = cache.index
            before = jnp.sum(cache.valid & (slots < cache.index)[None, :], axis=1, keepdims=True)

        if positions is None:
            if segment_ids is not None:
                positions = segment_positions(segment_ids)
            else:
                positions = before + jnp.cumsum(token_valid, axis=1) - 1
                positions = jnp.maximum(positions, 0)

        if segment_ids is not None and cache is not None and not explicit_mask:
            raise ValueError("segment_ids with a KV cache are not supported; pass a mask")
        if explicit_mask:
            mask = attention_mask.astype(bool)
        elif cache is None or _fresh(cache):  # a training forward, a prefill: any backend
            mask = CausalPadding(token_valid, segment_ids)
        else:  # decoding steps: the einsum form over the cache
            query_slot = offset + jnp.arange(length)
            key_slot = jnp.arange(slot_valid.shape[1])
            mask = (key_slot[None, :] <= query_slot[:, None])[None] & slot_valid[:, None, :]

        cos, sin = rope_tables(positions, inverse_frequencies(cfg.rope, cfg.head_dim))
        x = _act(self.embed[...].astype(dtype)[tokens], _RESIDUAL)

        def body(x, p, layer, k_cache=None, v_cache=None):
            drop = _layer_keys(lora_drop_keys, layer)

            def attend(q, k, v):
                cache_out = None
                if k_cache is not None:
                    k, v = (_write_slot(c, new, offset) for c, new in ((k_cache, k), (v_cache, v)))
                    cache_out = (k, v)
                attn = self_attention(q, k.astype(dtype), v.astype(dtype), mask,
                                      impl=cfg.attention_impl, chunk=cfg.attention_chunk)
                return attn, cache_out
            return _layer(cfg, p, x, cos, sin, attend, drop)

        if cfg.remat != "none":
            body = jax.checkpoint(body, policy=_REMAT[cfg.remat])

        if cache is None and cfg.scan_layers and not isinstance(self.layers, nnx.List):
            x, _ = jax.lax.scan(lambda x, xs: (body(x, *xs)[0], None), x,
                                ({name: p[...] for name, p in self.layers.items()},
                                 jnp.arange(cfg.num_layers)))
            new_kv = None
        else:
            # Unrolled: always with a cache, whose per-layer arrays are updated in place.
            new_kv = []
            for i in range(cfg.num_layers):
                kv = () if cache is None else (cache.k[i], cache.v[i])
                x, out = body(x, self._layer_weights(i), i, *kv)
                new_kv.append(out)

        hidden = _act(rms_norm(x, self.final_norm[...], cfg.rms_norm_eps), _RESIDUAL)
        if cache is None:
            return hidden, None
        k_new, v_new = (tuple(t) for t in zip(*new_kv))
        return hidden, KVCache(k_new, v_new, slot_valid, cache.index + length)

    def decode_step(self, tokens: jax.Array, positions: jax.Array, prompts: KVCache,
                    samples: SampleCache) -> tuple[jax.Array, SampleCache]:
        """One decoding step of S samples per prompt: hidden states `[B S, 1, D]` of their new
        `tokens [B S, 1]` at `positions [B S, 1]`, and `samples` with their keys and values
        written at slot `samples.index`.

        Each sample attends to its prompt's keys in `prompts` (prefilled once per prompt,
        never copied per sample) and to its own tokens so far, under one softmax over both
        (`decode_attention`): the attention the plain cache gives over a prompt's copy and
        the sample, without a second copy of the prompt. Call it on an `unstacked()` model.
        """
        cfg = self.config
        dtype = jnp.dtype(cfg.dtype)
        slot = samples.index
        cos, sin = rope_tables(positions, inverse_frequencies(cfg.rope, cfg.head_dim))
        x = _act(self.embed[...].astype(dtype)[tokens], _RESIDUAL)
        written = jnp.arange(samples.k[0].shape[2]) <= slot
        new_k, new_v = [], []
        for i in range(cfg.num_layers):
            def attend(q, k, v, i=i):
                k, v = (_write_slot(c[i], new, slot) for c, new in ((samples.k, k),
                                                                    (samples.v, v)))
                attn = decode_attention(q, prompts.k[i].astype(dtype),
                                        prompts.v[i].astype(dtype), prompts.valid,
                                        k.astype(dtype), v.astype(dtype), written)
                return attn, (k, v)
            x, (k_i, v_i) = _layer(cfg, self._layer_weights(i), x, cos, sin, attend)
            new_k.append(k_i)
            new_v.append(v_i)
        hidden = _act(rms_norm(x, self.final_norm[...], cfg.rms_norm_eps), _RESIDUAL)
        return hidden, SampleCache(tuple(new_k), tuple(new_v), slot + tokens.shape[1])

    def shared_prefix_hidden(self, prefix, prefix_mask, branches, lora_drop_keys=None,
                             branch_mask=None):
        """Final-normed hidden states of prefixes `[B, P]` (`prefix_mask [B, P]`: their real
        tokens, padded anywhere) and of S branches continuing each, `branches [B, S, L]`
        (`branch_mask [B, S, L]`: their real tokens; None: all real): `([B, P, D],
        [B, S, L, D])`, equal at real tokens to running each prefix + branch, padding removed,
        as one plain sequence.

        The prefix goes through the model once, not once per branch (a GRPO group's prompt,
        Prefix Grouper's training-equivalent sharing; a verifier prefix under its items);
        branch queries attend to its keys and values and causally to their own
        (`branch_attention`), never to another branch. Padding is never attended and takes no
        position: a real token's position counts the real tokens before it, so a branch with
        padding inside (a verifier item slot) reads as its unpadded sequence.
        `lora_drop_keys ([B], [B, S])`: LoRA dropout keys of the prefixes and the branches.
        """
        cfg = self.config
        dtype = jnp.dtype(cfg.dtype)
        b, s, l = branches.shape
        prefix_mask = prefix_mask.astype(bool)
        branch_mask = (jnp.ones((b, s, l), bool) if branch_mask is None
                       else branch_mask.astype(bool))
        prefix_pos = jnp.maximum(jnp.cumsum(prefix_mask, axis=1) - 1, 0)
        start = jnp.sum(prefix_mask, axis=1)  # the branches continue after the real tokens
        branch_pos = jnp.maximum(start[:, None, None] + jnp.cumsum(branch_mask, axis=2) - 1, 0)
        inv = inverse_frequencies(cfg.rope, cfg.head_dim)
        rope = (rope_tables(prefix_pos, inv), rope_tables(branch_pos.reshape(b * s, l), inv))
        table = self.embed[...].astype(dtype)
        xs = (_act(table[prefix], _RESIDUAL), _act(table[branches], _RESIDUAL))
        if lora_drop_keys is None:
            drops = (None, None)
        else:
            drops = (lora_drop_keys[0], lora_drop_keys[1].reshape(b * s))

        def body(xs, p, layer):
            keys = tuple(_layer_keys(k, layer) for k in drops)
            return _shared_prefix_layer(cfg, p, xs, rope, (prefix_mask, branch_mask), keys)

        if cfg.remat != "none":
            body = jax.checkpoint(body, policy=_REMAT[cfg.remat])
        if cfg.scan_layers and not isinstance(self.layers, nnx.List):
            xs, _ = jax.lax.scan(lambda xs, args: (body(xs, *args), None), xs,
                                 ({name: p[...] for name, p in self.layers.items()},
                                  jnp.arange(cfg.num_layers)))
        else:
            for i in range(cfg.num_layers):
                xs = body(xs, self._layer_weights(i), i)
        def norm(x: jax.Array) -> jax.Array:
            return _act(rms_norm(x, self.final_norm[...], cfg.rms_norm_eps), _RESIDUAL)

        return norm(xs[0]), norm(xs[1])

    def _layer_weights(self, i: int) -> dict[str, jax.Array]:
        if isinstance(self.layers, nnx.List):
            return {name: p[...] for name, p in self.layers[i].items()}
        return {name: p[...][i] for name, p in self.layers.items()}

    def unstacked(self) -> "Decoder":
        """A view of this model with one weight array per layer instead of stacked arrays.

        Decode loops call it once, outside the loop: slicing a stacked weight inside the loop
        would copy every layer's weights at every step.
        """
        graphdef, state = nnx.split(self)
        view = nnx.merge(graphdef, state)
        view.layers = nnx.List([
            nnx.Dict({name: type(p)(p[...][i], logical_axes=p.get_metadata()["logical_axes"][1:])
                      for name, p in self.layers.items()})
            for i in range(self.config.num_layers)
        ])
        return view


def adapter_params(config: ModelConfig, rngs: nnx.Rngs) -> dict[str, nnx.LoRAParam]:
    """The LoRA adapters `config.lora` asks for, stacked along `layers` (A drawn, B zero), in
    the storage dtype: `{q_proj_lora_a: ..., q_proj_lora_b: ..., ...}` (none without LoRA)."""
    lora = config.lora
    if lora is None:
        return {}
    pdtype = jnp.dtype(config.param_dtype)
    out = {}
    for name in lora.targets:
        shape_fn, axes = _LAYER_PARAMS[name]
        (a_shape, a_axes), (b_shape, b_axes) = lora_lib.adapter_shapes(
            name, (config.num_layers, *shape_fn(config)), ("layers", *axes), lora.rank)
        out[name + lora_lib.A_SUFFIX] = nnx.LoRAParam(
            lora_lib.init_a(rngs.params(), a_shape, pdtype), logical_axes=a_axes)
        out[name + lora_lib.B_SUFFIX] = nnx.LoRAParam(jnp.zeros(b_shape, pdtype),
                                                      logical_axes=b_axes)
    return out


def _zero_padded_rows(embed: jax.Array, config: ModelConfig) -> jax.Array:
    return embed.at[config.vocab_size:].set(0)


@functools.partial(jax.jit, static_argnums=(0,))
def _init_state(config: ModelConfig, key: jax.Array):
    return nnx.state(Decoder(config, rngs=nnx.Rngs(params=key)))


def init_model(config: ModelConfig, seed: int = 0) -> Decoder:
    """A randomly initialised decoder (weights built under jit, so large inits are fast)."""
    abstract = nnx.eval_shape(lambda: Decoder(config, rngs=nnx.Rngs(0)))
    graphdef, _ = nnx.split(abstract)
    return nnx.merge(graphdef, _init_state(config, jax.random.key(seed)))
