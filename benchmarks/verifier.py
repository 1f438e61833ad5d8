"""One-forward tree verification vs one forward per item: time and FLOPs.

A random Llama (hidden 256, 4 layers, 8 heads, vocab 8192, fp32, layers unrolled so XLA's cost
analysis counts every layer) judges K responses under G = 2 rubric groups of M = 4, 8, 16 items.
Each (prompt, response) prefix holds 304 tokens (a 256-token response, the prompt and the
verifier instructions), criteria 8..16 tokens (Li = 16), and the branch suffix 20 tokens (the
end of the verifier prompt and the assistant turn header, as a real chat template gives).
FLOPs come from the compiled programs' cost analysis (an analytic count where the backend
gives none). Prints a markdown table.

    python benchmarks/verifier.py [--repeats 3] [--batch 1] [--responses 2]
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

from timing import best_time

import jaxrubric
from jaxrubric.rubric import verifier as V

CONFIG = jaxrubric.ModelConfig(
    model_type="llama", vocab_size=8192, hidden_size=256, intermediate_size=1024, num_layers=4,
    num_heads=8, num_kv_heads=8, head_dim=32, max_position_embeddings=4096, scan_layers=False,
)
PREFIX, ITEM, SUFFIX, GROUPS = 304, 16, 20, 2
READOUT = V.VerifierReadout(suffix=tuple(range(100, 100 + SUFFIX)), yes_ids=(7, 8), no_ids=(9,))


def inputs(batch: int, responses: int, items: int, seed: int = 0) -> tuple[np.ndarray, ...]:
    rng = np.random.RandomState(seed)
    vocab = CONFIG.vocab_size
    prefix = rng.randint(3, vocab, (batch, responses, PREFIX))
    prefix_lengths = np.full((batch, responses), PREFIX)
    criteria = rng.randint(3, vocab, (batch, GROUPS, items, ITEM))
    item_lengths = rng.randint(ITEM // 2, ITEM + 1, (batch, GROUPS, items))
    valid = np.ones((batch, GROUPS, items), bool)
    return prefix, prefix_lengths, criteria, item_lengths, valid


def analytic_flops(rows: int, length: int, answers: int) -> float:
    """Matmul FLOPs of `rows` sequences of `length` tokens, dense attention, `answers` logits."""
    c = CONFIG
    per_token = 2 * c.hidden_size * (c.num_heads + 2 * c.num_kv_heads) * c.head_dim
    per_token += 2 * c.num_heads * c.head_dim * c.hidden_size
    per_token += 6 * c.hidden_size * c.intermediate_size
    attention = 4 * length * length * c.num_heads * c.head_dim
    return float(c.num_layers * rows * (length * per_token + attention)
                 + 2 * c.hidden_size * c.vocab_size * answers)


def compiled_flops(compiled) -> float | None:
    cost = compiled.cost_analysis()
    if isinstance(cost, (list, tuple)):
        cost = cost[0] if cost else None
    flops = (cost or {}).get("flops")
    return float(flops) if flops and flops > 0 else None


def run(model, batch: int, responses: int, items: int, repeats: int) -> dict:
    args = (model, READOUT, *(jnp.asarray(x) for x in inputs(batch, responses, items)))
    branches = GROUPS * items
    rows = batch * responses
    shapes = {
        "tree": (rows, PREFIX + branches * (ITEM + SUFFIX)),
        "per_item": (rows * branches, PREFIX + ITEM + SUFFIX),
    }
    out = {"M": items, "tree_len": shapes["tree"][1], "per_item_len": shapes["per_item"][1]}
    results = {}
    for name, fn in (("tree", V.verify), ("per_item", V.verify_per_item)):
        compiled = jax.jit(fn).lower(*args).compile()
        flops = compiled_flops(compiled)
        out[f"{name}_flops_source"] = "xla" if flops else "analytic"
        out[f"{name}_flops"] = flops or analytic_flops(*shapes[name], rows * branches)
        out[f"{name}_s"] = best_time(compiled, args, repeats)
        results[name] = np.asarray(compiled(*args).p_yes)
    out["max_dp"] = float(np.abs(results["tree"] - results["per_item"]).max())
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--responses", type=int, default=2)
    args = parser.parse_args()
    model = jaxrubric.init_model(CONFIG)
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}; Llama h{CONFIG.hidden_size} "
          f"L{CONFIG.num_layers} vocab {CONFIG.vocab_size} fp32; B={args.batch} K={args.responses} "
          f"G={GROUPS}, prefix {PREFIX}, Li={ITEM}, suffix {SUFFIX}; best of {args.repeats}")
    print("| M | tree len | per-item len x rows | tree ms | per-item ms | speed-up "
          "| tree GFLOP | per-item GFLOP | FLOP ratio | max abs dp_yes |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for items in (4, 8, 16):
        r = run(model, args.batch, args.responses, items, args.repeats)
        xla = r["tree_flops_source"] == r["per_item_flops_source"] == "xla"
        source = "" if xla else " (analytic)"
        print(f"| {r['M']} | {r['tree_len']} | {r['per_item_len']} x {GROUPS * items} "
              f"| {1e3 * r['tree_s']:.0f} | {1e3 * r['per_item_s']:.0f} "
              f"| {r['per_item_s'] / r['tree_s']:.1f}x | {r['tree_flops'] / 1e9:.1f} "
              f"| {r['per_item_flops'] / 1e9:.1f} "
              f"| {r['per_item_flops'] / r['tree_flops']:.1f}x{source} | {r['max_dp']:.1e} |",
              flush=True)


if __name__ == "__main__":
    main()
