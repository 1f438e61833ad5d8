"""Greedy decoding throughput: jaxrubric's sampler vs transformers `generate` (PyTorch, CPU).

Both run the same random Llama in fp32 with a KV cache: batch 8, 16-token prompts, 64 new
tokens (no stop token, so every row decodes all 64). Prints one table row per model size.

    python benchmarks/sampling.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import jax
import numpy as np
import torch
import transformers

import jaxrubric
from jaxrubric.sampling import generate

SIZES = [
    dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=8, intermediate_size=1024),
    dict(hidden_size=512, num_hidden_layers=8, num_attention_heads=8, intermediate_size=2048),
]
BATCH, PROMPT, NEW, VOCAB = 8, 16, 64, 8192


def _best_of(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def run(size: dict, repeats: int, scan_layers: bool) -> dict:
    config = transformers.LlamaConfig(vocab_size=VOCAB, num_key_value_heads=size[
        "num_attention_heads"], max_position_embeddings=256, **size)
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(config).eval()
    prompts = np.random.RandomState(0).randint(3, VOCAB, (BATCH, PROMPT))
    with tempfile.TemporaryDirectory() as tmp:
        hf.save_pretrained(tmp)
        model = jaxrubric.load_pretrained(Path(tmp), scan_layers=scan_layers)

    def ours():
        out = generate(model, prompts.tolist(), max_new_tokens=NEW, temperature=0.0,
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
    return dict(size=f"h{size['hidden_size']} L{size['num_hidden_layers']}",
                ours=tokens / t_ours, theirs=tokens / t_theirs, ratio=t_theirs / t_ours,
                compile_s=compile_s, same=same)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--unrolled", action="store_true", help="unrolled layers, not lax.scan")
    args = parser.parse_args()
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}, torch {torch.__version__} "
          f"({torch.get_num_threads()} threads); batch {BATCH}, prompt {PROMPT}, new {NEW}, "
          f"vocab {VOCAB}, fp32, greedy")
    print("| model | jaxrubric tok/s | transformers tok/s | speed-up | first call s | same tokens |")
    print("|---|---|---|---|---|---|")
    for size in SIZES:
        r = run(size, args.repeats, scan_layers=not args.unrolled)
        print(f"| {r['size']} | {r['ours']:.0f} | {r['theirs']:.0f} | {r['ratio']:.2f}x | "
              f"{r['compile_s']:.1f} | {r['same']} |")


if __name__ == "__main__":
    main()
