"""Shared-prefix verification (`verify`: each prefix encoded once, its items as branches) vs one
forward per item: time and FLOPs (the dense tree it replaced: `benchmarks/prefix_sharing.py`).

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
from jaxrubric import flops
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


def analytic_flops(cfg: jaxrubric.ModelConfig, form: str, rows: int, prefix: int,
                   branches: int, branch: int) -> float:
    """FLOPs a verifier form computes (`flops.forward_flops`, every attention square whole,
    masked or not, as XLA counts it) for `rows` (prompt, response) pairs under `branches`
    items of `branch` slots (the item and the suffix); one answer per item projected.

    `two-part` (`verify`): each prefix once over itself, each branch over the prefix and its
    own slots; `dense tree` (`rubric.dense_tree`): one row of the prefix and every branch, its
    whole square; `per item` (`verify_per_item`): one sequence of prefix and branch per item.
    """
    answers, row = rows * branches, prefix + branches * branch
    if form == "two-part":
        tokens, pairs = rows * row, rows * (prefix**2 + branches * branch * (prefix + branch))
    elif form == "dense tree":
        tokens, pairs = rows * row, rows * row**2
    else:
        tokens, pairs = answers * (prefix + branch), answers * (prefix + branch) ** 2
    return flops.forward_flops(cfg, tokens=tokens, attention_pairs=pairs, logit_tokens=answers)


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
    out = {"M": items, "tree_len": PREFIX + branches * (ITEM + SUFFIX),
           "per_item_len": PREFIX + ITEM + SUFFIX}
    results = {}
    for name, fn, form in (("tree", V.verify, "two-part"),
                           ("per_item", V.verify_per_item, "per item")):
        compiled = jax.jit(fn).lower(*args).compile()
        count = compiled_flops(compiled)
        out[f"{name}_flops_source"] = "xla" if count else "analytic"
        out[f"{name}_flops"] = count or analytic_flops(CONFIG, form, rows, PREFIX, branches,
                                                       ITEM + SUFFIX)
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
    print("| M | shared tokens | per-item len x rows | shared ms | per-item ms | speed-up "
          "| shared GFLOP | per-item GFLOP | FLOP ratio | max abs dp_yes |")
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
