"""Where a DynamicRubric round spends its time: the round's stages, timed by prefixes.

The round is one compiled program, so its stages cannot be timed from the host. This script
compiles growing prefixes of the round as separate programs (policy sampling; + the generator's
rubrics; + verification and rewards, i.e. `methods.dynamic_rubric.rollout`; the whole round
with both GRPO updates) and reports each stage as the difference of consecutive prefixes, next
to its share of the model FLOPs (`jaxrubric.flops.round_flops_by_stage`). Prints a markdown table.

    python benchmarks/round_stages.py [--config configs/tiny_dynamic_rubric.py] [--repeats 5]
    python benchmarks/round_stages.py --config toy_world/runs/coevolve/config.json
"""

from __future__ import annotations

import argparse

import jax

from timing import best_time

from jaxrubric import flops, placement
from jaxrubric.config import load_config
from jaxrubric.methods import DYNAMIC_RUBRIC, core, dynamic_rubric
from jaxrubric.roles import ROLES
from jaxrubric.train import CoevolveTask


def prefixes(setup: core.RoundSetup):
    """The round's growing prefixes, built from its own stages, each returning something that
    depends on all its work."""
    run = placement.colocated(setup)

    def responses(state, frozen, batch, rng):
        return dynamic_rubric.respond_stage(setup, state.policy.params, batch.policy, rng)

    def rubrics(state, frozen, batch, rng):
        sampled, text_len = responses(state, frozen, batch, rng)
        return dynamic_rubric.write_stage(setup, state.generator.params, batch.question, sampled,
                                          text_len, rng)

    def rollout(state, frozen, batch, rng):
        return dynamic_rubric.rollout(setup, state, frozen, batch, rng, run)

    def whole(state, frozen, batch, rng):
        return dynamic_rubric.dynamic_rubric_round(setup, state, frozen, batch, rng, run)

    return {"policy samples": responses, "generator writes rubrics": rubrics,
            "verification + rewards": rollout, "GRPO updates (both roles)": whole}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/tiny_dynamic_rubric.py")
    parser.add_argument("--repeats", type=int, default=5)
    args, overrides = parser.parse_known_args()
    config = load_config(args.config, [o.removeprefix("--config.") for o in overrides])
    task = CoevolveTask(config)
    if task.method is not DYNAMIC_RUBRIC:
        raise SystemExit(f"round_stages times DynamicRubric's stages; {args.config} trains "
                         f"{task.method.name}")
    state = task.init_state(jax.random.key(0))
    batch, rng = task.batch(0), jax.random.key(1)
    cumulative, previous = {}, 0.0
    for name, fn in prefixes(task.setup).items():
        # The whole round donates nothing here: timing reruns it on the same state.
        total = best_time(jax.jit(fn), (state, task.frozen, batch, rng), args.repeats)
        cumulative[name], previous = total - previous, total
    dims = core.round_dims(task.setup, {"question": batch.question.tokens.shape,
                                        "policy": batch.policy.tokens.shape,
                                        "anchors": batch.anchors.tokens.shape})
    stage_flops = flops.round_flops_by_stage(
        {r: task.models[r].config for r in ROLES}, task.setup.config,
        task.method.round_shapes(task.setup.config, dims))
    assert sum(stage_flops.values()) == task.round_flops
    groups = {"policy samples": ("policy/sample",), "generator writes rubrics": ("generator/sample",),
              "verification + rewards": ("verifier/",),
              "GRPO updates (both roles)": ("/update", "/reference")}
    total_flops = sum(stage_flops.values())
    print(f"config {args.config}, {jax.device_count()} {jax.devices()[0].platform} device(s), "
          f"best of {args.repeats}\n")
    print("| stage | ms | share of time | share of model FLOPs |")
    print("|---|---:|---:|---:|")
    for name, seconds in cumulative.items():
        share = sum(v for k, v in stage_flops.items() if any(p in k for p in groups[name]))
        print(f"| {name} | {1e3 * seconds:.1f} | {seconds / previous:.0%} | "
              f"{share / total_flops:.0%} |")
    print(f"| whole round | {1e3 * previous:.1f} | 100% | 100% |")


if __name__ == "__main__":
    main()
