"""How fast XLA streams weights through the matmuls of batched decoding: the ceiling on
`benchmarks/sampling.py`'s decode speed.

A decode step multiplies `[rows, K]` activations by every `[K, N]` weight matrix, so a step
reads all the weights once. With few rows that is a memory-bound product. Two tables:

1. weight bytes per second of one 8-row matmul in three layouts, beside a plain reduction
   over the same bytes (what the memory gives);
2. the ceiling of the sampling benchmark's Llamas: a decode loop of their matmuls alone (no
   attention, norms or sampling), with weights stored [in, out] as jaxrubric stores them and
   [out, in] as PyTorch does, in tokens per second.

    python benchmarks/decode_matmul.py [--rows 8] [--repeats 20]
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

from timing import best_time

# (K, N): attention and MLP projections, the vocabulary projection, and one large matrix
SHAPES = ((512, 512), (512, 2048), (2048, 512), (512, 8192), (4096, 10240))
# benchmarks/sampling.py's models: (hidden, MLP width, layers); vocabulary 8192, 64 new tokens
MODELS = ((256, 1024, 4), (512, 2048, 8))
VOCAB, NEW_TOKENS = 8192, 64


def matmul_only_decode(hidden: int, mlp: int, layers: int, rows: int, out_in: bool):
    """A jitted loop of NEW_TOKENS steps through a model's matmuls (q, k, v, o, gate, up, down
    per layer, then the vocabulary projection) and its weights, stored [out, in] or not."""
    rng = np.random.default_rng(0)
    shapes = [(hidden, hidden)] * 4 + [(hidden, mlp), (hidden, mlp), (mlp, hidden)]

    def weight(k, n):
        return jnp.asarray(rng.normal(size=(n, k) if out_in else (k, n)) * 0.02, jnp.float32)

    weights = [[weight(*s) for s in shapes] for _ in range(layers)], weight(hidden, VOCAB)

    def mm(x, w):
        return jnp.einsum("mk,nk->mn", x, w) if out_in else x @ w

    @jax.jit
    def loop(x, weights):
        blocks, head = weights

        def step(_, x):
            for q, k, v, o, gate, up, down in blocks:
                x = x + mm(mm(x, q) + mm(x, k) + mm(x, v), o)
                x = x + mm(jax.nn.silu(mm(x, gate)) * mm(x, up), down)
                x = x / (1 + jnp.abs(x).mean())  # keeps values bounded over the steps
            return x + 1e-3 * mm(x, head)[:, :hidden]

        return jax.lax.fori_loop(0, NEW_TOKENS, step, x)

    return loop, (jnp.ones((rows, hidden), jnp.float32), weights)


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
    print(f"\nmatmul-only decode of the sampling benchmark's models, {NEW_TOKENS} tokens: "
          "tokens/s\n")
    print("| model | weights [in, out] (jaxrubric) | weights [out, in] (PyTorch's layout) |")
    print("|---|---:|---:|")
    for hidden, mlp, layers in MODELS:
        cells = []
        for out_in in (False, True):
            loop, loop_args = matmul_only_decode(hidden, mlp, layers, args.rows, out_in)
            seconds = best_time(loop, loop_args, max(1, args.repeats // 5))
            cells.append(f"{args.rows * NEW_TOKENS / seconds:.0f}")
        print(f"| hidden {hidden}, {layers} layers | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
