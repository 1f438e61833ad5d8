"""What the toy worlds' roles have learned, read back from a workdir: the checks behind the
README's diagnoses.

- `verifier_accuracy`: the frozen verifier's accuracy on fresh checker-labelled triples;
- `mistake_profile` (DynamicRubric world): which mistakes a run's policy makes;
- `rubric_profile` (DynamicRubric world): which kinds of item a run's generator writes;
- `generator_aim` (DynamicRubric world): whether a generator writes its items about what
  its shown answers differ on;
- `gap_by_mistake` (DynamicRubric world): Δgap split by the kind of mistake that tells each
  pair apart, for any run's generator on any run's answers (a matched answer set);
- `item_signal` (DynamicRubric world): which kinds of sound item the generator's rewards
  would favour on a run's policy's own answers; `item_edit_advantage`: how its advantage
  moves when a `has <big digit>` item is edited into the rubrics its generator writes;
- `rubric_coverage` (GenRubric world): how much of each held-out query a run's written rubrics
  cover, round by round, read from the rubrics its evaluations logged.

Each samples or reads what a run saved and changes nothing; none is needed to train.
"""

from __future__ import annotations

import itertools
import json
import random
from collections import defaultdict
from pathlib import Path

import jax
import numpy as np

import jaxrubric
from jaxrubric.data import load_healthbench, prompt_text
from jaxrubric.rubric import templates as tpl
from jaxrubric.toy import digits_task as task
from jaxrubric.toy import final_eval
from jaxrubric.toy import signed_rubrics as sr
from jaxrubric.toy.genrubric_report import read_scores
from jaxrubric.toy.tokens import policy_prompt, template_ids
from jaxrubric.toy.verifier_sft import verifier_examples
from jaxrubric.toy.world_config import STATIC_RUNS
from jaxrubric.toy.world_runs import held_out_rows


def verifier_accuracy(workdir: str | Path, n: int = 512, seed: int = 1234,
                      malformed: bool = False, stray: float = 0.0) -> float:
    """Held-out accuracy of the saved verifier on fresh checker-labelled triples (a check that
    its warm start worked; the round reads the same yes/no probabilities); `malformed`: on
    criteria outside the language (accuracy = the share it says "no" to); `stray`: that share
    of the answers with a stray letter and of the criteria about one."""
    workdir = Path(workdir)
    tokenizer = jaxrubric.load_tokenizer(workdir / "tokenizer")
    model = jaxrubric.load_pretrained(workdir / "models" / "verifier")
    prompts, targets = verifier_examples(tokenizer, random.Random(seed), n, malformed, stray)
    template = tpl.verifier_template(tokenizer, style="compact")
    from jaxrubric.rubric.verifier import verifier_readout, yes_probability
    readout = verifier_readout(tokenizer, template)
    width = max(map(len, prompts))
    tokens = np.full((n, width), tokenizer.pad_token_id, np.int32)
    lengths = np.array([len(p) for p in prompts])
    for i, p in enumerate(prompts):
        tokens[i, :len(p)] = p
    mask = np.arange(width)[None] < lengths[:, None]
    logits = model(tokens, attention_mask=mask)[np.arange(n), lengths - 1]
    p_yes = np.asarray(yes_probability(logits, readout.yes_ids, readout.no_ids))
    labels = np.array([t[0] in readout.yes_ids for t in targets])
    return float(np.mean((p_yes > 0.5) == labels))


def _policy_answers(workdir: Path, run: str | None, samples: int, seed: int,
                    questions: int | None = None) -> list[tuple[dict, list[str]]]:
    """Each held-out row (the first `questions`; None: all) with `samples` answers of the
    policy of `run` (None: the warm start), sampled at temperature 1 as in a round."""
    from jaxrubric.train import export

    tokenizer = jaxrubric.load_tokenizer(workdir / "tokenizer")
    model_dir = workdir / "models" / "policy"
    if run is not None:
        model_dir = workdir / "exported" / run
        if not (model_dir / "config.json").exists():
            export(workdir / "runs" / run, "policy", model_dir, oracle=task.oracle_reward)
    rows = held_out_rows(workdir)[:questions]
    prompts = [policy_prompt(tokenizer, r["prompt"]) for r in rows]
    # 8 new tokens (a round allows `world_config.POLICY_TOKENS`): the diagnostics' figures in the
    # README and the docstrings were measured so; a longer answer is rare, and cut short here.
    return list(zip(rows, final_eval.sample_answers(model_dir, tokenizer, prompts,
                                                    samples=samples, seed=seed,
                                                    max_new_tokens=8)))


def mistakes_of(answer: str, prompt: str) -> dict[str, bool]:
    """Which kinds of mistake one answer makes: a big digit dropped, a small digit kept, a
    stray letter written, and the rest of it not the prompt's digits in their order (a digit
    repeated, moved or made up, or another character). `task.quality` halves an answer with
    either of the last two; an ``omits`` item can see a stray letter, no item the order."""
    digits = task.digits_of(prompt)
    letters_aside = "".join(c for c in answer if c not in task.STRAY_LETTERS)
    return {"drops_a_big_digit": any(d > "4" and d not in answer for d in digits),
            "keeps_a_small_digit": any(d <= "4" and d in answer for d in digits),
            "writes_a_letter": letters_aside != answer,
            "out_of_order": not task.in_order(letters_aside, prompt)}


def mistake_profile(workdir: str | Path, run: str | None = None, *, samples: int = 4,
                    seed: int = 7) -> dict[str, float]:
    """What the policy of `run` (its latest checkpoint; None: the warm start) gets wrong on
    the held-out questions: its mean quality, the part of it the criterion language can judge
    (`task.visible_quality`), and the share of its sampled answers making each kind of
    mistake of `mistakes_of`. This is what separates the runs' curves (a stale evaluator
    never penalises the mistake the policy learns after its warm start)."""
    quality, visible, mistakes = [], [], []
    for row, answers in _policy_answers(Path(workdir), run, samples, seed):
        for answer in answers:
            quality.append(task.quality(answer, row["prompt"]))
            visible.append(task.visible_quality(answer, row["prompt"]))
            mistakes.append(mistakes_of(answer, row["prompt"]))
    return {"quality": float(np.mean(quality)), "visible_quality": float(np.mean(visible)),
            **{kind: float(np.mean([m[kind] for m in mistakes])) for kind in mistakes[0]}}


# The sound items of the criterion language: `has` a big digit, `omits` a small one.
SOUND_ITEMS = {"has_big": ("has", lambda d: d > "4"), "omits_small": ("omits", lambda d: d <= "4")}


def item_signal_of(row: dict, answers: list[str]) -> dict[str, float]:
    """For each kind of sound item on one held-out row: its mean discriminability over the
    row's digits of that kind (checker verdicts, `p (1 - p)` over `answers`: the generator's
    J_disc of a one-item rubric), whether any of them tells the answers apart, and the mean
    anchor reward of the one-item rubric on the row's ranked anchor list."""
    from jaxrubric.rewards.dynamic_rubric import anchor_ranking

    digits = task.digits_of(row["prompt"])
    anchors = [a["answer"] for a in row["answers"]]
    ranks = np.array([a["rank"] for a in row["answers"]])
    out = {}
    for kind, (op, wanted) in SOUND_ITEMS.items():
        disc, anchor = [], []
        for d in (d for d in digits if wanted(d)):
            item = f"{op} {d}"
            p = np.mean([task.check(item, a) for a in answers])
            disc.append(p * (1 - p))
            scores = np.array([float(task.check(item, a)) for a in anchors])
            anchor.append(float(anchor_ranking(scores, ranks=ranks)))
        out.update({f"{kind}_disc": float(np.mean(disc)), f"{kind}_contested": max(disc) > 0,
                    f"{kind}_anchor": float(np.mean(anchor))})
    return out


def item_signal(workdir: str | Path, run: str | None = None, *, samples: int = 4,
                seed: int = 7) -> dict[str, float]:
    """`item_signal_of` averaged over the held-out rows, on `samples` answers per question of
    the policy of `run` (None: the warm start): which kind of sound item the evaluator's
    rewards would favour on that policy's own answers, whatever its generator writes."""
    rows = [item_signal_of(row, answers)
            for row, answers in _policy_answers(Path(workdir), run, samples, seed)]
    return {key: float(np.mean([r[key] for r in rows])) for key in rows[0]}


def _parse_rubric(text: str) -> list[tuple[float, str]]:
    """`[w] criterion` lines as (weight, criterion), lines of any other form skipped."""
    items = []
    for line in text.splitlines():
        weight, _, criterion = line.partition("] ")
        if weight.startswith("[") and criterion:
            items.append((float(weight[1:]), criterion))
    return items


def _sampled_rubrics(workdir: Path, run: str | None, questions: int, seed: int, groups: int,
                     answers_of: str | None = "run"
                     ) -> tuple[dict, list[tuple[dict, list[str], list[list[tuple[float, str]]]]]]:
    """The world's config, and per held-out question (the first `questions`): the K answers of
    the policy of `run` (its latest checkpoint; None: the warm start; `answers_of`: of that run
    instead) and `groups` rubrics the generator of `run` (None: the generator every run starts
    from) writes for them, grammar-constrained as in a round."""
    from jaxrubric.train import export

    cfg = json.loads((workdir / "toy_config.json").read_text())
    tokenizer = jaxrubric.load_tokenizer(workdir / "tokenizer")
    static = run in STATIC_RUNS
    generator_dir = workdir / "models" / ("generator_static" if static else "generator")
    if run is not None:
        generator_dir = workdir / "exported" / f"{run}_generator"
        if not (generator_dir / "config.json").exists():
            export(workdir / "runs" / run, "generator", generator_dir, oracle=task.oracle_reward)
    answered = _policy_answers(workdir, run if answers_of == "run" else answers_of,
                               cfg["num_responses"], seed, questions)
    rubrics = _written_rubrics(generator_dir, tokenizer, cfg,
                               [(row["prompt"], [] if static else shown)
                                for row, shown in answered],
                               groups, jax.random.fold_in(jax.random.key(seed), 1))
    return cfg, [(row, shown, written) for (row, shown), written in zip(answered, rubrics)]


def _written_rubrics(generator_dir: Path, tokenizer, cfg: dict,
                     shown: list[tuple[str, list[str]]], groups: int, key: jax.Array
                     ) -> list[list[list[tuple[float, str]]]]:
    """`groups` rubrics the generator at `generator_dir` writes for each (question, answers it
    is shown; none for a prompt-only generator), grammar-constrained as in a round, parsed."""
    from jaxrubric.rubric.grammar import POSITIVE_WEIGHTS, build_rubric_grammar
    from jaxrubric.sampling import generate

    template = tpl.dynamic_rubric_generator_template(
        tokenizer, len(shown[0][1]), max_items=cfg["max_items"], style="compact")
    grammar = build_rubric_grammar(tokenizer, weights=POSITIVE_WEIGHTS,
                                   max_items=cfg["max_items"],
                                   max_item_tokens=cfg["max_item_tokens"])
    out = generate(jaxrubric.load_pretrained(generator_dir),
                   [template_ids(template, tokenizer, prompt, *answers)
                    for prompt, answers in shown],
                   max_new_tokens=grammar.max_rubric_tokens, rng=key, num_samples=groups,
                   grammar=grammar, pad_id=tokenizer.pad_token_id)
    return [[_parse_rubric(tokenizer.decode(ids[:n], skip_special_tokens=True))
             for ids, n in zip(tokens, lengths)]
            for tokens, lengths in zip(np.asarray(out.tokens), np.asarray(out.lengths))]


def rubric_profile(workdir: str | Path, run: str | None = None, *, questions: int = 64,
                   seed: int = 7) -> dict[str, float]:
    """What the generator of `run` (its latest checkpoint; None: the generator every run starts
    from) writes for held-out questions and its run's policy's answers (the warm start's for
    None), grammar-constrained as in a round: the weighted share of its items inside the
    criterion language, and of those that catch each kind of mistake (``has`` a big digit:
    one dropped; ``omits`` a small digit: one kept) or reward one (``has`` small, ``omits``
    big; ``omits`` a stray letter: one written, ``has`` one: rewards it), and of those about
    a digit or letter the answers it is shown differ on ("contested": the only items that can
    tell them apart). A generator whose items leave the language is exploiting the verifier."""
    _, sampled = _sampled_rubrics(Path(workdir), run, questions, seed, groups=8)
    kinds = dict.fromkeys(("in_language", "has_big", "omits_small", "has_small", "omits_big",
                           "omits_letter", "has_letter", "contested"), 0.0)
    total = 0.0
    for row, shown, rubrics in sampled:
        differ = task.contested_symbols(row["prompt"], shown)
        for w, criterion in (item for rubric in rubrics for item in rubric):
            total += w
            if task.in_language(criterion):
                kinds["in_language"] += w
                op, symbol = criterion.split(" ")
                if symbol in task.STRAY_LETTERS:
                    kinds[f"{op}_letter"] += w
                else:
                    size = "big" if symbol > "4" else "small"
                    kinds[f"{op}_{size}"] += w * (symbol in task.digits_of(row["prompt"]))
                kinds["contested"] += w * (symbol in differ)
    return {name: value / max(total, 1.0) for name, value in kinds.items()}


# What tells a pair of answers apart (`pair_mistake`): one kind of `mistakes_of`, several, or
# the same kinds made to a different extent (two small digits kept against one).
PAIR_KINDS = ("drops_a_big_digit", "keeps_a_small_digit", "writes_a_letter", "out_of_order",
              "several", "same_kinds")


def pair_mistake(better: str, worse: str, prompt: str) -> str:
    """Which kind of mistake (`PAIR_KINDS`) tells two answers to `prompt` apart."""
    return _pair_kind(mistakes_of(better, prompt), mistakes_of(worse, prompt))


def _pair_kind(a: dict[str, bool], b: dict[str, bool]) -> str:
    differ = [kind for kind in a if a[kind] != b[kind]]
    return differ[0] if len(differ) == 1 else ("several" if differ else "same_kinds")


def rubric_score(rubric: list[tuple[float, str]], answer: str) -> float:
    """`Σ w v / Σ w` of one parsed rubric, the checker's verdicts in place of the verifier's
    (an item outside the language is met by nothing, as the verifier learned); 0 for a rubric
    with no item."""
    total = sum(w for w, _ in rubric)
    return sum(w * task.check(c, answer) for w, c in rubric) / total if total else 0.0


def gaps_by_mistake(sampled: list[tuple[str, list[str], list[list[tuple[float, str]]]]]
                    ) -> dict[str, float]:
    """Δgap (the paper's Eq. 2, as the round's evaluation measures it: per prompt, the policy
    score of each answer (the mean over its non-empty rubrics), then better minus worse over
    every pair the checker's quality orders) over (prompt, answers, rubrics) triples, with
    checker verdicts; and per `PAIR_KINDS` kind, its share of the pairs (``<kind>_share``) and
    their mean gap (``<kind>_gap``, 0 with no such pair): which mistakes the evaluator's
    scores separate, and how much of the Δgap is pairs no item can tell apart (order)."""
    gaps: dict[str, list[float]] = {kind: [] for kind in PAIR_KINDS}
    for prompt, answers, rubrics in sampled:
        rubrics = [r for r in rubrics if r]
        if not rubrics:
            continue
        scores = [np.mean([rubric_score(r, a) for r in rubrics]) for a in answers]
        quality = [task.quality(a, prompt) for a in answers]
        kinds = [mistakes_of(a, prompt) for a in answers]
        for i, j in itertools.permutations(range(len(answers)), 2):
            if quality[i] > quality[j]:
                gaps[_pair_kind(kinds[i], kinds[j])].append(scores[i] - scores[j])
    every = [g for kind in PAIR_KINDS for g in gaps[kind]]
    out = {"delta_gap": float(np.mean(every)) if every else 0.0, "pairs": float(len(every))}
    for kind in PAIR_KINDS:
        out[f"{kind}_share"] = len(gaps[kind]) / max(len(every), 1)
        out[f"{kind}_gap"] = float(np.mean(gaps[kind])) if gaps[kind] else 0.0
    return out


def gap_by_mistake(workdir: str | Path, evaluator: str, answers_of: str | None = "run", *,
                   questions: int = 256, groups: int = 8, seed: int = 7) -> dict[str, float]:
    """`gaps_by_mistake` of the generator of run `evaluator` (its latest checkpoint) on the
    answers of its own run's policy, or of run `answers_of` (None: the warm start): the
    evaluator on a matched answer set, apart from the answers its run's policy came to write."""
    _, sampled = _sampled_rubrics(Path(workdir), evaluator, questions, seed, groups, answers_of)
    return gaps_by_mistake([(row["prompt"], shown, rubrics) for row, shown, rubrics in sampled])


def aim_of(sampled: list[tuple[str, list[str], list[list[tuple[float, str]]]]]
           ) -> dict[str, float]:
    """Where rubrics look, per (prompt, shown answers, rubrics written for them): the share of
    items in the criterion language; of those, the share about a digit the shown answers
    differ on (``contested``) against the share a digit drawn uniformly from the prompt would
    give (``chance``), and the share of the contested ones with the sound sign
    (``sound_contested``). Items are counted, not weighted: this is where the writer aims.
    ``names_the_letter``: of the rubrics written for answers holding a stray letter, the share
    with an item in the language about one of those letters: whether the writer reads the
    letter off the answers (0 when no shown answer holds one)."""
    items = in_language = contested = sound = lettered = named = 0
    chance = 0.0
    for prompt, shown, rubrics in sampled:
        differ = set(task.contested_symbols(prompt, shown))
        share = len(differ) / len(task.digits_of(prompt))
        held = task.stray_letters_in(shown)
        if held:
            lettered += len(rubrics)
            named += sum(any(task.in_language(c) and c.split(" ")[1] in held for _, c in rubric)
                         for rubric in rubrics)
        for _, criterion in (item for rubric in rubrics for item in rubric):
            items += 1
            if not task.in_language(criterion):
                continue
            in_language += 1
            chance += share
            digit = criterion.split(" ")[1]
            if digit in differ:
                contested += 1
                sound += criterion == task.sound_item(digit)
    return {"in_language": in_language / max(items, 1),
            "contested": contested / max(in_language, 1),
            "chance": chance / max(in_language, 1),
            "sound_contested": sound / max(contested, 1),
            "names_the_letter": named / max(lettered, 1)}


def generator_aim(workdir: str | Path, generator: str | Path = "models/generator_cold", *,
                  questions: int = 128, groups: int = 8, seed: int = 5,
                  stray: float = 0.0) -> dict[str, float]:
    """`aim_of` a saved answer-seeing generator (a path, or one relative to `workdir`) on
    fresh questions, each shown K answers with a digit or more they differ on (the cold
    start's teacher answers, `digits_task.policy_warm_start_answer` with "flips"): does it
    write items about what its shown answers differ on, the only items that can tell them
    apart? Its SFT teacher puts those first; a cold start trained too short aims at chance
    (`contested` no higher than `chance`) and writes much out of the language. `stray`: that
    share of the shown answers hold a stray letter (`names_the_letter`)."""
    workdir = Path(workdir)
    cfg = json.loads((workdir / "toy_config.json").read_text())
    rng = random.Random(seed)
    rows = []
    while len(rows) < questions:
        prompt, _ = task.make_prompt(rng)
        shown = [task.policy_warm_start_answer(prompt, rng, cfg["policy_p_correct"], "flips",
                                               stray) for _ in range(cfg["num_responses"])]
        if task.contested_symbols(prompt, shown):
            rows.append((prompt, shown))
    rubrics = _written_rubrics(workdir / generator, jaxrubric.load_tokenizer(workdir / "tokenizer"),
                               cfg, rows, groups, jax.random.key(seed))
    return aim_of([(prompt, shown, written) for (prompt, shown), written in zip(rows, rubrics)])


def checker_advantages(rubrics: list[list[tuple[float, str]]], answers: list[str], row: dict,
                       max_items: int) -> np.ndarray:
    """The generator's advantages `[G]` of one question's rubrics (the paper's advantage-level
    combination of discriminability over `answers` and the anchor reward on the row's ranked
    list, `rewards.dynamic_rubric`), with the checker's verdicts in place of the verifier's."""
    from jaxrubric.rewards.dynamic_rubric import (anchor_ranking, discriminability,
                                                  generator_advantages)

    anchors = [a["answer"] for a in row["answers"]]
    groups = len(rubrics)
    verdicts = np.zeros((groups, len(answers), max_items))
    weights, mask = np.zeros((groups, max_items)), np.zeros((groups, max_items), bool)
    anchor_scores = np.zeros((groups, len(anchors)))
    for g, rubric in enumerate(rubrics):
        for m, (w, criterion) in enumerate(rubric[:max_items]):
            weights[g, m], mask[g, m] = w, True
            verdicts[g, :, m] = [task.check(criterion, a) for a in answers]
        anchor_scores[g] = [rubric_score(rubric[:max_items], a) for a in anchors]
    ranks = np.broadcast_to(np.array([a["rank"] for a in row["answers"]]), anchor_scores.shape)
    return np.asarray(generator_advantages(
        discriminability(verdicts, weights, mask),
        anchor_ranking(anchor_scores, ranks=ranks), mask.any(-1)))


def item_edit_advantage(workdir: str | Path, run: str, *, questions: int = 128,
                        seed: int = 11) -> dict[str, float]:
    """Would the generator's rewards favour the item it does not write? On each held-out
    question where some of the run's policy's answers drop a big digit d, every rubric its
    generator wrote has its lowest-weight item replaced by `has d` (the sound sign) or
    `omits d` (the one that rewards dropping it), the other rubrics as written; returns, per
    edit, the mean change of the edited rubric's advantage (`checker_advantages`), its
    standard error, and the share of edits that raise it."""
    cfg = json.loads((Path(workdir) / "toy_config.json").read_text())
    _, sampled = _sampled_rubrics(Path(workdir), run, questions, seed, groups=cfg["num_rubrics"])
    changes: dict[str, list[float]] = {"has": [], "omits": []}
    for row, shown, rubrics in sampled:
        big = [d for d in task.contested_symbols(row["prompt"], shown) if task.is_big_digit(d)]
        if not big:
            continue
        base = checker_advantages(rubrics, shown, row, cfg["max_items"])
        for g, rubric in enumerate(rubrics):
            if not rubric:
                continue
            low = min(range(len(rubric)), key=lambda i: rubric[i][0])
            for op in changes:
                edited = list(rubric)
                edited[low] = (rubric[low][0], f"{op} {big[0]}")
                advantages = checker_advantages([*rubrics[:g], edited, *rubrics[g + 1:]], shown,
                                                row, cfg["max_items"])
                changes[op].append(float(advantages[g] - base[g]))
    out = {}
    for op, values in changes.items():
        v = np.asarray(values)
        out.update({f"{op}_change": float(v.mean()),
                    f"{op}_change_se": float(v.std() / np.sqrt(len(v))),
                    f"{op}_raises": float((v > 0).mean())})
    return out


def rubric_coverage(workdir: str | Path, run: str = "evolving") -> dict[int, dict[str, float]]:
    """Per evaluated round of a GenRubric world's `run`, what its sampled held-out rubrics say
    about their query (`eval_scores.jsonl`; the greedy rubric, written last, is left out):
    items per rubric; the share of items in the criterion language; of those, the share about
    a digit the query does not have (``absent``: no answer can differ on it) and the share that
    repeat a digit an earlier item names (``repeated``); the share of items on the query's
    digits that the expert rubric agrees with (``sound``); the distinct query digits a rubric
    names (``distinct_digits``) and those its net instruction gets right (``sound_digits``:
    what the answerer follows, `signed_rubrics.keep_votes`). Agreement with the expert rubric
    is bounded by the last two: a rubric of 4 items names at most 4 of a query's 7 digits."""
    workdir = Path(workdir)
    # The held-out rows and logged scores as the world's summary reads them (the same loader;
    # after a resume, the later row of a round and query).
    prompts = {r.id: prompt_text(r.messages)
               for r in load_healthbench(workdir / "data" / "eval.jsonl").records}
    coverage = {}
    for round_, rows in read_scores(workdir / "runs" / run).items():
        out: dict[str, list[float]] = defaultdict(list)
        for row in rows:
            prompt = prompts[row["id"]]
            digits = task.digits_of(prompt)
            for rubric in row["rubrics"][:-1]:
                items = [(criterion, weight) for weight, criterion in rubric]
                in_language = [task.in_language(c) for c, _ in items]
                named = [c[-1] for (c, _), ok in zip(items, in_language) if ok]
                out["items"].append(len(items))
                out["in_language"] += in_language
                out["absent"] += [d not in digits for d in named]
                out["repeated"] += [d in named[:i] for i, d in enumerate(named)]
                out["sound"] += [ok for item in items
                                 if (ok := sr.item_soundness(prompt, item)) is not None]
                out["distinct_digits"].append(len({d for d in named if d in digits}))
                votes = [sr.keep_votes(items, d) for d in digits]
                out["sound_digits"].append(sum(v != 0 and (v > 0) == (d > "4")
                                               for v, d in zip(votes, digits)))
        coverage[round_] = {name: float(np.mean(values)) if values else float("nan")
                            for name, values in out.items()}
    return coverage
