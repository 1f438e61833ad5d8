"""Where a DynamicRubric round spends its time: the round's stages, timed by prefixes.

The round is one compiled program, so its stages cannot be timed from the host. This script
compiles growing prefixes of the round as separate programs (policy sampling; + the generator's
rubrics; + verification and rewards, i.e. `methods.dynamic_rubric.rollout`; the whole round
with both GRPO updates) and reports each stage as the difference of consecutive prefixes, next
to its share of the model FLOPs (`jaxrubric.flops.round_flops_by_stage`).

A second table compares the round as `jaxrubric train` runs it, one compiled program
(`methods.programs.make_round_step`), with the same stages run as programs of their own: the
sub-mesh placement (`placement.SubMeshes`, one program per stage) with every role on the
whole mesh. Both donate the state, as in training; every timed round starts from a copy of the same
state (so every round is the same work), and the two forms alternate (A, B, A, B, ...) so
that load on a shared box hits both alike. Both also compute one round from the same state,
batch and key; the line under the table says whether they agree (metrics, outputs, updates).
A third compares the round with its telemetry (`rewards.telemetry`, the `telemetry/*` scalars
computed in the program) against the same round without it, alternating likewise.
Prints markdown tables (`--only` one of them).

    python benchmarks/round_stages.py [--config configs/tiny_dynamic_rubric.py] [--repeats 5]
    python benchmarks/round_stages.py --config toy_world/runs/coevolve/config.json
    python benchmarks/round_stages.py --only programs --repeats 3
    python benchmarks/round_stages.py --only telemetry --repeats 20
"""

from __future__ import annotations

import argparse
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from timing import best_time, load_average, load_note

from jaxrubric import flops, placement
from jaxrubric.config import load_config
from jaxrubric.methods import DYNAMIC_RUBRIC, dynamic_rubric
from jaxrubric.methods.data import RoundState
from jaxrubric.methods.programs import make_round_step, make_submesh_round_step
from jaxrubric.methods.setup import RoundSetup
from jaxrubric.rewards import telemetry
from jaxrubric.roles import ROLES, TRAINED, Role
from jaxrubric.train import CoevolveTask


def prefixes(setup: RoundSetup):
    """The round's growing prefixes, built from its own stages, each returning something that
    depends on all its work."""
    def responses(state, frozen, batch, rng):
        return dynamic_rubric.respond(setup, state.policy.params, batch.policy,
                                      dynamic_rubric.round_keys(rng).respond)

    def rubrics(state, frozen, batch, rng):
        sampled, text_len = responses(state, frozen, batch, rng)
        return dynamic_rubric.write(setup, state.generator.params, batch.question, sampled,
                                    text_len, dynamic_rubric.round_keys(rng).write)

    def rollout(state, frozen, batch, rng):
        return dynamic_rubric.rollout(setup, state, frozen, batch, dynamic_rubric.round_keys(rng))

    def whole(state, frozen, batch, rng):
        return dynamic_rubric.dynamic_rubric_round(setup, state, frozen, batch, rng)

    return {"policy samples": responses, "generator writes rubrics": rubrics,
            "verification + rewards": rollout, "GRPO updates (both roles)": whole}


def round_steps(task: CoevolveTask) -> dict:
    """The round as one program (what `jaxrubric train` runs on one mesh) and as its stages in
    programs of their own: `placement.SubMeshes` with every role on the task's mesh, so no
    array moves and only the program boundaries differ."""
    one = make_round_step(task.setup, task.frozen, task.method.round)
    staged = placement.SubMeshes(dict.fromkeys(ROLES, task.mesh))
    separate = make_submesh_round_step(task.setup, task.frozen, staged, task.method.round)
    return {"one program": one, "separate programs": separate}


def without_telemetry(round_fn):
    """`round_fn` traced with `telemetry.round_telemetry` computing nothing: the round as it
    would be without its telemetry scalars (everything else the same)."""
    def round_(*args):
        computed = telemetry.round_telemetry
        telemetry.round_telemetry = lambda *args, **kwargs: {}
        try:
            return round_fn(*args)
        finally:
            telemetry.round_telemetry = computed
    return round_


TELEMETRY_TRIALS = 5  # a few percent of run-to-run spread between blocks of best-of rounds


def telemetry_table(task: CoevolveTask, state, batch, rng, repeats: int) -> str:
    """The round (one program) with and without its telemetry, alternating, in
    `TELEMETRY_TRIALS` blocks of `repeats` rounds each: each block's best times and their
    ratio, then the median ratio."""
    steps = {"with telemetry": make_round_step(task.setup, task.frozen, task.method.round),
             "without telemetry": make_round_step(task.setup, task.frozen,
                                                  without_telemetry(task.method.round))}
    lines = ["The round with its telemetry scalars (`telemetry/*`) and without; every round from "
             f"the same state, the two alternating, {TELEMETRY_TRIALS} blocks\n",
             "| block | ms with | ms without | with / without |", "|---|---:|---:|---:|"]
    ratios = []
    for block in range(1, TELEMETRY_TRIALS + 1):
        timed = interleaved(steps, state, batch, rng, repeats)
        with_, without = timed["with telemetry"][1], timed["without telemetry"][1]
        ratios.append(with_ / without)
        lines.append(f"| {block} | {1e3 * with_:.1f} | {1e3 * without:.1f} | "
                     f"{ratios[-1]:.3f}x |")
    lines.append(f"| median | | | {float(np.median(ratios)):.3f}x |")
    return "\n".join(lines)


def fresh(state: RoundState) -> RoundState:
    """A copy of `state` with its shardings, for a step that donates it."""
    return jax.tree.map(lambda x: jax.device_put(jnp.copy(x), x.sharding), state)


def trained_params(state: RoundState) -> dict:
    return {role: np.concatenate([np.ravel(np.asarray(x, np.float64)) for x in
                                  jax.tree.leaves(jax.device_get(state.role(role).params))])
            for role in TRAINED}


# The tolerances of tests/methods/test_placement.py (the sub-mesh round against the colocated one).
METRIC_RTOL, METRIC_ATOL, OUTPUT_RTOL, OUTPUT_ATOL = 1e-3, 1e-5, 1e-4, 1e-6
UPDATE_RTOL = {Role.POLICY: 1e-3, Role.GENERATOR: 1e-2}


def compare_rounds(steps: dict, state: RoundState, batch, rng) -> str:
    """One round of each step from copies of `state` with the same batch and key: a sentence
    saying whether they agree (metrics, outputs, each trained role's update)."""
    initial = trained_params(state)
    results = {}
    for name, step in steps.items():
        new_state, result = step(fresh(state), batch, rng)
        results[name] = (trained_params(new_state), {k: float(v) for k, v in
                                                     result.scalars.items()},
                         {jax.tree_util.keystr(path): np.asarray(leaf) for path, leaf in
                          jax.tree_util.tree_flatten_with_path(
                              jax.device_get(result.outputs))[0]})
    (params_a, metrics_a, outputs_a), (params_b, metrics_b, outputs_b) = results.values()
    problems = []
    if set(metrics_a) != set(metrics_b):
        problems.append(f"metric names differ: {sorted(set(metrics_a) ^ set(metrics_b))}")
    worst = 0.0
    for key in set(metrics_a) & set(metrics_b):
        a, b = metrics_a[key], metrics_b[key]
        if not np.isclose(b, a, rtol=METRIC_RTOL, atol=METRIC_ATOL):
            problems.append(f"{key} {a:.6g} vs {b:.6g}")
        worst = max(worst, abs(a - b) / max(abs(a), METRIC_ATOL / METRIC_RTOL))
    for key, a in outputs_a.items():
        a, b = np.asarray(a), np.asarray(outputs_b[key])
        same = (np.allclose(b, a, rtol=OUTPUT_RTOL, atol=OUTPUT_ATOL)
                if np.issubdtype(a.dtype, np.floating) else np.array_equal(a, b))
        if not same:
            problems.append(f"output {key} differs")
    updates = []
    for role in TRAINED:
        expected = params_a[role] - initial[role]
        size = np.linalg.norm(expected)
        error = np.linalg.norm(params_b[role] - params_a[role]) / size if size else 0.0
        updates.append(f"{role} {error:.1e}" if size else f"{role} frozen")
        if error > UPDATE_RTOL[role]:
            problems.append(f"the {role} updates differ by {error:.1e} of their size")
    checked = (f"one round of each from the same state, batch and key: {len(metrics_a)} metrics "
               f"(rel {METRIC_RTOL:g} / abs {METRIC_ATOL:g}), sampled tokens (exact), scores "
               f"(rel {OUTPUT_RTOL:g})")
    moved = ("each trained role's update minus the one-program update, relative to its size: "
             + ", ".join(updates) + " (tests/methods/test_placement.py allows "
             + ", ".join(f"{r} {t:g}" for r, t in UPDATE_RTOL.items()) + ")")
    if problems:
        return f"The two forms DIFFER ({checked}): " + "; ".join(problems) + f". {moved}."
    return (f"Both forms compute the same round ({checked}; largest metric difference "
            f"{worst:.1e} relative); {moved}.")


def interleaved(steps: dict, state: RoundState, batch, rng, repeats: int) -> dict:
    """{name: (first call s, best round s)}: each step's first round (its compiles), then
    `repeats` rounds of each, alternating. Every round starts from a copy of `state` (made
    before its clock starts), so each is the same work: the same samples, hence the same
    decode lengths, in both forms."""
    times = {name: [] for name in steps}

    def one_round(name):
        start_state = jax.block_until_ready(fresh(state))
        start = time.perf_counter()
        jax.block_until_ready(steps[name](start_state, batch, rng))
        times[name].append(time.perf_counter() - start)

    for name in steps:
        one_round(name)
    for _ in range(repeats):
        for name in steps:
            one_round(name)
    return {name: (t[0], min(t[1:])) for name, t in times.items()}


def load_task(path: str, overrides: list[str]) -> CoevolveTask:
    config = load_config(path, [o.removeprefix("--config.") for o in overrides])
    oracle = None
    if config.oracle:  # a toy world's run: its ground-truth reward, as `jaxrubric train` does
        from jaxrubric.toy import ORACLES
        oracle = ORACLES[config.oracle]
    return CoevolveTask(config, oracle)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/tiny_dynamic_rubric.py")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--only", choices=("stages", "programs", "telemetry"), default=None,
                        help="print one table: the stages by prefixes, one program vs "
                             "separate programs, or the round with and without telemetry")
    args, overrides = parser.parse_known_args()
    load_before = load_average()
    task = load_task(args.config, overrides)
    if task.method is not DYNAMIC_RUBRIC:
        raise SystemExit(f"round_stages times DynamicRubric's stages; {args.config} trains "
                         f"{task.method.name}")
    if not task.colocated:
        raise SystemExit(f"{args.config} places the roles on sub-meshes (config.submeshes): "
                         "the round is not one program there; clear config.submeshes")
    state = task.init_state(jax.random.key(0))
    batch, rng = task.batch(0), jax.random.key(1)
    tables = []
    if args.only in (None, "stages"):
        tables.append(stages_table(task, state, batch, rng, args.repeats))
    if args.only in (None, "telemetry"):
        print("with vs without telemetry ...", file=sys.stderr, flush=True)
        tables.append(telemetry_table(task, state, batch, rng, args.repeats))
    if args.only in (None, "programs"):
        print("one program vs separate programs ...", file=sys.stderr, flush=True)
        steps = round_steps(task)
        # Timed first, so that each form's first round is its compiles.
        timed = interleaved(steps, state, batch, rng, args.repeats)
        agreement = compare_rounds(steps, state, batch, rng)
        programs = {"one program": 1,
                    "separate programs": steps["separate programs"].placement.compiled_programs()}
        one = timed["one program"][1]
        lines = ["The round as one program (`jaxrubric train`) vs the same stages as separate "
                 "programs (`placement.SubMeshes`, every role on the whole mesh); every round "
                 "from the same state, the two forms alternating\n",
                 "| form | programs | first round s (compiles) | ms per round | "
                 "separate / one program |", "|---|---:|---:|---:|---:|"]
        for name, (first, best) in timed.items():
            lines.append(f"| {name} | {programs[name]} | {first:.1f} | {1e3 * best:.1f} | "
                         f"{best / one:.2f}x |")
        lines.append("\n" + agreement)
        tables.append("\n".join(lines))
    print(f"config {args.config}, {jax.device_count()} {jax.devices()[0].platform} device(s), "
          f"best of {args.repeats}, {load_note(load_before)}\n")
    print("\n\n".join(tables))


def stages_table(task: CoevolveTask, state, batch, rng, repeats: int) -> str:
    """The stages' table: each stage the difference of consecutive prefixes' times."""
    cumulative, previous = {}, 0.0
    for name, fn in prefixes(task.setup).items():
        # The whole round donates nothing here: timing reruns it on the same state.
        total = best_time(jax.jit(fn), (state, task.frozen, batch, rng), repeats)
        cumulative[name], previous = total - previous, total
    stage_flops = flops.round_flops_by_stage(
        {r: task.models[r].config for r in ROLES}, task.setup.config,
        task.method.round_shapes(task.setup, state, task.frozen, batch, rng))
    assert sum(stage_flops.values()) == task.round_flops
    groups = {"policy samples": ("policy/sample",),
              "generator writes rubrics": ("generator/sample",),
              "verification + rewards": ("verifier/",),
              "GRPO updates (both roles)": ("/update", "/reference")}
    total_flops = sum(stage_flops.values())
    lines = ["Stages, timed by growing prefixes of the round\n",
             "| stage | ms | share of time | share of model FLOPs |", "|---|---:|---:|---:|"]
    for name, seconds in cumulative.items():
        share = sum(v for k, v in stage_flops.items() if any(p in k for p in groups[name]))
        lines.append(f"| {name} | {1e3 * seconds:.1f} | {seconds / previous:.0%} | "
                     f"{share / total_flops:.0%} |")
    lines.append(f"| whole round | {1e3 * previous:.1f} | 100% | 100% |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
