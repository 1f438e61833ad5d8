"""The embedded default: co-evolution that measurably learns, offline, on a laptop CPU.

`run_toy_world(workdir)` builds the big-digits world of `jaxrubric.toy.digits_task` and runs
the whole stack on it, every role a real transformer LM from our own model code:

1. a character-level tokenizer and generated data (train and held-out anchor lists: the
   correct answer, one with a big digit dropped, one with a small digit kept);
2. warm starts by supervised fine-tuning (`toy/world_warm_starts.py`): the **verifier** on
   the checker's labels of (prompt, answer, criterion) triples, then frozen; the **policy**
   to middling quality; the **generator** on valid rubric lines, only partly sound, about
   the digits the answers it is shown differ on (a prompt-only generator on any of the
   prompt's digits);
3. each generator's own rounds against the warm-started policy (policy frozen), a few: the
   evaluator the "coevolve" run goes on training; the same rounds continued as long as the
   compared runs last give the **stale** evaluator the "frozen" run keeps, trained as long
   as the co-evolving one but on the warm start's answers alone;
4. four runs of `jaxrubric.train.train` from the same policy, held-out ground-truth quality
   of the policy every few rounds: **coevolve** (both roles train), **frozen** (the stale
   evaluator of step 3), **static** (a generator that sees the prompt alone, co-trained on
   the same rewards), **oracle** (the policy rewarded by ground truth itself: the ceiling);
5. a final evaluation: every run's last policy answers each held-out question
   `final_samples` times, all runs with the same sampling draws (`toy/final_eval.py`), so
   two runs' quality difference is paired by question;
6. `summary.json` = the quality curves, their standard errors and Δgap on each run's own
   answers, the final evaluation with its paired leads, `quality.png` plotting the curves,
   and a table (`toy/world_report.py`).

Steps 2 and 3 are the same for every config that agrees on what they read: the default
seed's ship with the package (`toy/warm_starts.py`), so the default world trains only the
compared runs; `from_scratch` trains them here.

Why a frozen evaluator should go stale here. The warm-started policy copies too much: its
mistakes are small digits kept, never a big digit dropped, so the items that tell its answers
apart are "omits <small digit>", and that is what the generator's own rounds sharpen ("has <big
digit>" items pass every answer: no discriminability reward). Rewarded for dropping digits,
the policy can start dropping big ones too. The frozen generator keeps writing the items of
the old mistakes; a co-evolving generator should find the items that now separate the answers
(discriminability) in the direction the anchor lists rank (anchor reward). The same holds for
the stray letters: the generator's own rounds wear its letter items down, and once the policy
stops keeping small digits the letters are what its answers differ on, which the co-evolving
generator names again. Why a static one should fall behind: the policy also writes stray
letters, and which letter only its answers show; a generator that sees the prompt alone
cannot write "omits <that letter>".

What made that measurable (each setting's comment in `ToyWorldConfig` says why): a mistake
the prompt does not foretell (stray letters, `policy_stray`) written with letters no
template holds (`digits_task.STRAY_LETTERS`), a policy warm start that writes in the task's
format (`policy_steps`), runs long enough for the stale evaluator to fall behind (`rounds`),
generator warm starts long enough to aim and to read the letter off the answers
(`generator_steps`), policy advantages that follow the size of the score gaps, not only their
order (`round.policy.advantage_mode`), and a final evaluation that compares the runs paired by
question (`final_samples`). The README's toy section has what the defaults measure.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jaxrubric import sharding as shd
from jaxrubric.toy import stages as stages_lib
from jaxrubric.toy import warm_starts
from jaxrubric.toy.workdir import prepare_workdir, run_world, use_workdir
from jaxrubric.toy.world_config import STATIC_RUNS, ToyWorldConfig
from jaxrubric.toy.world_report import final_evaluation, summarize
from jaxrubric.toy.world_runs import (run_generator, stale_generator, train_run,
                                      trained_generator, write_data)
from jaxrubric.toy.world_warm_starts import ROLES, warm_start

METHOD = "dynamic_rubric"
# What the stages before the compared runs write in the workdir (`start_stages`).
START_OUTPUTS = ("models",)


def _warm_start_stage(workdir: Path, cfg: ToyWorldConfig, role: str) -> None:
    warm_start(role, workdir, use_workdir(workdir), shd.make_mesh({"fsdp": -1}), cfg)


def _generator_stage(workdir: Path, cfg: ToyWorldConfig, static: bool) -> None:
    use_workdir(workdir)
    trained_generator(workdir, write_data(workdir, cfg), cfg, static=static)


def _stale_stage(workdir: Path, cfg: ToyWorldConfig) -> None:
    use_workdir(workdir)
    stale_generator(workdir, write_data(workdir, cfg), cfg)


def _run_stage(workdir: Path, cfg: ToyWorldConfig, name: str) -> None:
    use_workdir(workdir)
    train_run(name, workdir, write_data(workdir, cfg), cfg, run_generator(workdir, cfg, name))


def start_stages(workdir: Path, cfg: ToyWorldConfig) -> list[stages_lib.Stage]:
    """The stages before the compared runs, in a serial order, each with what it reads: the
    warm starts, the generators' own rounds (each against the warm-started policy, judged by
    the verifier), the stale evaluator's further rounds."""
    Stage = stages_lib.Stage
    static = any(name in STATIC_RUNS for name in cfg.runs)
    graph = [Stage(f"warm start: {role}", _warm_start_stage, (workdir, cfg, role))
             for role in ROLES if static or not role.endswith("_static")]
    judged = ("warm start: verifier", "warm start: policy")
    graph.append(Stage("generator rounds", _generator_stage, (workdir, cfg, False),
                       (*judged, "warm start: generator_cold")))
    if static:
        graph.append(Stage("generator rounds: static", _generator_stage, (workdir, cfg, True),
                           (*judged, "warm start: generator_cold_static")))
    if _stale(cfg):
        graph.append(Stage("generator rounds: stale", _stale_stage, (workdir, cfg),
                           ("generator rounds",)))
    return graph


def _stale(cfg: ToyWorldConfig) -> bool:
    return "frozen" in cfg.runs and cfg.stale_rounds > 0


def world_stages(workdir: Path, cfg: ToyWorldConfig) -> list[stages_lib.Stage]:
    """The world's stages in a serial order, each with what it reads: `start_stages`, then
    the compared runs, each from its generator, then the final evaluation."""
    Stage = stages_lib.Stage

    def start(name: str) -> str:
        if name in STATIC_RUNS:
            return "generator rounds: static"
        if name == "frozen" and _stale(cfg):
            return "generator rounds: stale"
        return "generator rounds"

    # The first two runs to start compile the two round programs (answer-seeing and static
    # rubrics) side by side; the others read them from the compilation cache.
    dynamic = [name for name in cfg.runs if name not in STATIC_RUNS]
    order = dynamic[:1] + [name for name in cfg.runs if name in STATIC_RUNS] + dynamic[1:]
    graph = start_stages(workdir, cfg)
    graph += [Stage(f"run: {name}", _run_stage, (workdir, cfg, name), (start(name),))
              for name in order]
    graph.append(Stage("final evaluation", final_evaluation, (workdir, cfg),
                       tuple(f"run: {name}" for name in cfg.runs)))
    return graph


def run_toy_world(workdir: str | Path, cfg: ToyWorldConfig = ToyWorldConfig(),
                  jobs: int = 1, from_scratch: bool = False) -> dict[str, Any]:
    """The whole toy world (see the module docstring), its stages in order in this process, or
    side by side in `jobs` worker processes (`toy/stages.py`); returns the summary. The
    shipped starts are used where they are this config's, unless `from_scratch`
    (`toy/warm_starts.py`). The results depend on neither `jobs` nor where the starts came
    from, only on the starts themselves."""
    workdir, tokenizer = prepare_workdir(workdir, cfg)
    warm_starts.provide(workdir, tokenizer, METHOD, cfg, START_OUTPUTS, from_scratch)
    write_data(workdir, cfg)
    run_world(workdir, world_stages(workdir, cfg), jobs)
    return summarize(workdir, cfg)
