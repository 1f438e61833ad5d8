"""Decoding throughput: jaxrubric's sampler vs transformers `generate` (PyTorch, CPU), and the
round's sampled rollout whole and micro-batched.

Both run the same random Llama in fp32 with a KV cache, 16-token prompts, 64 new tokens (no
stop token, so every row decodes all 64). Two tables, one row per model size:

1. greedy decoding of 8 prompts, jaxrubric against transformers;
2. the rollout as the round runs it (`sampling.sample` inside one jitted program): 8 prompts x
   K = 8 samples at temperature 1, the 64 rows at once and in 8 micro-batches of 8 rows
   (`round.rollout_micro_batches=8`, the recipes' setting). A row's noise is its own, so the
   micro-batched run draws each step's noise for 8 rows, not 64; the samples are the same.

    python benchmarks/sampling.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import functools
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import torch
import transformers
from flax import nnx

from timing import best_time

import jaxrubric
from jaxrubric import sampling
from jaxrubric.models.transformer import Decoder

SIZES = [
    dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=8, intermediate_size=1024),
    dict(hidden_size=512, num_hidden_layers=8, num_attention_heads=8, intermediate_size=2048),
]
BATCH, PROMPT, NEW, VOCAB = 8, 16, 64, 8192
SAMPLES, MICRO_BATCHES = 8, 8


def _best_of(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def _models(size: dict, scan_layers: bool) -> tuple[transformers.LlamaForCausalLM, Decoder]:
    config = transformers.LlamaConfig(vocab_size=VOCAB, num_key_value_heads=size[
        "num_attention_heads"], max_position_embeddings=256, **size)
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(config).eval()
    with tempfile.TemporaryDirectory() as tmp:
        hf.save_pretrained(tmp)
        return hf, jaxrubric.load_pretrained(Path(tmp), scan_layers=scan_layers)


def greedy(hf: transformers.LlamaForCausalLM, model: Decoder, prompts: np.ndarray,
           repeats: int) -> dict:
    """Table 1: tokens/s of both, the first call's seconds, and whether the tokens agree."""
    def ours():
        out = sampling.generate(model, prompts.tolist(), max_new_tokens=NEW, temperature=0.0,
                                stop_token_ids=[], rng=jax.random.key(0))
        jax.block_until_ready(out.tokens)
        return out

    def theirs():
        with torch.no_grad():
            return hf.generate(torch.as_tensor(prompts), max_new_tokens=NEW, min_new_tokens=NEW,
                               do_sample=False, use_cache=True, pad_token_id=0)

    compile_start = time.perf_counter()
    first = ours()
    compile_s = time.perf_counter() - compile_start
    same = np.array_equal(np.asarray(first.tokens[:, 0]), theirs()[:, PROMPT:].numpy())
    t_ours, t_theirs = _best_of(ours, repeats), _best_of(theirs, repeats)
    tokens = BATCH * NEW
    return dict(ours=tokens / t_ours, theirs=tokens / t_theirs, ratio=t_theirs / t_ours,
                compile_s=compile_s, same=same)


@functools.partial(jax.jit, static_argnames=("graphdef", "micro_batches"))
def _rollout(graphdef, state, tokens, *, micro_batches: int) -> sampling.SampleResult:
    mask = jnp.ones(tokens.shape, bool)
    lengths = jnp.full(tokens.shape[:1], tokens.shape[1])
    return sampling.sample(nnx.merge(graphdef, state), tokens, mask, lengths,
                           jax.random.key(0), num_samples=SAMPLES, max_new_tokens=NEW,
                           temperature=1.0, micro_batches=micro_batches)


def rollout(model: Decoder, prompts: np.ndarray, repeats: int) -> dict:
    """Table 2: tokens/s of the whole and the micro-batched rollout, and whether they agree."""
    graphdef, state = nnx.split(model)
    tokens = jnp.asarray(prompts)
    out = {}
    for n in (1, MICRO_BATCHES):
        fn = functools.partial(_rollout, graphdef, micro_batches=n)
        out[n] = BATCH * SAMPLES * NEW / best_time(fn, (state, tokens), repeats)
    same = np.array_equal(*(np.asarray(_rollout(graphdef, state, tokens, micro_batches=n).tokens)
                            for n in (1, MICRO_BATCHES)))
    return dict(whole=out[1], micro=out[MICRO_BATCHES], same=same)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--unrolled", action="store_true", help="unrolled layers, not lax.scan")
    args = parser.parse_args()
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}, torch {torch.__version__} "
          f"({torch.get_num_threads()} threads); prompt {PROMPT}, new {NEW}, vocab {VOCAB}, fp32")
    prompts = np.random.RandomState(0).randint(3, VOCAB, (BATCH, PROMPT))
    greedy_rows, rollout_rows = [], []
    for size in SIZES:
        hf, model = _models(size, scan_layers=not args.unrolled)
        name = f"h{size['hidden_size']} L{size['num_hidden_layers']}"
        g, r = greedy(hf, model, prompts, args.repeats), rollout(model, prompts, args.repeats)
        greedy_rows.append(f"| {name} | {g['ours']:.0f} | {g['theirs']:.0f} | {g['ratio']:.2f}x | "
                           f"{g['compile_s']:.1f} | {g['same']} |")
        rollout_rows.append(f"| {name} | {r['whole']:.0f} | {r['micro']:.0f} | "
                            f"{r['micro'] / r['whole']:.2f} | {r['same']} |")
    print(f"\ngreedy, batch {BATCH}")
    print("| model | jaxrubric tok/s | transformers tok/s | speed-up | first call s "
          "| same tokens |")
    print("|---|---|---|---|---|---|")
    print("\n".join(greedy_rows))
    print(f"\nrollout, {BATCH} prompts x K = {SAMPLES}, temperature 1")
    print(f"| model | whole tok/s | {MICRO_BATCHES} micro-batches tok/s | ratio | same tokens |")
    print("|---|---|---|---|---|")
    print("\n".join(rollout_rows))


if __name__ == "__main__":
    main()
