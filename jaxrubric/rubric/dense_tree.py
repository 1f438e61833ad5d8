"""The verifier's former forward: one dense tree-masked row per (prompt, response).

Kept only as the baseline `benchmarks/prefix_sharing.py` measures the two-part forward
(`jaxrubric.rubric.verifier.answer_logits`) against, and as a second reference in its tests;
nothing in a round calls it. The row is the prefix then every item branch
(`verifier.branch_inputs`) side by side, with an ``[L, L]`` mask that lets a branch see the
prefix and itself. The model computes every score of that square, so the branch-to-branch
scores the mask discards are paid for: the cost two-part attention removes.

Layout of one row (static length ``Lp + G*M*(Li + S)``): the prefix left-aligned in ``Lp``
slots, then the branches. Padding is never attended (a padding query sees only itself, so no
softmax row is empty) and gets no position.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from jaxrubric.models.transformer import Decoder
from jaxrubric.rubric.verifier import branch_inputs


def tree_inputs(prefix_tokens: ArrayLike, prefix_lengths: ArrayLike, items: ArrayLike,
                item_lengths: ArrayLike, suffix: ArrayLike, *, pad_id: int = 0
                ) -> tuple[jax.Array, jax.Array, jax.Array, np.ndarray]:
    """Tree rows: tokens and positions ``[B, K, L]``, mask ``[B, K, L, L]``, and the static
    answer index of every item ``[G*M]``. Shapes as in `verifier.answer_logits`."""
    prefix_tokens = jnp.asarray(prefix_tokens, jnp.int32)
    batch, num_responses, prefix_len = prefix_tokens.shape
    branches, real_branch = branch_inputs(items, item_lengths, suffix, pad_id=pad_id)
    _, count, width = branches.shape

    def rows(x: jax.Array) -> jax.Array:  # [B, G*M, W] -> [B, K, G*M*W]
        return jnp.broadcast_to(x.reshape(batch, 1, count * width),
                                (batch, num_responses, count * width))

    n = jnp.asarray(prefix_lengths, jnp.int32)[..., None]
    in_prefix = jnp.arange(prefix_len) < n
    offset = jnp.cumsum(real_branch, axis=-1) - 1  # real tokens before, within the branch
    tokens = jnp.concatenate([jnp.where(in_prefix, prefix_tokens, pad_id), rows(branches)], -1)
    positions = jnp.concatenate(
        [jnp.broadcast_to(jnp.arange(prefix_len), prefix_tokens.shape), n + rows(offset)], -1)
    real = jnp.concatenate([in_prefix, rows(real_branch)], axis=-1)

    idx = jnp.arange(tokens.shape[-1])
    branch_of = jnp.where(idx < prefix_len, -1, (idx - prefix_len) // width)
    structure = (idx[None, :] <= idx[:, None]) & (
        (branch_of[None, :] == -1) | (branch_of[None, :] == branch_of[:, None]))
    mask = (structure & real[..., None, :]) | (idx[None, :] == idx[:, None])
    answers = prefix_len + np.arange(count) * width + width - 1
    return tokens, positions, mask, answers


def answer_logits(model: Decoder, prefix_tokens: ArrayLike, prefix_lengths: ArrayLike,
                  items: ArrayLike, item_lengths: ArrayLike, suffix: ArrayLike, *,
                  pad_id: int = 0) -> jax.Array:
    """`verifier.answer_logits` from one dense tree-masked forward per (prompt, response)."""
    tokens, positions, mask, answers = tree_inputs(prefix_tokens, prefix_lengths, items,
                                                   item_lengths, suffix, pad_id=pad_id)
    batch, num_responses, length = tokens.shape
    groups, num_items = jnp.shape(items)[1:3]
    flat = batch * num_responses
    hidden, _ = model.hidden_states(tokens.reshape(flat, length),
                                    positions=positions.reshape(flat, length),
                                    attention_mask=mask.reshape(flat, length, length))
    logits = model.logits(hidden[:, answers])
    return logits.reshape(batch, num_responses, groups, num_items, -1)
