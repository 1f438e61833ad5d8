"""Rubric verification: yes/no probabilities for every item of every rubric group, per response.

The verifier prompt puts the criterion last (`jaxrubric.rubric.templates.verifier_messages`),
so for one (prompt, response) everything before the criterion is a prefix shared by all
G x M items. `verify` encodes that prefix once and runs every item as a branch continuing it
(`Decoder.shared_prefix_hidden`, two-part attention): a branch is the item's tokens plus the
template's suffix (end of the user turn, start of the assistant turn), it attends to the
prefix and causally to itself, never to another branch, and its positions continue from the
prefix end, so each branch computes exactly what the plain sequence prefix + item + suffix
would. The answer is read at each branch's last token. `verify_per_item` runs those plain
sequences one by one (batched): the reference and the baseline the shared forward is measured
against (`benchmarks/verifier.py`).

Layout of one branch (`branch_inputs`, static length ``Li + S``): the item's tokens
left-aligned in ``Li`` slots, padding, the suffix in the last ``S``. Padding is never attended
and gets no position, so the suffix continues right after the item's real tokens and the
answer slot is static. Invalid items still have their branch; their outputs are zeroed.

Only the answer positions are projected to the vocabulary (``[.., G*M, V]``, never
``[.., L, V]``).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from jaxrubric import microbatch
from jaxrubric.models.transformer import Decoder
from jaxrubric.rubric.grammar import token_bytes
from jaxrubric.rubric.templates import Packed, TokenTemplate, assemble, compact, verifier_template

_YES = (b"yes", b"Yes", b"YES")
_NO = (b"no", b"No", b"NO")


@functools.partial(jax.tree_util.register_dataclass, data_fields=[],
                   meta_fields=["suffix", "yes_ids", "no_ids"])
@dataclasses.dataclass(frozen=True)
class VerifierReadout:
    """What a verifier needs besides the model: the branch suffix and the answer token ids.

    ``suffix`` follows every criterion and ends at the answer position. A pytree without
    leaves (its ids are static), so it can be passed straight to jitted functions.
    """

    suffix: tuple[int, ...]
    yes_ids: tuple[int, ...]
    no_ids: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.suffix:
            raise ValueError("the branch suffix is empty: nothing to read the answer at")
        if not self.yes_ids or not self.no_ids:
            raise ValueError("need at least one yes id and one no id")

    @property
    def token_ids(self) -> tuple[int, ...]:
        """The tokens a verdict reads, yes ids first: the only logits `verify` computes."""
        return self.yes_ids + self.no_ids

    def margin(self, logits: jax.Array) -> jax.Array:
        """``log P(yes) - log P(no)`` from logits over `token_ids` (``[..., len(token_ids)]``),
        float32: what a verdict and the verifier's training loss read."""
        n = len(self.yes_ids)
        return yes_margin(logits, range(n), range(n, len(self.token_ids)))

    def p_yes(self, logits: jax.Array) -> jax.Array:
        """`yes_probability` of logits over `token_ids`: the sigmoid of their `margin`."""
        return jax.nn.sigmoid(self.margin(logits))


class Verdicts(NamedTuple):
    """``p_yes [B, K, G, M]`` float32 and ``verdicts`` (``p_yes > 0.5``); 0/False if invalid."""

    p_yes: jax.Array
    verdicts: jax.Array


def yes_no_token_ids(tokenizer: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Every single token that spells yes / Yes / YES (and no / No / NO), with or without
    surrounding whitespace (``yes``, ``Ġyes``, ``▁Yes``); special tokens excluded.

    Raises ValueError when the vocabulary has no single-token yes or no.
    """
    pieces = token_bytes(tokenizer)
    yes = tuple(i for i, p in enumerate(pieces) if p is not None and p.strip() in _YES)
    no = tuple(i for i, p in enumerate(pieces) if p is not None and p.strip() in _NO)
    if not yes or not no:
        raise ValueError(f"the vocabulary needs single-token yes and no, found {len(yes)} yes "
                         f"and {len(no)} no tokens")
    return yes, no


def verifier_readout(tokenizer: Any, template: TokenTemplate | None = None) -> VerifierReadout:
    """The readout of ``template`` (default: `verifier_template` of the tokenizer)."""
    template = verifier_template(tokenizer) if template is None else template
    yes, no = yes_no_token_ids(tokenizer)
    return VerifierReadout(template.segments[-1], yes, no)


def verifier_prefix(template: TokenTemplate, prompt: ArrayLike, prompt_lengths: ArrayLike,
                    responses: ArrayLike, response_lengths: ArrayLike, *,
                    pad_id: int = 0) -> Packed:
    """Shared prefixes ``[B, K, Lpre]`` (left-aligned): the verifier template up to the
    criterion, with prompt ``[B, Lp]`` (``prompt_lengths [B]``) and responses ``[B, K, Lr]``
    (``response_lengths [B, K]``) spliced in. Jittable.
    """
    prompt = jnp.asarray(prompt)[:, None]
    prompt_lengths = jnp.asarray(prompt_lengths)[:, None]
    return assemble(template.head(2), [prompt, responses], [prompt_lengths, response_lengths],
                    pad_id=pad_id, align="left")


def yes_margin(logits: ArrayLike, yes_ids: ArrayLike, no_ids: ArrayLike) -> jax.Array:
    """``log P(yes) - log P(no)`` (float32) from logits ``[..., V]``, summing every yes / no
    id; no softmax over V is needed, its normaliser cancels."""
    logits = jnp.asarray(logits, jnp.float32)
    log_yes = jax.nn.logsumexp(logits[..., jnp.asarray(yes_ids)], axis=-1)
    log_no = jax.nn.logsumexp(logits[..., jnp.asarray(no_ids)], axis=-1)
    return log_yes - log_no


def yes_probability(logits: ArrayLike, yes_ids: ArrayLike, no_ids: ArrayLike) -> jax.Array:
    """``P(yes) / (P(yes) + P(no))`` from logits ``[..., V]``, summing every yes / no id."""
    return jax.nn.sigmoid(yes_margin(logits, yes_ids, no_ids))


def branch_inputs(items: ArrayLike, item_lengths: ArrayLike, suffix: ArrayLike, *,
                  pad_id: int = 0) -> tuple[jax.Array, jax.Array]:
    """Item branches ``[B, G*M, Li + S]`` and their real tokens (same shape; see the module
    docstring for the layout) from items ``[B, G, M, Li]``, ``item_lengths [B, G, M]`` and
    the suffix ``[S]``. The answer is read at every branch's last slot.
    """
    items = jnp.asarray(items, jnp.int32)
    suffix = jnp.asarray(suffix, jnp.int32)
    batch, groups, num_items, item_len = items.shape
    in_item = jnp.arange(item_len) < jnp.asarray(item_lengths, jnp.int32)[..., None]
    shape = (batch, groups * num_items, suffix.shape[0])
    tokens = jnp.concatenate([jnp.where(in_item, items, pad_id).reshape(*shape[:2], item_len),
                              jnp.broadcast_to(suffix, shape)], axis=-1)
    real = jnp.concatenate([in_item.reshape(*shape[:2], item_len), jnp.ones(shape, bool)],
                           axis=-1)
    return tokens, real


def answer_logits(model: Decoder, prefix_tokens: ArrayLike, prefix_lengths: ArrayLike,
                  items: ArrayLike, item_lengths: ArrayLike, suffix: ArrayLike, *,
                  pad_id: int = 0, token_ids: Sequence[int] | None = None) -> jax.Array:
    """Logits ``[B, K, G, M, V]`` at every item's answer position: per (prompt, response) the
    prefix encoded once and the G*M item branches continuing it (two-part attention). With
    ``token_ids`` only those tokens' logits, ``[B, K, G, M, len(token_ids)]``
    (`Decoder.token_logits`): a verdict compares yes with no, and ``P(yes) / (P(yes) + P(no))``
    needs no softmax over the vocabulary.

    Inputs: prefix ``[B, K, Lp]`` (left-aligned) with ``prefix_lengths [B, K]``, items
    ``[B, G, M, Li]`` with ``item_lengths [B, G, M]``, suffix ``[S]``. Jittable.
    """
    prefix_tokens = jnp.asarray(prefix_tokens, jnp.int32)
    batch, num_responses, prefix_len = prefix_tokens.shape
    groups, num_items = jnp.shape(items)[1:3]
    flat = batch * num_responses
    prefix_mask = jnp.arange(prefix_len) < jnp.asarray(prefix_lengths)[..., None]
    prefix = jnp.where(prefix_mask, prefix_tokens, pad_id).reshape(flat, prefix_len)
    branches, real = branch_inputs(items, item_lengths, suffix, pad_id=pad_id)

    def per_response(x: jax.Array) -> jax.Array:  # [B, ...] -> [B*K, ...]: every response's
        return jnp.broadcast_to(x[:, None], (batch, num_responses, *x.shape[1:])).reshape(
            flat, *x.shape[1:])

    _, hidden = model.shared_prefix_hidden(prefix, prefix_mask.reshape(flat, prefix_len),
                                           per_response(branches),
                                           branch_mask=per_response(real))
    last = hidden[:, :, -1]
    logits = model.logits(last) if token_ids is None else model.token_logits(last, token_ids)
    return logits.reshape(batch, num_responses, groups, num_items, -1)


def answer_logits_per_item(model: Decoder, prefix_tokens: ArrayLike, prefix_lengths: ArrayLike,
                           items: ArrayLike, item_lengths: ArrayLike, suffix: ArrayLike, *,
                           pad_id: int = 0) -> jax.Array:
    """As `answer_logits`, but every prefix + item + suffix is its own sequence (batched)."""
    prefix_tokens = jnp.asarray(prefix_tokens, jnp.int32)
    items = jnp.asarray(items, jnp.int32)
    suffix = jnp.asarray(suffix, jnp.int32)
    batch, num_responses, prefix_len = prefix_tokens.shape
    _, groups, num_items, item_len = items.shape
    shape = (batch, num_responses, groups, num_items)
    parts = [
        jnp.broadcast_to(prefix_tokens[:, :, None, None], (*shape, prefix_len)),
        jnp.broadcast_to(items[:, None], (*shape, item_len)),
        jnp.broadcast_to(suffix, (*shape, suffix.shape[0])),
    ]
    valid = [
        jnp.arange(prefix_len) < jnp.asarray(prefix_lengths)[:, :, None, None, None],
        jnp.arange(item_len) < jnp.asarray(item_lengths)[:, None, ..., None],
        jnp.ones((suffix.shape[0],), bool),
    ]
    valid = [jnp.broadcast_to(v, p.shape) for v, p in zip(valid, parts)]
    packed = compact(jnp.concatenate(parts, -1), jnp.concatenate(valid, -1), pad_id=pad_id)
    length = packed.tokens.shape[-1]
    hidden, _ = model.hidden_states(packed.tokens.reshape(-1, length),
                                    attention_mask=packed.mask.reshape(-1, length))
    last = jnp.take_along_axis(hidden, (packed.lengths.reshape(-1) - 1)[:, None, None], axis=1)
    return model.logits(last).reshape(*shape, -1)


def _verdicts(p_yes: jax.Array, valid: ArrayLike) -> Verdicts:
    valid = jnp.asarray(valid, bool)[:, None]
    return Verdicts(jnp.where(valid, p_yes, 0.0), valid & (p_yes > 0.5))


def verify(model: Decoder, readout: VerifierReadout, prefix_tokens: ArrayLike,
           prefix_lengths: ArrayLike, items: ArrayLike, item_lengths: ArrayLike,
           valid: ArrayLike, *, pad_id: int = 0, micro_batches: int = 1) -> Verdicts:
    """Judges every response under every item with one shared-prefix forward per (prompt,
    response) (`answer_logits`).

    ``prefix_tokens [B, K, Lp]`` / ``prefix_lengths [B, K]`` (from `verifier_prefix`);
    ``items [B, G, M, Li]``, ``item_lengths`` and ``valid [B, G, M]`` (from
    `jaxrubric.rubric.grammar.parse_rubric_tokens`). Returns ``[B, K, G, M]`` verdicts.
    Jittable; shard the leading batch axis over the mesh's data axes. With
    ``micro_batches = n > 1`` the prompts go through the verifier n micro-batches at a time
    (`microbatch.map_rows`): the prefixes and branches of ``B / n`` prompts exist at once.
    """
    logits = microbatch.map_rows(
        lambda xs: answer_logits(model, *xs, readout.suffix, pad_id=pad_id,
                                 token_ids=readout.token_ids),
        tuple(jnp.asarray(x) for x in (prefix_tokens, prefix_lengths, items, item_lengths)),
        micro_batches)
    return _verdicts(readout.p_yes(logits), valid)


def verify_per_item(model: Decoder, readout: VerifierReadout, prefix_tokens: ArrayLike,
                    prefix_lengths: ArrayLike, items: ArrayLike, item_lengths: ArrayLike,
                    valid: ArrayLike, *, pad_id: int = 0) -> Verdicts:
    """`verify` with one forward per (prompt, response, item): the unshared reference."""
    logits = answer_logits_per_item(model, prefix_tokens, prefix_lengths, items, item_lengths,
                                    readout.suffix, pad_id=pad_id)
    return _verdicts(yes_probability(logits, readout.yes_ids, readout.no_ids), valid)


def verdict_loss(model: Decoder, readout: VerifierReadout, prefix_tokens: ArrayLike,
                 prefix_lengths: ArrayLike, items: ArrayLike, item_lengths: ArrayLike,
                 valid: ArrayLike, labels: ArrayLike, *, pad_id: int = 0
                 ) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Supervised loss of a verifier on labelled criteria, through the forward `verify` runs
    (`answer_logits`): cross-entropy of the yes/no answer (``P(yes) / (P(yes) + P(no))``) against
    ``labels [B, K, G, M]`` (1 = met), averaged over valid items.

    Training through the inference path keeps train and use identical, and one forward reads
    G*M labels per (prompt, response) instead of one. Returns ``(loss, {loss, accuracy})``.
    """
    logits = answer_logits(model, prefix_tokens, prefix_lengths, items, item_lengths,
                           readout.suffix, pad_id=pad_id, token_ids=readout.token_ids)
    margin = readout.margin(logits)
    labels = jnp.asarray(labels, jnp.float32)
    weight = jnp.broadcast_to(jnp.asarray(valid, bool)[:, None], margin.shape).astype(jnp.float32)
    nll = -(labels * jax.nn.log_sigmoid(margin) + (1 - labels) * jax.nn.log_sigmoid(-margin))
    count = jnp.maximum(weight.sum(), 1.0)
    loss = (nll * weight).sum() / count
    accuracy = (((margin > 0) == (labels > 0.5)) * weight).sum() / count
    return loss, {"loss": loss, "accuracy": accuracy}
