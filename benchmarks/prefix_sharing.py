"""Shared prefixes against their unshared forms: the GRPO updates (`round.share_prefix`) and the
verifier's forward, model FLOPs (`jaxrubric/flops.py`) and wall time, at the 8B recipes'
proportions scaled to a CPU.

    python benchmarks/prefix_sharing.py [--repeats 3]

Update cases: the DynamicRubric generator update (a 2048-token prompt, the question and K
answers, under G = 4 rubrics of 128 tokens) and the policy update (a 256-token prompt under
K = 8 answers of 256 tokens), one AdamW step each on a tiny Qwen3 (hidden 256, 4 layers, 8
heads, 4 kv heads, vocabulary 8192, fp32), the same rows both ways.

Verifier: the same model judges 2 prompts x 2 responses (a 256-token prefix each) under
G x M = 2 x 16 = 32 items (8..16 tokens in 16 slots) and an 8-token suffix, three ways: two-part
(`verify`: each prefix once, each item a branch attending to it and to itself), the dense tree
it replaced (`rubric.dense_tree`: one row of 1024 tokens with an [L, L] mask) and one sequence
per item (`verify_per_item`). Its FLOPs are what each form computes (`verifier.analytic_flops`:
masked scores count, since they are computed), ratios against two-part.

Times are the best of `--repeats` after one compiling call; ratios come from one run, so a
busy box moves both sides.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from timing import best_time
from verifier import analytic_flops

import jaxrubric
from jaxrubric import flops
from jaxrubric.methods import update
from jaxrubric.methods.data import RoleState
from jaxrubric.methods.round_config import RoleConfig, RoundConfig
from jaxrubric.methods.setup import RoleSpec
from jaxrubric.rubric import dense_tree
from jaxrubric.rubric import verifier as V

CASES = {  # name -> (prompts, prompt tokens, samples per prompt, sample tokens)
    "generator update (G=4 rubrics)": (2, 2048, 4, 128),
    "policy update (K=8 answers)": (2, 256, 8, 256),
}
# The verifier: prompts, responses, prefix tokens, groups, items per group, item slots, suffix.
VERIFIER = (2, 2, 256, 2, 16, 16, 8)
FORMS = {"two-part": V.answer_logits, "dense tree": dense_tree.answer_logits,
         "per item": V.answer_logits_per_item}


def _model() -> jaxrubric.Decoder:
    cfg = jaxrubric.tiny_config("qwen3", vocab_size=8192, hidden_size=256, intermediate_size=768,
                                num_layers=4, num_heads=8, num_kv_heads=4, head_dim=32,
                                max_position_embeddings=4096)
    return jaxrubric.init_model(cfg, seed=0)


def _update(model, prompts: int, prompt_len: int, samples: int, length: int, shared: bool):
    """A jitted one-step GRPO update of `model` on random rows, and its arguments."""
    rng = np.random.default_rng(0)
    prompt = jnp.asarray(rng.integers(3, 8000, (prompts, prompt_len)), jnp.int32)
    prompt_mask = jnp.ones_like(prompt, bool)
    completion = jnp.asarray(rng.integers(3, 8000, (prompts, samples, length)), jnp.int32)
    mask = jnp.ones_like(completion, bool)
    old = jnp.full(completion.shape, -9.0, jnp.float32)
    advantages = jnp.asarray(rng.normal(size=(prompts, samples)), jnp.float32)
    inputs = (prompt, prompt_mask, completion, mask, old, advantages)
    if not shared:
        rows = lambda x: x.reshape(prompts * samples, *x.shape[2:])  # noqa: E731
        inputs = (jnp.repeat(prompt, samples, 0), jnp.repeat(prompt_mask, samples, 0),
                  *(rows(x) for x in inputs[2:]))
    graph, params = nnx.split(model, nnx.Param)
    opt = optax.adamw(1e-5)
    spec = RoleSpec(graph, opt, RoleConfig(beta=0.0), compiled_out=False)
    cfg = RoundConfig(logprob_chunk=128)
    step = jax.jit(lambda p, o: update.grpo_role_update(
        cfg, spec, RoleState(p, o), None, None, *inputs, jax.random.key(0))[0])
    return step, (params, opt.init(params))


def _verifier_inputs(vocab: int) -> tuple[jax.Array, ...]:
    """Random prefixes (all real), items of 8..16 tokens, and the suffix, as `VERIFIER` says."""
    batch, responses, prefix_len, groups, items, item_len, suffix = VERIFIER
    rng = np.random.default_rng(1)
    return (jnp.asarray(rng.integers(3, vocab, (batch, responses, prefix_len)), jnp.int32),
            jnp.full((batch, responses), prefix_len, jnp.int32),
            jnp.asarray(rng.integers(3, vocab, (batch, groups, items, item_len)), jnp.int32),
            jnp.asarray(rng.integers(item_len // 2, item_len + 1, (batch, groups, items)),
                        jnp.int32),
            jnp.asarray(rng.integers(3, vocab, suffix), jnp.int32))


def verifier_table(model: jaxrubric.Decoder, repeats: int) -> None:
    """Prints the verifier's three forms: time, computed FLOPs, ratios to two-part, and the
    largest p_yes difference from two-part."""
    batch, responses, prefix_len, groups, items, item_len, suffix = VERIFIER
    graph, params = nnx.split(model)
    inputs = _verifier_inputs(model.config.vocab_size)
    yes, no = (7, 8), (9,)
    times, counts, p_yes = {}, {}, {}
    for name, form in FORMS.items():
        step = jax.jit(lambda p, *xs, form=form: V.yes_probability(
            form(nnx.merge(graph, p), *xs), yes, no))
        times[name] = best_time(step, (params, *inputs), repeats)
        p_yes[name] = np.asarray(step(params, *inputs))
        counts[name] = analytic_flops(model.config, name, batch * responses, prefix_len,
                                      groups * items, item_len + suffix)
    print(f"\nverifier: {batch * responses} (prompt, response) rows, prefix {prefix_len}, "
          f"{groups * items} items in {item_len} slots, suffix {suffix}")
    print(f"{'form':<14}{'s':>8}{'GFLOP':>9}{'time ratio':>12}{'FLOP ratio':>12}"
          f"{'max |dp_yes|':>14}")
    for name in FORMS:
        print(f"{name:<14}{times[name]:>8.3f}{counts[name] / 1e9:>9.2f}"
              f"{times[name] / times['two-part']:>11.2f}x"
              f"{counts[name] / counts['two-part']:>11.2f}x"
              f"{np.abs(p_yes[name] - p_yes['two-part']).max():>14.1e}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    model = _model()
    print(f"device: {jax.devices()[0].device_kind}, jax {jax.__version__}")
    print(f"{'case':<32}{'unshared s':>12}{'shared s':>10}{'time ratio':>12}{'FLOP ratio':>12}")
    for name, (b, p, s, n) in CASES.items():
        times = {}
        for shared in (False, True):
            step, step_args = _update(model, b, p, s, n, shared)
            times[shared] = best_time(step, step_args, args.repeats)
        unshared = flops.teacher_forced_flops(model.config, rows=b * s, prompt_len=p,
                                              completion_len=n)
        shared_flops = flops.shared_teacher_forced_flops(model.config, prompts=b, prompt_len=p,
                                                         samples=s, completion_len=n)
        print(f"{name:<32}{times[False]:>12.3f}{times[True]:>10.3f}"
              f"{times[False] / times[True]:>11.2f}x{unshared / shared_flops:>11.2f}x")
    verifier_table(model, args.repeats)


if __name__ == "__main__":
    main()
