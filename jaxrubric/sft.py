"""Supervised fine-tuning on (prompt, target) token sequences, with the RL trainer's machinery.

SFT warm-starts a policy, cold-starts a rubric generator and trains the yes/no verifier of the
toy world. It reuses what GRPO uses, so an SFT'd model drops straight into a co-evolution run:
the same `Decoder` (`hidden_states` + chunked `logits`), `grpo.token_logprobs_chunked` for the
target log-probs (never `[B, L, V]` logits whole), optax optimisers over
`nnx.state(model, nnx.Param)`, the `jaxrubric.sharding` rules for parameters and batches, and
`jaxrubric.checkpoint` to save.

A row is a prompt followed by its target, right-padded to a fixed length (static shapes: one
compiled step for the whole run). Only target tokens are predicted; the prompt is context.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec, Sharding
from tqdm.auto import tqdm

from jaxrubric import sharding as shd
from jaxrubric.models.transformer import Decoder
from jaxrubric.rl import grpo

Array = jax.Array
Metrics = dict[str, Array]


class SFTBatch(NamedTuple):
    """One batch of right-padded rows `[B, L]`: prompt tokens, then target tokens, then padding.

    `loss_mask` is True on the tokens to predict (the target; never the prompt or padding);
    `attention_mask` on real tokens. `loss_weight [B]` (optional) scales each row's tokens in
    the weighted token mean; a weight of 0 removes a row, e.g. one that pads the batch to a
    multiple of the data-parallel ways.
    """

    tokens: Any
    loss_mask: Any
    attention_mask: Any
    loss_weight: Any = None


# --------------------------------------------------------------------------------------------
# Host-side encoding
# --------------------------------------------------------------------------------------------


def encode_examples(tokenizer: Any | None, prompts: Sequence[Sequence[int] | str],
                    targets: Sequence[Sequence[int] | str], *, max_len: int, pad_id: int,
                    loss_weight: Sequence[float] | None = None) -> SFTBatch:
    """Rows `prompt + target`, right-padded to `max_len`, as a NumPy `SFTBatch`.

    With `tokenizer=None`, prompts and targets are token-id lists. With a tokenizer they are
    strings, each encoded on its own without special tokens: the model then sees exactly the
    prompt ids the sampler will feed it, followed by the ids it should generate. A target that
    should teach the model to stop must end with the stop token (its id, or its text such as
    `tokenizer.eos_token`, which tokenizers keep as one special token).

    Nothing is truncated: a row longer than `max_len`, an empty target, or an empty prompt (the
    first target token needs a token before it to be predicted from) raises ValueError naming
    the row. Every batch has width `max_len`, so a training run compiles one step.
    """
    if len(prompts) != len(targets):
        raise ValueError(f"{len(prompts)} prompts but {len(targets)} targets")
    if not prompts:
        raise ValueError("no examples to encode")
    if loss_weight is not None and len(loss_weight) != len(prompts):
        raise ValueError(f"{len(loss_weight)} loss weights for {len(prompts)} examples")
    rows = [(_token_ids(tokenizer, p, i, "prompt"), _token_ids(tokenizer, t, i, "target"))
            for i, (p, t) in enumerate(zip(prompts, targets))]
    tokens = np.full((len(rows), max_len), pad_id, np.int32)
    loss_mask = np.zeros((len(rows), max_len), bool)
    attention_mask = np.zeros((len(rows), max_len), bool)
    for i, (prompt, target) in enumerate(rows):
        _check_row(i, len(prompt), len(target), max_len)
        end = len(prompt) + len(target)
        tokens[i, :end] = prompt + target
        loss_mask[i, len(prompt):end] = True
        attention_mask[i, :end] = True
    weights = None if loss_weight is None else np.asarray(loss_weight, np.float32)
    return SFTBatch(tokens, loss_mask, attention_mask, weights)


def _token_ids(tokenizer: Any | None, item: Sequence[int] | str, row: int, kind: str
               ) -> list[int]:
    if tokenizer is None:
        if isinstance(item, str):
            raise TypeError(f"row {row}: {kind} is a string; pass a tokenizer to encode text")
        return [int(t) for t in item]
    if not isinstance(item, str):
        raise TypeError(f"row {row}: {kind} must be a string when a tokenizer is given")
    return list(tokenizer.encode(item, add_special_tokens=False))


def _check_row(row: int, prompt_len: int, target_len: int, max_len: int) -> None:
    if prompt_len == 0:
        raise ValueError(f"row {row}: empty prompt; the first target token is predicted from "
                         "the token before it (start the prompt with BOS)")
    if target_len == 0:
        raise ValueError(f"row {row}: empty target, nothing to learn")
    if prompt_len + target_len > max_len:
        raise ValueError(f"row {row}: prompt {prompt_len} + target {target_len} = "
                         f"{prompt_len + target_len} tokens, more than max_len {max_len}")


def place_batch(mesh: Mesh | None, batch: SFTBatch) -> SFTBatch:
    """The batch as device arrays, rows split over the mesh's batch axes (`shd.batch_sharding`).

    Every process passes the same global batch and uploads only the rows its devices hold.
    Without a mesh the arrays go to the default device.
    """
    if mesh is None:
        return SFTBatch(*(None if x is None else jnp.asarray(x) for x in batch))
    rows, ways = np.shape(batch.tokens)[0], shd.batch_ways(mesh)
    if rows % ways:
        raise ValueError(f"batch of {rows} rows does not split {ways} ways over the mesh; pad "
                         "it with rows of loss_weight 0 (or no target tokens)")
    return SFTBatch(*(None if x is None else _place(mesh, np.asarray(x)) for x in batch))


def _place(mesh: Mesh, value: np.ndarray) -> Array:
    sharding = shd.batch_sharding(mesh, value.ndim)
    return shd.assemble_array(value.shape, value.dtype, sharding, lambda index: value[index])


# --------------------------------------------------------------------------------------------
# The loss
# --------------------------------------------------------------------------------------------


def sft_loss(model: Decoder, batch: SFTBatch, *, chunk_size: int = 64
             ) -> tuple[Array, Metrics]:
    """Next-token cross-entropy of the target tokens: `(loss, metrics)`.

    The loss is the token mean over the whole batch (each row's tokens scaled by its
    `loss_weight`), so long targets count in proportion to their length, as in GRPO's default
    aggregation. Position t predicts token t + 1 (a mask on position 0 is meaningless and
    ignored); a token counts only where both `loss_mask` and `attention_mask` are True.

    Log-probs come from `grpo.token_logprobs_chunked`: the vocabulary projection runs `chunk_size`
    positions at a time and is recomputed in the backward pass, so `[B, L, V]` logits never
    exist. Token accuracy (argmax == target) needs the argmax, which the log-prob chunks do not
    return: it takes one more chunked, gradient-free projection, a forward-only cost small next
    to the forward + backward of the loss. Metrics: `loss`, `accuracy` (weighted like the loss),
    `target_tokens` (loss-mask tokens in the batch).
    """
    tokens = jnp.asarray(batch.tokens)
    valid = jnp.asarray(batch.attention_mask, bool)
    hidden, _ = model.hidden_states(tokens, attention_mask=valid)
    predicting, targets = hidden[:, :-1], tokens[:, 1:]
    chunk = min(chunk_size, targets.shape[1])
    logp = grpo.token_logprobs_chunked(predicting, model.logits, targets, chunk_size=chunk)
    counted = jnp.asarray(batch.loss_mask, bool)[:, 1:] & valid[:, 1:]
    weight = counted.astype(jnp.float32)
    if batch.loss_weight is not None:
        weight = weight * jnp.asarray(batch.loss_weight, jnp.float32)[:, None]
    total = jnp.sum(weight)
    loss = grpo.safe_ratio(-jnp.sum(weight * logp), total)
    predicted = _chunked_argmax(lax.stop_gradient(predicting), model.logits, chunk)
    correct = (predicted == targets).astype(jnp.float32)
    return loss, {"loss": loss, "accuracy": grpo.safe_ratio(jnp.sum(weight * correct), total),
                  "target_tokens": jnp.sum(counted)}


def _chunked_argmax(hidden: Array, unembed: Callable[[Array], Array], chunk_size: int) -> Array:
    """`argmax` of the logits `[B, L]`, projecting `chunk_size` positions at a time."""
    b, length, d = hidden.shape
    n_chunks = -(-length // chunk_size)
    pad = n_chunks * chunk_size - length
    h = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0)))
    h = h.reshape(b, n_chunks, chunk_size, d).swapaxes(0, 1)
    out = lax.map(lambda h_c: jnp.argmax(unembed(h_c), axis=-1).astype(jnp.int32), h)
    return out.swapaxes(0, 1).reshape(b, n_chunks * chunk_size)[:, :length]


# --------------------------------------------------------------------------------------------
# The jitted step
# --------------------------------------------------------------------------------------------

StepFn = Callable[[nnx.State, optax.OptState, SFTBatch], tuple[nnx.State, optax.OptState, Metrics]]


def make_sft_step(graph: nnx.GraphDef, optimizer: optax.GradientTransformation, *,
                  chunk_size: int = 64) -> StepFn:
    """`step(params, opt_state, batch) -> (params, opt_state, metrics)`, one optimiser step.

    `params` is `nnx.state(model, nnx.Param)` and `graph` its `nnx.graphdef(model)`. Params and
    optimiser state are donated (updated in place: the arrays passed in are gone afterwards)
    and come back with the shardings they went in with, so every step reuses one compiled
    program. That program is built at the first call from those shardings; leaves off the
    parameters' devices (optax's step count is created on the default device) are first moved
    there, replicated. Place batches with `place_batch`. Metrics are those of `sft_loss` plus
    `grad_norm`, computed before the update. `step.jitted` is the compiled function (tests read
    its cache size).
    """
    def loss_fn(params, batch):
        return sft_loss(nnx.merge(graph, params), batch, chunk_size=chunk_size)

    def update(params, opt_state, batch):
        (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        return params, opt_state, {**metrics, "grad_norm": optax.global_norm(grads)}

    def step(params, opt_state, batch):
        if step.jitted is None:
            home = _home_sharding(params)
            step.shardings = jax.tree.map(lambda x: _sharding_on(x, home), (params, opt_state))
            mesh = home.mesh if isinstance(home, NamedSharding) else None
            step.jitted = jax.jit(shd.traced_in(update, mesh), donate_argnums=(0, 1),
                                  out_shardings=(*step.shardings, home))
            # Commits every leaf (no copy where it already sits right): jit keys its cache on
            # commitment too, and the outputs it feeds back are committed.
            params, opt_state = jax.device_put((params, opt_state), step.shardings)
        else:
            params, opt_state = jax.tree.map(_put, (params, opt_state), step.shardings)
        return step.jitted(params, opt_state, batch)

    step.jitted = None
    return step


def _home_sharding(params: nnx.State) -> Sharding:
    """Where replicated values live: the parameters' mesh, or their single device."""
    for leaf in jax.tree.leaves(params):
        if isinstance(leaf.sharding, NamedSharding):
            return NamedSharding(leaf.sharding.mesh, PartitionSpec())
    return jax.tree.leaves(params)[0].sharding


def _sharding_on(x: Array, home: Sharding) -> Sharding:
    same_devices = x.sharding.device_set == home.device_set
    return x.sharding if same_devices and isinstance(x.sharding, type(home)) else home


def _put(x: Array, sharding: Sharding) -> Array:
    return x if x.sharding == sharding else jax.device_put(x, sharding)


# --------------------------------------------------------------------------------------------
# Host loop
# --------------------------------------------------------------------------------------------


def train_sft(model: Decoder, optimizer: optax.GradientTransformation,
              batches: Iterable[SFTBatch], *, steps: int, log_every: int = 10,
              progress: bool = True, chunk_size: int = 64,
              on_log: Callable[[dict[str, float]], None] | None = None
              ) -> tuple[nnx.State, list[dict[str, float]]]:
    """Trains `model` for `steps` batches; returns `(params, history)`.

    The model is updated in place (`nnx.update`) with the trained parameters, which are also
    returned as `nnx.state(model, nnx.Param)`. While training runs the model's own arrays are
    donated to the step, so do not read the model until this returns. The optimiser state
    starts fresh and is dropped at the end, and nothing is checkpointed here: save the model
    with `jaxrubric.checkpoint.save_model` afterwards.

    Batches are placed on the parameters' mesh (`place_batch`); a sharded model is trained
    sharded. Metrics are read back every `log_every` steps and at the last step only (reading
    every step would stall the device queue); `history` holds those, each with its `step`
    (1-based), and each is also handed to `on_log` as it is read (live TensorBoard curves).
    A tqdm bar shows the loss on process 0 when `progress`. Fewer than `steps` batches raises
    ValueError.
    """
    if steps < 1 or log_every < 1:
        raise ValueError(f"steps and log_every must be >= 1, got {steps} and {log_every}")
    params = nnx.state(model, nnx.Param)
    mesh = _params_mesh(params)
    step = make_sft_step(nnx.graphdef(model), optimizer, chunk_size=chunk_size)
    opt_state = optimizer.init(params)
    history: list[dict[str, float]] = []
    done = 0
    show = progress and jax.process_index() == 0
    try:
        with tqdm(total=steps, desc="sft", unit="step", disable=not show) as bar:
            for batch in itertools.islice(batches, steps):
                params, opt_state, metrics = step(params, opt_state, place_batch(mesh, batch))
                done += 1
                if done % log_every == 0 or done == steps:
                    history.append({"step": done, **{k: float(v) for k, v in metrics.items()}})
                    if on_log is not None:
                        on_log(history[-1])
                    bar.set_postfix(loss=f"{history[-1]['loss']:.4f}", refresh=False)
                bar.update(1)
    finally:
        nnx.update(model, params)  # the model's own arrays were donated to the first step
    if done < steps:
        raise ValueError(f"batches ran out after {done} of {steps} steps")
    return params, history


def _params_mesh(params: nnx.State) -> Mesh | None:
    home = _home_sharding(params)
    return home.mesh if isinstance(home, NamedSharding) else None
