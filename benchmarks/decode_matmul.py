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


def matmul_only_seconds_per_token(hidden: int, mlp: int, layers: int, rows: int,
                                  repeats: int, out_in: bool = False) -> float:
    """Best seconds per generated token (one row, one step) of `matmul_only_decode`: the
    ceiling on a sampler's per-token time for this model and batch of `rows`."""
    loop, loop_args = matmul_only_decode(hidden, mlp, layers, rows, out_in)
    return best_time(loop, loop_args, repeats) / (rows * NEW_TOKENS)


def layouts_table(rows: int, repeats: int) -> list[str]:
    """Table 1: weight GB/s of one `rows`-row matmul per layout, and of a plain reduction."""
    rng = np.random.default_rng(0)
    layouts = {
        "x @ W (W [K, N])": (jax.jit(lambda x, w: x @ w), False),
        "x @ W.T (W [N, K])": (jax.jit(lambda x, w: jnp.einsum("mk,nk->mn", x, w)), True),
        "(W @ x.T).T (W [N, K])": (jax.jit(lambda x, w: (w @ x.T).T), True),
    }
    read = jax.jit(lambda w: w.sum())
    lines = ["| K x N | MB | " + " | ".join(layouts) + " | reduction (memory) |",
             "|---|---:|" + "---:|" * (len(layouts) + 1)]
    for k, n in SHAPES:
        x = jnp.asarray(rng.normal(size=(rows, k)), jnp.float32)
        w = jnp.asarray(rng.normal(size=(k, n)), jnp.float32)
        wt = jnp.asarray(np.asarray(w).T.copy())
        cells = []
        for fn, transposed in layouts.values():
            seconds = best_time(fn, (x, wt if transposed else w), repeats)
            cells.append(f"{w.nbytes / seconds / 1e9:.1f}")
        cells.append(f"{w.nbytes / best_time(read, (w,), repeats) / 1e9:.1f}")
        lines.append(f"| {k} x {n} | {w.nbytes / 1e6:.1f} | " + " | ".join(cells) + " |")
    return lines


def ceiling_table(rows: int, repeats: int, models=MODELS) -> list[str]:
    """Table 2: matmul-only decode tokens/s of `models` in both weight layouts."""
    lines = ["| model | weights [in, out] (jaxrubric) | weights [out, in] (PyTorch's layout) |",
             "|---|---:|---:|"]
    for hidden, mlp, layers in models:
        seconds = [matmul_only_seconds_per_token(hidden, mlp, layers, rows, repeats, out_in)
                   for out_in in (False, True)]
        cells = [f"{1 / s:.0f}" for s in seconds]
        lines.append(f"| hidden {hidden}, {layers} layers | " + " | ".join(cells) + " |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    print(f"{jax.devices()[0].platform}, {args.rows} rows, fp32, best of {args.repeats}; "
          "GB/s of weights\n")
    print("\n".join(layouts_table(args.rows, args.repeats)))
    print(f"\nmatmul-only decode of the sampling benchmark's models, {NEW_TOKENS} tokens: "
          "tokens/s\n")
    print("\n".join(ceiling_table(args.rows, max(1, args.repeats // 5))))


if __name__ == "__main__":
    main()
