"""Jitted sampling: one prefill, one `lax.while_loop` decode, K samples per prompt.

GRPO needs the sampled tokens and their log-probabilities under the model's own (untempered,
unconstrained) distribution: `SampleResult.logprobs` is exactly what a teacher-forced forward
gives at the sampled tokens. The log-probabilities under the distribution actually sampled from
(temperature, top-k, top-p, grammar mask) are returned too.

Shapes are bucketed (prompt length and output length rounded up to powers of two) so a training
run compiles a handful of programs. The model's graph and its state are passed separately, so
weights are arguments of the compiled programs, not constants baked into them.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from jaxrubric import microbatch
from jaxrubric import sharding as shd
from jaxrubric.models.transformer import MASKED_LOGIT, Decoder, KVCache
from jaxrubric.rubric import grammar as grammar_lib

MIN_BUCKET = 16


def bucket(n: int, minimum: int = MIN_BUCKET) -> int:
    """The smallest power of two >= n (and >= minimum): the compiled length for n."""
    return max(minimum, 1 << max(0, int(n) - 1).bit_length())


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SampleResult:
    """Samples `[B, K, max_new_tokens]`; positions after a row's end hold `pad_id` and 0 log-prob.

    `lengths` counts generated tokens including the stop token; `finished` is True when the row
    ended on a stop token (False when it ran out of budget: a truncated completion).
    """

    tokens: jax.Array
    lengths: jax.Array
    finished: jax.Array
    logprobs: jax.Array
    sampling_logprobs: jax.Array


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """The static knobs of a decode program (each distinct value compiles once)."""

    greedy: bool
    top_k: int | None
    use_top_p: bool
    num_stop: int
    constrained: bool


def filter_logits(logits: jax.Array, temperature: jax.Array, top_k: int | None,
                  top_p: jax.Array | None) -> jax.Array:
    """Tempered logits with everything outside top-k / the top-p nucleus masked."""
    logits = logits / temperature
    if top_k is not None:
        kth = jax.lax.top_k(logits, top_k)[0][..., -1:]
        logits = jnp.where(logits < kth, MASKED_LOGIT, logits)
    if top_p is not None:
        order = jnp.argsort(-logits, axis=-1)
        sorted_logits = jnp.take_along_axis(logits, order, axis=-1)
        probs = jax.nn.softmax(sorted_logits, axis=-1)
        before = jnp.cumsum(probs, axis=-1) - probs  # mass strictly above each token
        keep_sorted = before < top_p  # the first token always stays
        keep = jnp.zeros_like(keep_sorted).at[
            jnp.arange(logits.shape[0])[:, None], order].set(keep_sorted)
        logits = jnp.where(keep, logits, MASKED_LOGIT)
    return logits


class NoiseRows(NamedTuple):
    """The rows `ids [rows]` of a batch of `total` rows that a micro-batch samples: each row
    draws the noise it would draw in the whole batch, so micro-batching leaves samples as
    they are."""

    ids: jax.Array
    total: int


def _sample_step(logits, key, temperature, top_p, params: SamplingParams, grammar, g_state,
                 noise_rows: NoiseRows | None = None):
    """One token per row: (token, untempered log-prob, sampling log-prob)."""
    raw_logp = jax.nn.log_softmax(logits, axis=-1)
    if params.constrained:
        logits = grammar_lib.apply_grammar(logits, g_state, grammar)
    if params.greedy:
        token = jnp.argmax(logits, axis=-1)
        sample_logp = jnp.zeros(token.shape, jnp.float32)
    else:
        filtered = filter_logits(logits, temperature, params.top_k,
                                 top_p if params.use_top_p else None)
        # Gumbel-max with the noise drawn vocabulary-major: a draw is prefix-stable along its
        # leading axis, so every real token gets the same noise whatever padding the vocabulary
        # has (a multiple of the tensor axis), and one key samples the same tokens on any mesh.
        # A micro-batch draws the whole batch's noise and takes its rows' share.
        width = filtered.shape[0] if noise_rows is None else noise_rows.total
        noise = jax.random.gumbel(key, (filtered.shape[1], width), filtered.dtype).T
        if noise_rows is not None:
            noise = noise[noise_rows.ids]
        token = jnp.argmax(filtered + noise, axis=-1)
        sample_logp = jnp.take_along_axis(jax.nn.log_softmax(filtered, axis=-1),
                                          token[:, None], axis=-1)[:, 0]
    token_logp = jnp.take_along_axis(raw_logp, token[:, None], axis=-1)[:, 0]
    return token.astype(jnp.int32), token_logp, sample_logp


def prefill(model: Decoder, tokens: jax.Array, mask: jax.Array, *, cache_len: int,
            num_samples: int) -> tuple[KVCache, jax.Array]:
    """Prompt forward once per prompt (left-padded `tokens`, `mask` True on real tokens), then
    the cache and next-token logits copied for each of the `num_samples` rows continuing it.
    Traceable: the co-evolution round calls it inside its own program."""
    cache = KVCache.empty(model.config, tokens.shape[0], cache_len)
    hidden, cache = model.hidden_states(tokens, attention_mask=mask, cache=cache)
    logits = model.logits(hidden[:, -1:])[:, 0]
    return cache.repeat(num_samples), jnp.repeat(logits, num_samples, axis=0)


def decode(model: Decoder, cache: KVCache, logits: jax.Array, positions: jax.Array,
           rng: jax.Array, temperature: jax.Array, top_p: jax.Array, stop_ids: jax.Array,
           max_new_tokens: jax.Array, grammar: Any, *, params: SamplingParams,
           num_samples: int, max_len: int, noise_rows: NoiseRows | None = None
           ) -> tuple[SampleResult, KVCache]:
    """Decodes up to `max_new_tokens` (<= max_len) tokens for every row from the prefilled
    cache; `positions [rows]` is each row's prompt length; `noise_rows` when these rows are a
    micro-batch of a larger batch. Traceable."""
    model = model.unstacked()
    rows = logits.shape[0]
    pad = jnp.int32(0)
    g_state = jnp.full((rows,), grammar.start_state if params.constrained else 0, jnp.int32)
    init = dict(
        step=jnp.int32(0), cache=cache, logits=logits, g_state=g_state,
        tokens=jnp.zeros((rows, max_len), jnp.int32),
        logprobs=jnp.zeros((rows, max_len), jnp.float32),
        sampling_logprobs=jnp.zeros((rows, max_len), jnp.float32),
        done=jnp.zeros((rows,), bool), finished=jnp.zeros((rows,), bool),
        lengths=jnp.zeros((rows,), jnp.int32),
    )

    def cond(c):
        return (c["step"] < max_new_tokens) & ~jnp.all(c["done"])

    def body(c):
        step = c["step"]
        key = jax.random.fold_in(rng, step)
        token, logp, sample_logp = _sample_step(c["logits"], key, temperature, top_p, params,
                                                grammar, c["g_state"], noise_rows)
        live = ~c["done"]
        token = jnp.where(live, token, pad)
        hit_stop = live & jnp.any(token[:, None] == stop_ids[None, :], axis=-1)
        g_state = c["g_state"]
        if params.constrained:
            g_state = grammar_lib.advance(g_state, token, grammar)
            hit_stop = hit_stop | (live & grammar_lib.is_final(g_state, grammar))
        out = dict(c)
        out["tokens"] = c["tokens"].at[:, step].set(token)
        out["logprobs"] = c["logprobs"].at[:, step].set(jnp.where(live, logp, 0.0))
        out["sampling_logprobs"] = c["sampling_logprobs"].at[:, step].set(
            jnp.where(live, sample_logp, 0.0))
        out["lengths"] = c["lengths"] + live
        out["finished"] = c["finished"] | hit_stop
        out["done"] = c["done"] | hit_stop | (step + 1 >= max_new_tokens)
        out["g_state"] = g_state
        hidden, out["cache"] = model.hidden_states(
            token[:, None], positions=(positions + step)[:, None], cache=c["cache"])
        out["logits"] = model.logits(hidden)[:, 0]
        out["step"] = step + 1
        return out

    final = jax.lax.while_loop(cond, body, init)
    shape = (rows // num_samples, num_samples)
    return SampleResult(
        tokens=final["tokens"].reshape(*shape, max_len),
        lengths=final["lengths"].reshape(shape),
        finished=final["finished"].reshape(shape),
        logprobs=final["logprobs"].reshape(*shape, max_len),
        sampling_logprobs=final["sampling_logprobs"].reshape(*shape, max_len),
    ), final["cache"]


@functools.partial(jax.jit, static_argnames=("graphdef", "cache_len", "num_samples"))
def _prefill(graphdef, state, tokens, mask, *, cache_len: int, num_samples: int):
    return prefill(nnx.merge(graphdef, state), tokens, mask, cache_len=cache_len,
                   num_samples=num_samples)


@functools.partial(jax.jit, static_argnames=("graphdef", "params", "num_samples", "max_len"),
                   donate_argnames=("cache",))
def _decode(graphdef, state, cache, *args, params: SamplingParams, num_samples: int,
            max_len: int):
    """The decode program; the donated cache is updated in place and returned."""
    return decode(nnx.merge(graphdef, state), cache, *args, params=params,
                  num_samples=num_samples, max_len=max_len)


def sampling_params(*, temperature: float, top_k: int | None, top_p: float | None,
                    num_stop: int, constrained: bool) -> SamplingParams:
    return SamplingParams(greedy=temperature == 0, top_k=top_k,
                          use_top_p=top_p is not None and top_p < 1, num_stop=num_stop,
                          constrained=constrained)


def sample(model: Decoder, tokens: jax.Array, mask: jax.Array, lengths: jax.Array,
           rng: jax.Array, *, num_samples: int, max_new_tokens: int, temperature: float = 1.0,
           top_k: int | None = None, top_p: float | None = None,
           stop_token_ids: Sequence[int] = (), grammar: Any = None, micro_batches: int = 1
           ) -> SampleResult:
    """`generate` for use inside a jitted program: left-padded `tokens [B, P]`, `mask`, prompt
    `lengths [B]`; output length `max_new_tokens` exactly (static).

    With `micro_batches = n > 1` the prompts are prefilled and decoded n micro-batches at a
    time (`microbatch.map_rows`), so the KV cache holds `B K / n` rows; every row draws the
    noise it draws in one batch, so the samples are the same.
    """
    params = sampling_params(temperature=temperature, top_k=top_k, top_p=top_p,
                             num_stop=len(stop_token_ids), constrained=grammar is not None)
    total = tokens.shape[0] * num_samples

    def run(prompts: tuple[jax.Array, ...]) -> SampleResult:
        tokens, mask, lengths, prompt_ids = prompts
        cache, logits = prefill(model, tokens, mask, cache_len=tokens.shape[1] + max_new_tokens,
                                num_samples=num_samples)
        noise_rows = None if micro_batches == 1 else NoiseRows(
            (prompt_ids[:, None] * num_samples + jnp.arange(num_samples)).reshape(-1), total)
        result, _ = decode(
            model, cache, logits, jnp.repeat(lengths, num_samples), rng,
            jnp.float32(max(temperature, 1e-6)), jnp.float32(1.0 if top_p is None else top_p),
            jnp.asarray(tuple(stop_token_ids) or (-1,), jnp.int32), jnp.int32(max_new_tokens),
            grammar, params=params, num_samples=num_samples, max_len=max_new_tokens,
            noise_rows=noise_rows)
        return result

    return microbatch.map_rows(run, (tokens, mask, lengths, jnp.arange(tokens.shape[0])),
                               micro_batches)


def left_pad(prompts: Sequence[Sequence[int]], length: int, pad_id: int = 0
             ) -> tuple[np.ndarray, np.ndarray]:
    """Token lists -> left-padded `[B, length]` ids and the prompt lengths `[B]`."""
    ids = np.full((len(prompts), length), pad_id, np.int32)
    lengths = np.zeros((len(prompts),), np.int32)
    for i, prompt in enumerate(prompts):
        n = len(prompt)
        if n == 0:
            raise ValueError(f"prompt {i} is empty")
        if n > length:
            raise ValueError(f"prompt {i} has {n} tokens, more than the {length} allowed")
        ids[i, length - n:] = prompt
        lengths[i] = n
    return ids, lengths


def _normalise_prompts(prompts, prompt_lengths) -> list[list[int]]:
    """Token lists as they are; a right-padded `[B, L]` array cut to `prompt_lengths`."""
    if prompt_lengths is None:
        return [list(map(int, p)) for p in prompts]
    array = np.asarray(prompts)
    lengths = np.asarray(prompt_lengths)
    if array.ndim != 2 or lengths.shape != (array.shape[0],):
        raise ValueError("a padded prompt array must be [B, L] with prompt_lengths [B]")
    return [list(map(int, row[:n])) for row, n in zip(array, lengths)]


def generate(model: Decoder, prompts: Sequence[Sequence[int]] | np.ndarray, *,
             max_new_tokens: int, rng: jax.Array, num_samples: int = 1,
             temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
             stop_token_ids: Sequence[int] | None = None, grammar: Any = None,
             prompt_lengths: Sequence[int] | np.ndarray | None = None, pad_id: int = 0,
             mesh: Mesh | None = None, rules: shd.Rules = shd.SAMPLING_RULES) -> SampleResult:
    """Samples `num_samples` continuations of each prompt.

    `prompts` is a list of token-id lists, or a right-padded `[B, L]` array with
    `prompt_lengths`. `temperature=0` is greedy. `stop_token_ids` defaults to the model's eos
    ids. `grammar` (a `jaxrubric.rubric.grammar.RubricGrammar`) constrains every token to its
    finite-state format. With a `mesh`, rows are split over the batch axes and the weights are
    placed by the sampling rules.
    """
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    token_lists = _normalise_prompts(prompts, prompt_lengths)
    cfg = model.config
    stops = tuple(cfg.eos_token_ids if stop_token_ids is None else stop_token_ids)
    prompt_len = bucket(max(len(p) for p in token_lists))
    out_len = bucket(max_new_tokens)
    batch = len(token_lists)
    data_ways = 1 if mesh is None else shd.batch_ways(mesh, rules)
    padded_batch = -(-batch // data_ways) * data_ways
    token_lists = token_lists + [token_lists[0]] * (padded_batch - batch)
    ids, lengths = left_pad(token_lists, prompt_len, pad_id)
    mask = np.arange(prompt_len)[None, :] >= (prompt_len - lengths)[:, None]

    graphdef, state = nnx.split(model)
    arrays = (jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(lengths))
    if mesh is not None:
        state = jax.device_put(state, shd.state_shardings(state, mesh, rules))
        arrays = tuple(jax.device_put(a, shd.batch_sharding(mesh, a.ndim, rules)) for a in arrays)
    ids_j, mask_j, lengths_j = arrays
    cache, last_logits = _prefill(graphdef, state, ids_j, mask_j,
                                  cache_len=prompt_len + out_len, num_samples=num_samples)
    params = sampling_params(temperature=temperature, top_k=top_k, top_p=top_p,
                             num_stop=len(stops), constrained=grammar is not None)
    result, _ = _decode(
        graphdef, state, cache, last_logits, jnp.repeat(lengths_j, num_samples), rng,
        jnp.float32(max(temperature, 1e-6)), jnp.float32(1.0 if top_p is None else top_p),
        jnp.asarray(stops if stops else (-1,), jnp.int32), jnp.int32(max_new_tokens),
        None if grammar is None else jax.device_put(grammar),
        params=params, num_samples=num_samples, max_len=out_len,
    )
    return jax.tree.map(lambda a: a[:batch, :, :max_new_tokens] if a.ndim == 3 else a[:batch],
                        result)
