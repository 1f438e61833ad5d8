"""Decoding throughput: jaxrubric's sampler vs transformers `generate` (PyTorch, CPU), and the
round's sampled rollout whole and micro-batched.

Both run the same random Llama in fp32 with a KV cache, 16-token prompts, 64 new tokens (no
stop token, so every row decodes all 64). Two tables, one row per model size:

1. greedy decoding of 8 prompts, jaxrubric against transformers;
2. the rollout as the round runs it (`sampling.sample` inside one jitted program): 8 prompts x
   K = 8 samples at temperature 1, the 64 rows at once and in 8 micro-batches of 8 rows
   (`round.rollout_micro_batches=8`, the recipes' setting). A row's noise is its own, so the
   micro-batched run draws each step's noise for 8 rows, not 64; the samples are the same;
3. the share of the matmul-only ceiling each sampler run of tables 1 and 2 reaches: its time
   per generated token beside `benchmarks/decode_matmul.py`'s decode loop of the same model's
   matmuls alone (no attention, norms or sampling) over as many rows per step, and the share
   (ceiling time / sampler time).

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

import decode_matmul  # benchmarks/ is on the path when run as `python benchmarks/NAME.py`
from timing import best_time, load_average, load_note

import jaxrubric
from jaxrubric import sampling
from jaxrubric.models.transformer import Decoder

SIZES = [
    dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=8, intermediate_size=1024),
    dict(hidden_size=512, num_hidden_layers=8, num_attention_heads=8, intermediate_size=2048),
]
BATCH, PROMPT, NEW, VOCAB = 8, 16, 64, 8192
SAMPLES, MICRO_BATCHES = 8, 8
assert (decode_matmul.VOCAB, decode_matmul.NEW_TOKENS) == (VOCAB, NEW)


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


def ceiling_rows(name: str, size: dict, runs: dict[str, tuple[int, float]],
                 repeats: int) -> list[str]:
    """Table 3's rows of one model: `runs` maps a sampler run to (rows per decode step, its
    tokens/s); each beside the matmul-only loop over as many rows (`decode_matmul`)."""
    ceiling = {}
    lines = []
    for run, (rows, tokens_s) in runs.items():
        if rows not in ceiling:
            ceiling[rows] = decode_matmul.matmul_only_seconds_per_token(
                size["hidden_size"], size["intermediate_size"], size["num_hidden_layers"], rows,
                repeats)
        sampler = 1 / tokens_s
        lines.append(f"| {name} | {run} | {rows} | {1e6 * sampler:.1f} | "
                     f"{1e6 * ceiling[rows]:.1f} | {ceiling[rows] / sampler:.0%} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--unrolled", action="store_true", help="unrolled layers, not lax.scan")
    args = parser.parse_args()
    load_before = load_average()
    prompts = np.random.RandomState(0).randint(3, VOCAB, (BATCH, PROMPT))
    greedy_rows, rollout_rows, ceiling_lines = [], [], []
    for size in SIZES:
        hf, model = _models(size, scan_layers=not args.unrolled)
        name = f"h{size['hidden_size']} L{size['num_hidden_layers']}"
        g, r = greedy(hf, model, prompts, args.repeats), rollout(model, prompts, args.repeats)
        greedy_rows.append(f"| {name} | {g['ours']:.0f} | {g['theirs']:.0f} | {g['ratio']:.2f}x | "
                           f"{g['compile_s']:.1f} | {g['same']} |")
        rollout_rows.append(f"| {name} | {r['whole']:.0f} | {r['micro']:.0f} | "
                            f"{r['micro'] / r['whole']:.2f} | {r['same']} |")
        ceiling_lines += ceiling_rows(name, size, {
            f"greedy, batch {BATCH}": (BATCH, g["ours"]),
            f"rollout T=1, {BATCH * SAMPLES} rows whole": (BATCH * SAMPLES, r["whole"]),
            f"rollout T=1, {MICRO_BATCHES} micro-batches": (BATCH * SAMPLES // MICRO_BATCHES,
                                                             r["micro"])}, args.repeats)
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}, torch {torch.__version__} "
          f"({torch.get_num_threads()} threads); prompt {PROMPT}, new {NEW}, vocab {VOCAB}, fp32, "
          f"jaxrubric layers {'unrolled' if args.unrolled else 'scanned'}; best of "
          f"{args.repeats}; {load_note(load_before)}")
    print(f"\ngreedy, batch {BATCH}")
    print("| model | jaxrubric tok/s | transformers tok/s | speed-up | first call s "
          "| same tokens |")
    print("|---|---|---|---|---|---|")
    print("\n".join(greedy_rows))
    print(f"\nrollout, {BATCH} prompts x K = {SAMPLES}, temperature 1")
    print(f"| model | whole tok/s | {MICRO_BATCHES} micro-batches tok/s | ratio | same tokens |")
    print("|---|---|---|---|---|")
    print("\n".join(rollout_rows))
    print("\nshare of the matmul-only ceiling (`benchmarks/decode_matmul.py`: the decode loop of "
          "the model's matmuls alone, weights [in, out], unrolled layers, as many rows per step); "
          "time per generated token; share = ceiling time / sampler time")
    print("| model | sampler run | rows per step | sampler µs/token | matmul-only µs/token "
          "| share of ceiling |")
    print("|---|---|---:|---:|---:|---:|")
    print("\n".join(ceiling_lines))


if __name__ == "__main__":
    main()
