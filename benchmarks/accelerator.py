"""One table for whatever accelerator JAX sees: decode speed, MFU of the policy's GRPO update
and of the verifier's tree forward, and one DynamicRubric round's time by stage.

A random Qwen3-shaped model (default `--size 0.6b`: Qwen/Qwen3-0.6B's shape from
`jaxrubric.plan.models.KNOWN_ARCHITECTURES`, bf16 weights and compute) on one device, over the
shipped tiny tokenizer (the model's vocabulary is larger; ids past the tokenizer's are only
ids). Rows:

- **decode**: `jaxrubric.sampling.sample`, P prompts x K samples, a fixed number of new tokens
  (no stop token), tokens/s over the whole call (prefill included). Its ceiling beside it:
  reading every weight once per decode step, measured here, and the HBM roofline of the chip
  (`jaxrubric.mfu.hbm_bandwidth`). `benchmarks/decode_matmul.py`'s matmul-only loop is fixed
  to its own Llamas (fp32, vocabulary 8192, square attention projections), so it gives no
  ceiling for this shape;
- **policy GRPO update**: `methods.update.role_update` on the decode rows (prompt + sampled
  completion, random advantages; each prompt encoded once under its samples, the default
  `round.share_prefix`), beta > 0 so a reference forward runs, one AdamW step; model FLOPs
  `3 x flops.shared_teacher_forced_flops` (+ 1x for the reference forward);
- **verifier**: one tree forward (`rubric.verifier.verify`), FLOPs `flops.tree_verify_flops`;
- **round stages**: `benchmarks/round_stages.py`'s growing prefixes of the round, each stage
  the difference of consecutive prefixes; the whole round's MFU from `flops.round_flops`.
  The same model serves as policy, generator and verifier (one copy of the weights).

MFU is against the device's dense bf16 peak (`jaxrubric.mfu.peak_flops`); n/a where the peak
is unknown (CPU). Times are the best of `--repeats` calls after the first one, which compiles
and is reported apart ("first call s").

    python benchmarks/accelerator.py [--size tiny|small|0.6b] [--dtype bfloat16] [--repeats 3]
        [--hidden 1024 --layers 28 ...] [--out table.md]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
import round_stages  # benchmarks/ is on the path when run as `python benchmarks/NAME.py`
from flax import nnx

import jaxrubric
from jaxrubric import flops, mfu, sampling
from jaxrubric import sharding as shd
from jaxrubric.methods import DYNAMIC_RUBRIC
from jaxrubric.methods.batches import encode_batch
from jaxrubric.methods.data import Frozen, RoundState
from jaxrubric.methods.dynamic_rubric import DynamicRubricConfig
from jaxrubric.methods.round_config import RoleConfig
from jaxrubric.methods.setup import init_state
from jaxrubric.methods.keys import RoundKey, update_keys
from jaxrubric.methods.update import role_update
from jaxrubric.plan.models import KNOWN_ARCHITECTURES
from jaxrubric.roles import ROLES, TRAINED, Role
from jaxrubric.rubric import verifier as V

ROOT = Path(__file__).resolve().parents[1]
TOKENIZER = ROOT / "configs" / "assets" / "tiny_tokenizer"
QUESTIONS = ["Sort the digits 6 6 0 4 in ascending order.", "Reverse the word hgeh.",
             "Sort the digits 5 9 3 8 in ascending order.", "Reverse the word cat."]
ANCHORS = [["0 4 6 6", "0 6 4 6", "6 6 4 0"], ["hegh", "hehg", "hgeh"],
           ["3 5 8 9", "3 8 5 9", "9 8 5 3"], ["tac", "act", "cat"]]


class Work(NamedTuple):
    """The shapes each row measures."""

    prompts: int  # decode and update: P prompts ...
    samples: int  # ... x K samples
    prompt_len: int
    new_tokens: int  # decode length = the update's completion length
    verifier_prompts: int  # verifier: B prompts x K responses, one tree row each
    verifier_responses: int
    verifier_prefix: int
    groups: int  # G rubric groups of M items of Li tokens
    items: int
    item_tokens: int
    round_batch: int  # round: B prompts, K responses of `response_tokens`, G rubrics
    round_responses: int
    round_rubrics: int
    response_tokens: int
    round_items: int
    round_item_tokens: int
    question_tokens: int  # the round batch's widths (padding counted)
    policy_tokens: int
    anchor_tokens: int


SIZES: dict[str, tuple[dict[str, Any], Work]] = {
    # 0.2M parameters over the tokenizer's own vocabulary: the CPU test's size.
    "tiny": (dict(vocab_size=1, hidden_size=64, intermediate_size=128, num_layers=2,
                  num_heads=4, num_kv_heads=2, head_dim=32, tie_word_embeddings=True),
             Work(2, 2, 16, 8, 1, 2, 48, 2, 2, 6, 2, 2, 2, 8, 2, 6, 24, 40, 12)),
    # The tiny Qwen3 of the peer table (`benchmarks/peer_grpo.py`, docs/performance.md).
    "small": (dict(vocab_size=8192, hidden_size=256, intermediate_size=1024, num_layers=4,
                   num_heads=8, num_kv_heads=4, head_dim=32, tie_word_embeddings=True),
              Work(8, 8, 16, 64, 1, 8, 304, 2, 8, 16, 4, 4, 2, 32, 4, 8, 24, 40, 12)),
    # Qwen3-0.6B's shape (its architecture table), workloads at a short recipe's proportions;
    # the recipes' recomputed layers and attention blocks (`jaxrubric.config`): without remat
    # the update's 64 x 512 tokens keep ~200 GB of activations (XLA:CPU's buffer assignment).
    "0.6b": (dict(remat="full", attention_chunk=128),
             Work(8, 8, 256, 256, 2, 8, 768, 4, 8, 32, 4, 8, 4, 128, 8, 16, 128, 160, 32)),
}
# Flags that override the size's model fields (their names in `ModelConfig`).
DIMS = {"vocab": "vocab_size", "hidden": "hidden_size", "mlp": "intermediate_size",
        "layers": "num_layers", "heads": "num_heads", "kv_heads": "num_kv_heads",
        "head_dim": "head_dim", "remat": "remat", "attention_chunk": "attention_chunk"}


def model_config(size: str, tokenizer: Any, dtype: str, param_dtype: str,
                 dims: dict[str, Any]) -> jaxrubric.ModelConfig:
    """The size's Qwen3 shape with the explicit `dims` over it, the tokenizer's eos / pad ids
    and a vocabulary at least the tokenizer's."""
    fields, _ = SIZES[size]
    ids = dict(eos_token_ids=(tokenizer.eos_token_id,), pad_token_id=tokenizer.pad_token_id,
               bos_token_id=None, dtype=dtype, param_dtype=param_dtype)
    if size == "0.6b":
        cfg = jaxrubric.ModelConfig.from_hf_dict(KNOWN_ARCHITECTURES["Qwen/Qwen3-0.6B"],
                                                 **fields, **ids)
    else:
        cfg = jaxrubric.tiny_config("qwen3", max_position_embeddings=8192,
                                    rope=jaxrubric.RopeConfig(theta=1e6), **fields, **ids)
    cfg = cfg.replace(**{DIMS[k]: v for k, v in dims.items() if v is not None})
    return cfg.replace(vocab_size=max(cfg.vocab_size, len(tokenizer)))


# ------------------------------------------------------------------------------ timing
class Timing(NamedTuple):
    first_s: float  # the first call: compilation and one run
    best_s: float  # the best of the timed calls after it


def timed(fn, args, repeats: int) -> Timing:
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    first = time.perf_counter() - start
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return Timing(first, min(times))


@dataclasses.dataclass
class Row:
    name: str
    work: str
    timing: Timing
    tokens: float | None = None  # tokens produced or processed, for tokens/s
    flops: float | None = None  # model FLOPs of one call
    note: str = ""


def progress(rows: list[Row]) -> None:
    """Each row as it is measured, on stderr (the table comes at the end)."""
    for r in rows:
        print(f"measured {r.name}: first call {r.timing.first_s:.1f} s, "
              f"{1e3 * r.timing.best_s:.2f} ms", file=sys.stderr, flush=True)


def fmt(x: float | None, spec: str) -> str:
    return "n/a" if x is None else format(x, spec)


def table(rows: list[Row], device_kind: str) -> list[str]:
    lines = ["| row | work | first call s | ms | tokens/s | model TFLOP/s | MFU | note |",
             "|---|---|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        s = r.timing.best_s
        utilisation = None if r.flops is None else mfu.mfu(r.flops, s, 1, device_kind)
        lines.append(
            f"| {r.name} | {r.work} | {r.timing.first_s:.2f} | {1e3 * s:.2f} "
            f"| {fmt(None if r.tokens is None else r.tokens / s, '.0f')} "
            f"| {fmt(None if r.flops is None else r.flops / s / 1e12, '.4f')} "
            f"| {fmt(None if utilisation is None else 100 * utilisation, '.1f')}"
            f"{'' if utilisation is None else '%'} | {r.note} |")
    return lines


# ------------------------------------------------------------------------------ the rows
def decode_rows(model, work: Work, repeats: int, device_kind: str, key) -> tuple[list[Row], Any]:
    """The sampler's decode speed and the weight-reading ceiling beside it; returns the
    samples too (the update's batch)."""
    cfg, graph = model.config, nnx.graphdef(model)
    params = nnx.state(model, nnx.Param)
    p, k, n = work.prompts, work.samples, work.new_tokens
    tokens = jax.random.randint(key, (p, work.prompt_len), 3, cfg.vocab_size)
    mask = jnp.ones((p, work.prompt_len), bool)
    lengths = jnp.full((p,), work.prompt_len, jnp.int32)

    @jax.jit
    def run(params, tokens, mask, lengths, rng):
        return sampling.sample(nnx.merge(graph, params), tokens, mask, lengths, rng,
                               num_samples=k, max_new_tokens=n, temperature=1.0)

    args = (params, tokens, mask, lengths, jax.random.key(1))
    decode = Row("decode (`sampling.sample`)", f"{p} prompts x K={k}, prompt {work.prompt_len},"
                 f" {n} new", timed(run, args, repeats), tokens=p * k * n,
                 flops=flops.sampling_flops(cfg, prompts=p, prompt_len=work.prompt_len,
                                            samples=k, new_tokens=n))
    # A decode step reads every weight once for its P*K rows: that read alone bounds it.
    weight_bytes = sum(x.nbytes for x in jax.tree.leaves(params))
    read = jax.jit(lambda params: sum(jnp.sum(x, dtype=jnp.float32)
                                      for x in jax.tree.leaves(params)))
    read_time = timed(read, (params,), repeats)
    bandwidth = mfu.hbm_bandwidth(device_kind)
    roofline = None if bandwidth is None else p * k * bandwidth / weight_bytes
    ceiling = Row("decode ceiling: every weight read once per step",
                  f"{weight_bytes / 1e6:.1f} MB of weights, {p * k} rows per step", read_time,
                  tokens=p * k,
                  note=f"HBM roofline {fmt(roofline, '.0f')} tok/s; decode_matmul.py: no "
                  "ceiling for this shape")
    return [decode, ceiling], (tokens, mask, run(*args))


def update_row(setup, state: RoundState, frozen: Frozen, decoded, work: Work,
               cfg, repeats: int) -> Row:
    """The policy's GRPO update on the decode rows (each prompt under its K samples)."""
    p, k = work.prompts, work.samples
    prompt, mask, samples = decoded
    advantages = jax.random.normal(jax.random.key(3), (p, k))
    update = jax.jit(lambda s, ref, *xs: role_update(Role.POLICY, setup, s, None, ref, *xs))
    args = (state.policy, frozen.policy_ref, prompt, mask, samples, advantages,
            update_keys(RoundKey(jax.random.key(4)))[Role.POLICY])
    if setup.config.share_prefix:  # each prompt encoded once under its K samples
        forward = flops.shared_teacher_forced_flops(
            cfg, prompts=p, prompt_len=work.prompt_len, samples=k,
            completion_len=work.new_tokens)
        tokens = p * (work.prompt_len + k * work.new_tokens)
    else:
        forward = flops.teacher_forced_flops(cfg, rows=p * k, prompt_len=work.prompt_len,
                                             completion_len=work.new_tokens)
        tokens = p * k * (work.prompt_len + work.new_tokens)
    passes = 3 * setup.config.num_updates + (setup.config.policy.beta > 0)
    shared = ", prompts shared" if setup.config.share_prefix else ""
    return Row("policy GRPO update (`role_update`)", f"{p * k} rows, prompt "
               f"{work.prompt_len} + completion {work.new_tokens}{shared}, beta "
               f"{setup.config.policy.beta}, {setup.config.num_updates} AdamW step",
               timed(update, args, repeats), tokens=tokens,
               flops=passes * forward, note="3x forward + the reference forward")


def verifier_row(model, readout: V.VerifierReadout, work: Work, repeats: int) -> Row:
    """One tree forward of the verifier over random prefixes and criteria."""
    cfg, graph = model.config, nnx.graphdef(model)
    b, k = work.verifier_prompts, work.verifier_responses
    g, m, li, lp = work.groups, work.items, work.item_tokens, work.verifier_prefix
    keys = jax.random.split(jax.random.key(5), 3)
    inputs = (jax.random.randint(keys[0], (b, k, lp), 3, cfg.vocab_size),
              jnp.full((b, k), lp, jnp.int32),
              jax.random.randint(keys[1], (b, g, m, li), 3, cfg.vocab_size),
              jax.random.randint(keys[2], (b, g, m), li // 2, li + 1),
              jnp.ones((b, g, m), bool))
    verify = jax.jit(lambda params, *xs: V.verify(nnx.merge(graph, params), readout, *xs).p_yes)
    branch = li + len(readout.suffix)
    return Row("verifier tree forward (`verify`)", f"{b * k} rows, prefix {lp} + {g * m} "
               f"branches of {branch}", timed(verify, (nnx.state(model, nnx.Param), *inputs),
                                               repeats),
               tokens=b * k * (lp + g * m * branch),
               flops=flops.tree_verify_flops(cfg, rows=b * k, prefix_len=lp, branches=g * m,
                                             branch_len=branch,
                                             readout_tokens=len(readout.token_ids)))


def round_rows(setup, models, state, frozen, batch, repeats: int) -> list[Row]:
    """`round_stages.prefixes`, each stage the difference of consecutive prefixes (its first
    call: that prefix's); the whole round last (the last prefix), with its model FLOPs."""
    rng, rows, previous = jax.random.key(6), [], Timing(0.0, 0.0)
    for name, fn in round_stages.prefixes(setup).items():
        # No donation: each prefix reruns on the same state.
        total = timed(jax.jit(fn), (state, frozen, batch, rng), repeats)
        rows.append(Row(f"round: {name}", "this prefix of the round minus the one before",
                        Timing(total.first_s, total.best_s - previous.best_s)))
        previous = total
    round_flops = flops.round_flops({r: models[r].config for r in ROLES}, setup.config,
                                    DYNAMIC_RUBRIC.round_shapes(setup, state, frozen, batch, rng))
    c = setup.config
    rows.append(Row("round: whole round", f"B={batch.question.tokens.shape[0]}, "
                    f"K={c.num_responses}, G={c.num_rubrics}, {c.response_tokens} response "
                    f"tokens, rubrics of {setup.grammar.max_rubric_tokens}", previous,
                    flops=round_flops))
    return rows


def build_round(cfg, tokenizer, mesh, work: Work):
    """One model in every role (sharded on `mesh`), the DynamicRubric setup, state, frozen
    weights (the verifier and both KL references are that model's weights) and a batch."""
    model = shd.shard_model(jaxrubric.init_model(cfg, seed=0), mesh)
    models = dict.fromkeys(ROLES, model)
    config = DynamicRubricConfig(num_responses=work.round_responses, num_rubrics=work.round_rubrics,
                                 response_tokens=work.response_tokens,
                                 logprob_chunk=min(64, work.new_tokens),
                                 policy=RoleConfig(beta=0.04), generator=RoleConfig(beta=0.04))
    setup = DYNAMIC_RUBRIC.build_setup(
        config, tokenizer, models, optimizers={r: optax.adamw(1e-6) for r in TRAINED},
        max_items=work.round_items, max_item_tokens=work.round_item_tokens)
    params = nnx.state(model, nnx.Param)
    frozen = Frozen(verifier=params, policy_ref=params, generator_ref=params)
    b = work.round_batch
    host = encode_batch(
        tokenizer, [QUESTIONS[i % len(QUESTIONS)] for i in range(b)],
        [ANCHORS[i % len(ANCHORS)] for i in range(b)], prompt_tokens=work.question_tokens,
        policy_tokens=work.policy_tokens, anchor_tokens=work.anchor_tokens,
        num_anchors=max(map(len, ANCHORS)))
    batch = jax.tree.map(lambda v: jax.device_put(v, shd.batch_sharding(mesh, v.ndim)), host)
    return model, models, setup, init_state(setup, models), frozen, batch


def main(argv: list[str] | None = None) -> list[str]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="0.6b")
    parser.add_argument("--dtype", default="bfloat16", help="compute dtype")
    parser.add_argument("--param-dtype", default=None, help="weights' dtype (default: --dtype)")
    parser.add_argument("--repeats", "--steps", type=int, default=3,
                        help="timed calls after the first")
    for flag in DIMS:
        parser.add_argument(f"--{flag.replace('_', '-')}", default=None,
                            type=str if flag == "remat" else int,
                            help=f"override the size's {DIMS[flag]}")
    parser.add_argument("--out", type=Path, default=None, help="also write the table here")
    args = parser.parse_args(argv)
    tokenizer = jaxrubric.load_tokenizer(str(TOKENIZER))
    cfg = model_config(args.size, tokenizer, args.dtype, args.param_dtype or args.dtype,
                       {k: getattr(args, k) for k in DIMS})
    work = SIZES[args.size][1]
    device = jax.devices()[0]
    mesh = shd.single_device_mesh(device)
    peak = mfu.peak_flops(device.device_kind)
    start = time.perf_counter()
    model, models, setup, state, frozen, batch = build_round(cfg, tokenizer, mesh, work)
    n_params = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    rows, decoded = decode_rows(model, work, args.repeats, device.device_kind,
                                jax.random.key(0))
    progress(rows)
    rows.append(update_row(setup, state, frozen, decoded, work, cfg, args.repeats))
    progress(rows[-1:])
    rows.append(verifier_row(model, setup.readout, work, args.repeats))
    progress(rows[-1:])
    rows += round_rows(setup, models, state, frozen, batch, args.repeats)
    progress(rows[4:])
    header = [
        f"device: {device.device_kind} ({device.platform}, 1 of {jax.device_count()} devices; "
        f"bf16 peak {fmt(None if peak is None else peak / 1e12, '.0f')} TFLOP/s), "
        f"jax {jax.__version__}",
        f"model: random Qwen3 ({args.size}) {n_params / 1e6:.1f}M parameters, hidden "
        f"{cfg.hidden_size}, {cfg.num_layers} layers, {cfg.num_heads} heads / "
        f"{cfg.num_kv_heads} kv of {cfg.head_dim}, MLP {cfg.intermediate_size}, vocab "
        f"{cfg.vocab_size}; {cfg.dtype} compute, {cfg.param_dtype} weights, remat {cfg.remat}, "
        f"attention chunk {cfg.attention_chunk}",
        f"times: best of {args.repeats} calls after the first (compile + run: 'first call s'); "
        f"whole script {time.perf_counter() - start:.0f} s", ""]
    lines = header + table(rows, device.device_kind)
    print("\n".join(lines), flush=True)
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")
    return lines


if __name__ == "__main__":
    main()
