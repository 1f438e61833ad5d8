"""How fast XLA streams weights through the matmuls of batched decoding, against how fast it
reads memory at all: the bound on `benchmarks/sampling.py`'s larger model.

A decode step multiplies `[rows, K]` activations by every `[K, N]` weight matrix, so a step
reads all the weights once. With few rows that is a memory-bound product; this prints the
weight bytes per second XLA reaches for the decode shapes of the sampling benchmark's Llama
(hidden 512, MLP 1376, vocab 8192) in three layouts, beside a plain reduction over the same
bytes (what the memory can give). Prints a markdown table.

    python benchmarks/decode_matmul.py [--rows 8] [--repeats 20]
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

from timing import best_time

# (K, N): attention and MLP projections, the vocabulary projection, and one large matrix
SHAPES = ((512, 512), (512, 1376), (1376, 512), (512, 8192), (4096, 10240))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    layouts = {
        "x @ W (W [K, N])": (jax.jit(lambda x, w: x @ w), False),
        "x @ W.T (W [N, K])": (jax.jit(lambda x, w: jnp.einsum("mk,nk->mn", x, w)), True),
        "(W @ x.T).T (W [N, K])": (jax.jit(lambda x, w: (w @ x.T).T), True),
    }
    read = jax.jit(lambda w: w.sum())
    print(f"{jax.devices()[0].platform}, {args.rows} rows, fp32, best of {args.repeats}; "
          "GB/s of weights\n")
    print("| K x N | MB | " + " | ".join(layouts) + " | reduction (memory) |")
    print("|---|---:|" + "---:|" * (len(layouts) + 1))
    for k, n in SHAPES:
        x = jnp.asarray(rng.normal(size=(args.rows, k)), jnp.float32)
        w = jnp.asarray(rng.normal(size=(k, n)), jnp.float32)
        wt = jnp.asarray(np.asarray(w).T.copy())
        cells = []
        for fn, transposed in layouts.values():
            seconds = best_time(fn, (x, wt if transposed else w), args.repeats)
            cells.append(f"{w.nbytes / seconds / 1e9:.1f}")
        cells.append(f"{w.nbytes / best_time(read, (w,), args.repeats) / 1e9:.1f}")
        print(f"| {k} x {n} | {w.nbytes / 1e6:.1f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
