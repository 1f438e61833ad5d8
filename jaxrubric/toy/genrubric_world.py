"""GenRubric's toy world: self-evolution that measurably raises agreement with an expert rubric.

`run_genrubric_world(workdir)` (``jaxrubric train --method genrubric``) builds the big-digits
world with signed rubrics (`jaxrubric.toy.signed_rubrics`) and runs GenRubric on it, every role
a real transformer LM from our own model code:

1. the toy tokenizer, unlabeled training queries, and held-out rows in HealthBench's schema:
   seven-digit queries, each with its expert rubric (from the checker) and eight responses of
   distinct expert scores;
2. warm starts by supervised fine-tuning: the **verifier** of the DynamicRubric world (checker
   labels of (query, answer, criterion), malformed criteria labelled "no"), frozen; the
   **answerer** (the policy) to follow the rubric it is shown (`signed_rubrics.follow`), in
   stages until it follows most of what fresh rubrics name (`answerer_follows`), frozen too,
   as the paper self-evolves the generator against a fixed answering and judging setup; the
   **generator** on signed rubrics written from the query alone, each item sound
   with probability `teacher_informed` (0.5) and random otherwise;
3. two GenRubric runs of `jaxrubric.train.train` from that cold start: **evolving** (the
   method) and **control** (the same updates with each query's rewards shuffled among its
   groups, `round.shuffle_generator_credit`: what sharpening the sampled distribution does on
   its own). Every `eval_every` rounds the training loop writes R rubrics (and a greedy one)
   per held-out query and the verifier judges the eight responses under them and under the
   expert rubric (`eval/agreement/*`, `eval_scores.jsonl`);
4. `summary.json`: per evaluated round, Spearman, Kendall tau-b, Top-1 and pairwise accuracy
   of each run, and of the evolving run with the checker as the judge (the generator's
   learning without the verifier's errors), the rise from the cold start with a bootstrap
   interval over queries; `agreement.png` and a printed table.

Why the rewards teach agreement here. An answerer that follows its rubric gets right every
digit a sound item names, wrong every digit an unsound item names, and guesses the rest. So a
rubric with more sound items on more of the query's digits induces an answer that the query's
other rubrics (sound on average, since a random item is as often right as wrong) score higher:
cross-rubric comprehensiveness rewards exactly what the expert rubric states.

Every step writes into `workdir` and is skipped when its output is already there: a rerun
resumes.
"""

from __future__ import annotations

import dataclasses
import json
import random
from collections import defaultdict
from pathlib import Path
from typing import Any

import jax
import ml_collections
import numpy as np

import jaxrubric
from jaxrubric import sft
from jaxrubric import sharding as shd
from jaxrubric.config import check_config
from jaxrubric.data import load_healthbench, prompt_text
from jaxrubric.eval.metrics import AGREEMENT_METRICS, agreement_metrics
from jaxrubric.rubric import templates as tpl
from jaxrubric.toy import digits_task as task
from jaxrubric.toy import signed_rubrics as sr
from jaxrubric.toy import stages as stages_lib
from jaxrubric.toy import world
from jaxrubric.train import EVAL_SCORES

RUNS = ("evolving", "control")
# The answerer's rubric following (`follows`) as its warm start last checked it, in a workdir.
FOLLOWING = "rubric_following.json"
# summary.json's names of `metrics.AGREEMENT_METRICS`.
METRICS = dict(zip(AGREEMENT_METRICS, ("spearman", "kendall_tau_b", "top1", "pairwise")))


@dataclasses.dataclass(frozen=True)
class GenRubricWorldConfig:
    """Sizes and budgets of the GenRubric toy world."""

    seed: int = 0
    # GenRubric rounds of each run. With two induced responses per group (below) the nine
    # draws of seeds 0-2 had risen +0.131 to +0.238 by round 40 and +0.104 to +0.221 by
    # round 60 (five of them lower at 60 than at 40); 40 rounds of two responses take
    # about the time of 60 rounds of one (README).
    rounds: int = 40
    eval_every: int = 20
    # Queries per round. At 8 a run walked far between evaluations (Spearman 0.60 -> 0.49 ->
    # 0.67 in one) and one training draw of six ended below its cold start; at 16 (each
    # update averages twice the rubrics) the same six rose by +0.13 to +0.20 (README).
    batch_size: int = 16
    # G: groups per query, each inducing one answer and judging the others' (at 6 the
    # comprehensiveness signal drowned in its noise: README)
    num_rubrics: int = 12
    max_items: int = 4
    # RoundConfig.induced_responses: each group's comprehensiveness averaged over two
    # responses it induced (the paper: one). With one, nine training draws of seeds 0-2 rose
    # +0.056 to +0.197 by round 40 (the answerer flips a coin on every digit no item names,
    # and much of a group's reward is that noise); with two, +0.131 to +0.238.
    induced_responses: int = 2
    max_item_tokens: int = 7
    eval_queries: int = 128  # held-out rows, 8 responses each
    eval_rubric_runs: int = 4  # R sampled rubrics per held-out query (plus a greedy one)
    # Generator cold start: share of items drawn sound, the rest random (half of those sound
    # too: about 0.75 in all; the cold start samples 0.77 sound at the generator temperature).
    # At 0.8 (0.96 sampled sound) soundness had nowhere to go, and the rise came from writing
    # more items only (+0.04 to +0.08 Spearman); from 0.5 it rises +0.10 to +0.22 over three
    # training draws of seeds 0-2 (README).
    # Before the temperature, KL and 12 groups below, 0.5 drifted away from sound items.
    teacher_informed: float = 0.5
    verifier_steps: int = 450  # the DynamicRubric world's (one verifier for both)
    verifier_malformed: float = 0.25  # share of malformed criteria in the verifier's data
    # The answerer trains in stages of `answerer_steps` (each a warm-up and cosine decay of
    # `answerer_lr`) until it follows at least `answerer_follows` of the digits a fresh rubric
    # names (`follows`), at most `answerer_stages` of them: the world's signal is only
    # there when it follows. After one stage seeds 0-2 followed 0.93 / 0.82 / 0.85, seeds 3-5
    # 0.65 / 0.65 / 0.65 (uniformly across item kinds: the lookup half learned), and their
    # GenRubric runs fell below the cold start (README).
    answerer_steps: int = 800
    answerer_lr: float = 2e-3
    answerer_follows: float = 0.8
    answerer_stages: int = 4
    generator_steps: int = 300
    sft_batch: int = 64
    sft_lr: float = 1e-3
    # From the 0.5 cold start, 2e-4 gave +0.15 / +0.17 / +0.06 on seeds 0 / 1 / 2 (seed 2 flat
    # for its first 20 rounds); 4e-4 gave +0.14 / +0.23 / +0.20 (both with 8 queries a round;
    # README). 8e-4 (16 queries) did worse on four of the nine draws: mean +0.122 against
    # +0.132, the worst +0.064.
    generator_lr: float = 4e-4
    # config.optim.lr_schedule. A cosine decay to a tenth did not steady seed 2: its three
    # draws rose +0.113 / +0.067 / +0.065, against +0.097 / +0.130 / +0.165 constant (README).
    generator_lr_schedule: str = "constant"
    # KL of the generator to its cold start (RoundConfig.generator_beta): without it the
    # character-level generator collapsed into text outside the language within 20 rounds.
    generator_beta: float = 0.04
    discrimination_spread: str = "pairs"  # RoundConfig.discrimination_spread
    # Sampling temperatures (RoundConfig.generator_temperature / policy_temperature). At 1 the
    # character-level cold start writes about a fifth of its items outside the criterion
    # language (the tails of a 300-step SFT), and GRPO's noise walks it further out: seeds 1
    # and 2 fell to 0.08 and 0.04 in-language by round 40. At 0.7 it writes 0.98 in the
    # language (held-out rubrics are sampled at it too). The frozen answerer at 0.5 follows
    # the rubric it is shown better (named digits 0.79 -> 0.86 in seed 1, answers in order
    # 0.60 -> 0.80) and still tosses a fair coin where no item speaks, so the induced
    # response says more about its rubric: comprehensiveness has less noise.
    generator_temperature: float = 0.7
    policy_temperature: float = 0.5
    # RoundConfig.advantage_mode: "no_std" centres each query's rewards without dividing by
    # their spread, so a query whose rubrics earn nearly the same comprehensiveness (coin
    # flips, not rubric quality) moves the generator little; z-scored, it got full-size
    # advantages.
    advantage_mode: str = "no_std"
    # GenRubric's reward coefficients (RoundConfig.*_coef): comprehensiveness, group
    # discrimination, item discriminative, item non-redundant. Comprehensiveness alone (the
    # paper's ablation): here the discrimination terms pay an item for contradicting the other
    # rubrics, the only way to split answers that follow them (README).
    coefficients: tuple[float, float, float, float] = (1.0, 0.0, 0.0, 0.0)
    round_overrides: tuple[tuple[str, Any], ...] = ()  # other RoundConfig keys, for studies
    hidden_size: int = 64
    num_layers: int = 2
    # Following a rubric is a lookup (which item names this digit, with which sign): a wider
    # answerer learns it in fewer steps than a deeper one.
    answerer_hidden_size: int = 128
    answerer_layers: int = 2
    runs: tuple[str, ...] = RUNS
    bootstrap: int = 2000  # resamples of the queries for the intervals

    def __post_init__(self) -> None:
        unknown = set(self.runs) - set(RUNS)
        if unknown:
            raise ValueError(f"unknown GenRubric toy runs {sorted(unknown)}; choose from {RUNS}")

    def verifier_world(self) -> world.ToyWorldConfig:
        """A DynamicRubric world whose verifier this world uses (`world.VERIFIER_SETTINGS`)."""
        return world.ToyWorldConfig(seed=self.seed, max_item_tokens=self.max_item_tokens,
                                    verifier_steps=self.verifier_steps,
                                    verifier_malformed=self.verifier_malformed,
                                    sft_batch=self.sft_batch, sft_lr=self.sft_lr)


# --------------------------------------------------------------------------------- data
def write_data(workdir: Path, cfg: GenRubricWorldConfig) -> dict[str, Path]:
    """Training queries (the anchor schema the loader reads; GenRubric reads the query only)
    and the held-out expert rows (HealthBench schema), as JSONL from the seed."""
    paths = {"train": workdir / "data" / "train.jsonl", "eval": workdir / "data" / "eval.jsonl"}
    rows = {"train": lambda: task.anchor_rows(2000, cfg.seed, 2, "distinct"),
            "eval": lambda: sr.expert_rows(cfg.eval_queries, cfg.seed + 10_000)}
    for name, path in paths.items():
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("".join(json.dumps(r) + "\n" for r in rows[name]()))
    return paths


def shown_rubric(question: str, rng: random.Random, max_items: int) -> list[sr.Item]:
    """A rubric the answerer is shown in its warm start: anything from fully sound to fully
    random, now and then with an item outside the language (which names no digit)."""
    items = sr.teacher_rubric(question, rng, max_items, informed=rng.random())
    if rng.random() < 0.2:
        items[rng.randrange(len(items))] = (task.malformed_criterion(question, rng),
                                            rng.choice(sr.WEIGHTS))
    return items


def answerer_examples(tokenizer: Any, rng: random.Random, n: int, cfg: GenRubricWorldConfig
                      ) -> tuple[list, list]:
    """(induced-response prompt, the answer the shown rubric asks for) pairs."""
    template = tpl.induced_response_template(tokenizer, style="compact")
    prompts, targets = [], []
    for _ in range(n):
        question, _ = task.make_prompt(rng)
        rubric = shown_rubric(question, rng, cfg.max_items)
        prompts.append(world.template_ids(template, tokenizer, sr.rubric_text(rubric), question))
        targets.append(world.text_ids(tokenizer, sr.follow(question, rubric, rng))
                       + [tokenizer.eos_token_id])
    return prompts, targets


def generator_examples(tokenizer: Any, rng: random.Random, n: int, cfg: GenRubricWorldConfig
                       ) -> tuple[list, list]:
    """(query-only generator prompt, a partly sound signed teacher rubric) pairs."""
    template = tpl.genrubric_generator_template(tokenizer, max_items=cfg.max_items,
                                                style="compact")
    prompts, targets = [], []
    for _ in range(n):
        question, _ = task.make_prompt(rng)
        rubric = sr.teacher_rubric(question, rng, cfg.max_items, cfg.teacher_informed)
        prompts.append(world.template_ids(template, tokenizer, question))
        targets.append(world.text_ids(tokenizer, sr.rubric_text(rubric)) + [tokenizer.eos_token_id])
    return prompts, targets


def warm_start(role: str, workdir: Path, tokenizer: Any, mesh, cfg: GenRubricWorldConfig
               ) -> Path:
    """The answerer ("policy") or the cold-start generator ("generator_cold") by SFT, saved as
    an HF checkpoint (skipped when saved before); the verifier is the DynamicRubric world's."""
    if role == "verifier":
        return world.warm_start(role, workdir, tokenizer, mesh, cfg.verifier_world())
    out = workdir / "models" / role
    if (out / "config.json").exists():
        return out
    rng = random.Random(f"{cfg.seed}-genrubric-{role}")
    # Both warm starts train two layers unrolled on rows padded to a multiple of 8 tokens:
    # against scanned layers and a multiple of 32 (most batches 96 wide, rows of 50-85 tokens)
    # an answerer step took 214 ms instead of 332 (two batch widths compile instead of one).
    # The saved checkpoint is the same format either way.
    if role == "policy":
        model = world.new_model(tokenizer, mesh, cfg.seed + 1, cfg.answerer_hidden_size,
                                cfg.answerer_layers, scan_layers=False)
        make = lambda r, n: answerer_examples(tokenizer, r, n, cfg)  # noqa: E731
        steps, lr, stages = cfg.answerer_steps, cfg.answerer_lr, cfg.answerer_stages
    else:
        model = world.new_model(tokenizer, mesh, cfg.seed + 2, cfg.hidden_size, cfg.num_layers,
                                scan_layers=False)
        make = lambda r, n: generator_examples(tokenizer, r, n, cfg)  # noqa: E731
        steps, lr, stages = cfg.generator_steps, cfg.sft_lr, 1
    batches = world.sft_batches(tokenizer, make, rng, cfg.sft_batch, multiple=8)
    history: list[dict[str, Any]] = []
    for stage in range(stages):
        of = f", stage {stage + 1} of at most {stages}" if stages > 1 else ""
        print(f"warm start: {role} ({steps} supervised steps{of})", flush=True)
        _, logged = sft.train_sft(model, world.sft_optimizer(lr, steps), batches, steps=steps,
                                  log_every=max(1, steps // 10))
        history += [{**entry, "step": entry["step"] + stage * steps} for entry in logged]
        if role == "policy":
            following = follows(model, tokenizer, cfg)
            history[-1]["follows_named_digits"] = following["follows_named_digits"]
            print(f"rubric following after stage {stage + 1}: {following}", flush=True)
            if following["follows_named_digits"] >= cfg.answerer_follows:
                break
    jaxrubric.save_pretrained(model, out)
    (out / "sft_history.json").write_text(json.dumps(history, indent=1))
    if role == "policy":  # the saved answerer's check: the world's stage need not repeat it
        (workdir / FOLLOWING).write_text(json.dumps(following, indent=1))
    return out


def rubric_following(workdir: Path, cfg: GenRubricWorldConfig) -> dict[str, float]:
    """How well the saved answerer follows fresh rubrics (`follows`), checked before any RL."""
    return follows(jaxrubric.load_pretrained(workdir / "models" / "policy"),
                   jaxrubric.load_tokenizer(workdir / "tokenizer"), cfg)


def follows(answerer: Any, tokenizer: Any, cfg: GenRubricWorldConfig, n: int = 256,
            seed: int = 99) -> dict[str, float]:
    """How well `answerer` follows `n` fresh rubrics: the share of digits a rubric names that
    its sampled answer keeps or drops as told, the share of the others it keeps (a fair coin:
    0.5), and the share of answers that are the prompt's digits in order. Sampled at the
    temperature its induced responses are (`policy_temperature`)."""
    from jaxrubric.sampling import generate

    rng = random.Random(seed)
    template = tpl.induced_response_template(tokenizer, style="compact")
    cases = []
    for _ in range(n):
        question, _ = task.make_prompt(rng)
        rubric = shown_rubric(question, rng, cfg.max_items)
        cases.append((question, rubric, world.template_ids(template, tokenizer,
                                                           sr.rubric_text(rubric), question)))
    out = generate(answerer, [c[2] for c in cases], max_new_tokens=8, rng=jax.random.key(seed),
                   temperature=cfg.policy_temperature, pad_id=tokenizer.pad_token_id)
    told, unnamed, in_order = [], [], []
    for (question, rubric, _), ids, length in zip(cases, np.asarray(out.tokens)[:, 0],
                                                  np.asarray(out.lengths)[:, 0]):
        answer = tokenizer.decode(ids[:length], skip_special_tokens=True)
        digits = task.digits_of(question)
        in_order.append(task.in_order(answer, question))
        for digit in digits:
            votes = sr.keep_votes(rubric, digit)
            if votes:
                told.append((digit in answer) == (votes > 0))
            else:
                unnamed.append(digit in answer)
    return {"follows_named_digits": float(np.mean(told)),
            "keeps_unnamed_digits": float(np.mean(unnamed)),
            "in_order": float(np.mean(in_order))}


# ---------------------------------------------------------------------------- the runs
def run_config(name: str, workdir: Path, paths: dict[str, Path], cfg: GenRubricWorldConfig
               ) -> ml_collections.ConfigDict:
    """The training config of one run of `RUNS`."""
    c = world.toy_run_config(
        workdir, paths, workdir / "models" / "generator_cold", seed=cfg.seed,
        batch_size=cfg.batch_size, eval_batch_size=cfg.eval_queries,
        num_rubrics=cfg.num_rubrics, max_items=cfg.max_items,
        max_item_tokens=cfg.max_item_tokens, generator_beta=cfg.generator_beta,
        generator_lr=cfg.generator_lr, rounds=cfg.rounds, eval_every=cfg.eval_every)
    c.method = "genrubric"
    c.data.eval_rubric_runs = cfg.eval_rubric_runs
    c.round.policy.freeze = True  # the answerer stays the one the rubrics were checked with
    c.round.shuffle_generator_credit = name == "control"
    c.round.discrimination_spread = cfg.discrimination_spread
    c.round.generator.temperature = cfg.generator_temperature
    c.round.policy.temperature = cfg.policy_temperature
    for role in (c.round.policy, c.round.generator):
        role.advantage_mode = cfg.advantage_mode
    c.round.induced_responses = cfg.induced_responses
    c.optim.lr_schedule = cfg.generator_lr_schedule  # the generator is the one trained role
    for key, value in zip(("comprehensiveness_coef", "discrimination_coef",
                            "discriminative_coef", "nonredundant_coef"), cfg.coefficients):
        c.round[key] = value
    for key, value in cfg.round_overrides:  # dotted within the round: "generator.temperature"
        *sections, name = key.split(".")
        node = c.round
        for section in sections:
            node = node[section]
        node[name] = value
    check_config(c)
    return c


# ---------------------------------------------------------------------------------- result
def read_scores(run_dir: Path) -> dict[int, list[dict[str, Any]]]:
    """A run's `eval_scores.jsonl` rows by round, one per held-out query (after a resume the
    later row of a round and query wins)."""
    rows: dict[int, dict[str, dict]] = defaultdict(dict)
    for line in (run_dir / EVAL_SCORES).read_text().splitlines():
        row = json.loads(line)
        rows[row["round"]][row["id"]] = row
    return {r: sorted(by_id.values(), key=lambda row: row["row"]) for r, by_id in sorted(rows.items())}


def per_query_agreement(rows: list[dict[str, Any]], runs: int, responses: dict[str, list[str]]
                        | None = None, prompts: dict[str, str] | None = None
                        ) -> dict[str, list[float | None]]:
    """Per held-out query, each metric averaged over its valid sampled rubrics (None where none
    is defined), as the paper computes it: from the verifier's scores, or, given `responses`
    and `prompts` by row id, with the checker judging the written rubrics and the expert one."""
    out: dict[str, list[float | None]] = {m: [] for m in AGREEMENT_METRICS}
    for row in rows:
        if responses is None:
            scores = np.asarray(row["scores"], np.float64)
            expert = scores[:, -1]
            vectors = [scores[:, g] for g in range(runs) if row["valid"][g]]
        else:
            answers, prompt = responses[row["id"]], prompts[row["id"]]
            expert = np.array([sr.score(sr.expert_rubric(prompt), a) for a in answers])
            vectors = []
            for g in range(runs):
                rubric = [(c, w) for w, c in row["rubrics"][g]]
                if row["valid"][g]:
                    vectors.append(np.array([sr.score(rubric, a) for a in answers]))
        values = [agreement_metrics(v, expert) for v in vectors]
        for m in AGREEMENT_METRICS:
            defined = [v[m] for v in values if v[m] is not None]
            out[m].append(float(np.mean(defined)) if defined else None)
    return out


def _mean(values: list[float | None]) -> float | None:
    defined = [v for v in values if v is not None]
    return float(np.mean(defined)) if defined else None


def paired_interval(after: list[float | None], before: list[float | None], seed: int,
                    resamples: int) -> dict[str, float]:
    """Mean of ``after - before`` over the queries where both are defined, with its 95%
    percentile bootstrap interval over queries."""
    d = np.array([a - b for a, b in zip(after, before) if a is not None and b is not None])
    if not len(d):  # no query with both values (every rubric invalid or constant)
        return {"mean": None, "low": None, "high": None, "queries": 0}
    rng = np.random.default_rng(seed)
    means = rng.choice(d, size=(resamples, len(d))).mean(axis=1)
    low, high = np.percentile(means, [2.5, 97.5])
    return {"mean": float(d.mean()), "low": float(low), "high": float(high),
            "queries": int(len(d))}


def summarize(workdir: Path, cfg: GenRubricWorldConfig) -> dict[str, Any]:
    """Writes `summary.json` and `agreement.png`, prints the table, returns the summary."""
    # The held-out rows as the training loop read them (the same loader, the same order of
    # completions as its score matrices).
    held_out = load_healthbench(workdir / "data" / "eval.jsonl").records
    responses = {r.id: r.responses for r in held_out}
    prompts = {r.id: prompt_text(r.messages) for r in held_out}
    per_query: dict[str, dict[int, dict[str, list]]] = {}
    for name in cfg.runs:
        scores = read_scores(workdir / "runs" / name)
        per_query[name] = {r: per_query_agreement(rows, cfg.eval_rubric_runs)
                           for r, rows in scores.items()}
        if name == "evolving":
            per_query["checker_judged"] = {
                r: per_query_agreement(rows, cfg.eval_rubric_runs, responses, prompts)
                for r, rows in scores.items()}
    rounds = sorted(next(iter(per_query.values())))
    summary: dict[str, Any] = {"rounds": rounds}
    for name, by_round in per_query.items():
        summary[name] = {METRICS[m]: [_mean(by_round[r][m]) for r in rounds]
                         for m in AGREEMENT_METRICS}
    first, last = rounds[0], rounds[-1]
    intervals = {}
    for name, by_round in per_query.items():
        intervals[f"{name}_rise"] = {
            METRICS[m]: paired_interval(by_round[last][m], by_round[first][m], cfg.seed,
                                        cfg.bootstrap) for m in AGREEMENT_METRICS}
    if "control" in per_query and "evolving" in per_query:
        intervals["evolving_minus_control"] = {
            METRICS[m]: paired_interval(per_query["evolving"][last][m],
                                        per_query["control"][last][m], cfg.seed, cfg.bootstrap)
            for m in AGREEMENT_METRICS}
    summary["intervals"] = intervals
    summary["rubric_following"] = json.loads((workdir / FOLLOWING).read_text())
    summary["config"] = dataclasses.asdict(cfg)
    (workdir / "summary.json").write_text(json.dumps(summary, indent=1))
    plot(summary, workdir / "agreement.png")
    print(table(summary))
    return summary


def table(summary: dict[str, Any]) -> str:
    """The Spearman and pairwise curves of every run, and the rises with their intervals."""
    names = [n for n in (*RUNS, "checker_judged") if n in summary]
    lines = ["held-out agreement with the expert rubric (Spearman / pairwise accuracy)",
             "round  " + "  ".join(f"{n:>15}" for n in names)]
    for i, round_ in enumerate(summary["rounds"]):
        lines.append(f"{round_:5d}  " + "  ".join(
            f"{_show(summary[n]['spearman'][i], '7.3f')} /"
            f"{_show(summary[n]['pairwise'][i], '6.3f')}" for n in names))
    for key, by_metric in summary["intervals"].items():
        s = by_metric["spearman"]
        lines.append(f"{key}: Spearman {_show(s['mean'], '+.3f')} [{_show(s['low'], '+.3f')}, "
                     f"{_show(s['high'], '+.3f')}] over {s['queries']} queries")
    return "\n".join(lines)


def _show(value: float | None, spec: str) -> str:
    """A table cell: the value, or "-" where it is undefined (no valid rubric)."""
    width = int(spec.lstrip("+").split(".")[0] or 0)
    return format(value, spec) if value is not None else "-".rjust(width)


def plot(summary: dict[str, Any], path: Path) -> None:
    """Spearman and pairwise accuracy per evaluated round, one line per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = {"evolving": "self-evolving generator", "control": "shuffled rewards (control)",
              "checker_judged": "self-evolving, judged by the checker"}
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), dpi=110)
    for ax, metric in zip(axes, ("spearman", "pairwise")):
        for name, label in labels.items():
            if name in summary:
                values = [np.nan if v is None else v for v in summary[name][metric]]
                ax.plot(summary["rounds"], values, marker="o", ms=3, label=label)
        ax.set(xlabel="GenRubric round", ylabel=metric,
               title=f"Agreement with the expert rubric: {metric}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _warm_start_stage(workdir: Path, cfg: GenRubricWorldConfig, role: str) -> None:
    warm_start(role, workdir, world.use_workdir(workdir), shd.make_mesh({"fsdp": -1}), cfg)


def _following_stage(workdir: Path, cfg: GenRubricWorldConfig) -> None:
    world.use_workdir(workdir)
    following = workdir / FOLLOWING
    if not following.exists():  # an answerer saved before its warm start wrote the check
        following.write_text(json.dumps(rubric_following(workdir, cfg), indent=1))
    print(f"rubric following of the answerer: {following.read_text()}", flush=True)


def _run_stage(workdir: Path, cfg: GenRubricWorldConfig, name: str) -> None:
    world.use_workdir(workdir)
    world.train_toy_run(name, workdir, run_config(name, workdir, write_data(workdir, cfg), cfg))


def world_stages(workdir: Path, cfg: GenRubricWorldConfig) -> list[stages_lib.Stage]:
    """The world's stages in a serial order, each with what it reads: three warm starts, the
    answerer's rubric-following check, then the compared runs (each reads all three roles)."""
    Stage = stages_lib.Stage
    roles = ("verifier", "policy", "generator_cold")
    graph = [Stage(f"warm start: {role}", _warm_start_stage, (workdir, cfg, role))
             for role in roles]
    graph.append(Stage("rubric following", _following_stage, (workdir, cfg),
                       ("warm start: policy",)))
    graph += [Stage(f"run: {name}", _run_stage, (workdir, cfg, name),
                    tuple(f"warm start: {role}" for role in roles))
              for name in cfg.runs]
    return graph


def run_genrubric_world(workdir: str | Path, cfg: GenRubricWorldConfig = GenRubricWorldConfig(),
                        jobs: int = 1) -> dict[str, Any]:
    """The whole GenRubric world (see the module docstring), its stages in order in this
    process, or side by side in `jobs` worker processes (`toy/stages.py`); returns the summary.
    The results do not depend on `jobs`."""
    workdir, _ = world.prepare_workdir(workdir, cfg)
    write_data(workdir, cfg)
    world.run_world(workdir, world_stages(workdir, cfg), jobs)
    return summarize(workdir, cfg)
