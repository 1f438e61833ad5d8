"""Item and token-level credit, what both methods' generators learn from: a rubric's reward
cannot say which of its items earned it, so each item gets an advantage of its own, normalised
over the query's items (`item_advantages`), and lands on the item's own tokens on top of the
rubric's advantage (`token_level_advantages`, via `ParsedRubric.token_item`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxrubric.rl.grpo import AdvantageMode, group_advantages

Array = jax.Array


def item_advantages(
    item_reward: Array, item_mask: Array, *, mode: AdvantageMode = "group_std", eps: float = 1e-6
) -> Array:
    """Normalise item rewards `[..., G, M]` jointly over all items of one query.

    Items are compared with every other valid item of the query's groups (not only within their
    own group, which may hold a single item), via `group_advantages` over the flattened G*M
    axis. `item_mask`: the valid items of the well-formed groups; others get 0.
    """
    shape = item_reward.shape
    flat = item_reward.reshape(*shape[:-2], -1)
    valid = jnp.broadcast_to(jnp.asarray(item_mask, bool), shape).reshape(flat.shape)
    return group_advantages(flat, mode=mode, eps=eps, valid=valid).reshape(shape)


def token_level_advantages(seq_adv: Array, item_adv: Array, token_item_index: Array) -> Array:
    """Per-token advantages `[..., G, L]` for the generator's rubric tokens.

    `token_item_index[..., g, t]` is the item a token belongs to, or -1 for structural tokens
    (headers, separators, weights, EOS, padding): those get `seq_adv[g]`, item tokens get
    `seq_adv[g] + item_adv[g, m]`.
    """
    idx = jnp.asarray(token_item_index)
    item_part = jnp.take_along_axis(item_adv, jnp.clip(idx, 0, item_adv.shape[-1] - 1), axis=-1)
    return seq_adv[..., None] + jnp.where(idx >= 0, item_part, 0.0)
