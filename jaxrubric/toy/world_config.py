"""The DynamicRubric toy world's settings (`ToyWorldConfig`) and the names of its runs.

Each setting's comment says why it has its value; what each was measured to do, with the
commands, is in the docs (`docs/toy_worlds_measured.md`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from jaxrubric.methods.dynamic_rubric import DynamicRubricConfig
from jaxrubric.methods.round_config import RoleConfig
from jaxrubric.toy import digits_task as task
from jaxrubric.toy.runs import TOY_ROUND
from jaxrubric.toy.verifier_sft import VerifierSettings

RUNS = ("coevolve", "frozen", "static", "oracle")
# The leads the final evaluation reports: each learned evaluator's and the ceiling's over the
# two baselines.
LEADS = (("coevolve", "frozen"), ("coevolve", "static"), ("oracle", "frozen"),
         ("oracle", "static"))
POLICY_TOKENS = 16  # the longest answer a policy writes, in rounds and in the final evaluation
TEACHER_FOCUS = ("contested", "prompt")
GENERATOR_REFERENCES = ("run_start", "cold_start")  # ToyWorldConfig.generator_reference
# The runs whose generator sees only the prompt (DynamicRubric's static baseline).
STATIC_RUNS = ("static",)
# Settings the stages before the compared runs (warm starts, the generators' own rounds, the
# stale evaluator) do not read: starts made for one value serve every other.
RUN_ONLY_SETTINGS = ("runs", "final_samples", "rounds")
VERIFIER = VerifierSettings()  # the verifier's defaults, one for both worlds


def world_round() -> DynamicRubricConfig:
    """The compared runs' round, before each run's own switches (`world_runs.run_round`)."""
    return DynamicRubricConfig(
        **TOY_ROUND,
        num_rubrics=8,  # G: a large group gives the generator's GRPO a usable baseline
        num_responses=4,  # K
        # "mean" over the valid groups, as the 8B recipes. "best_group" (the group the
        # generator's advantage ranks first) picks it on the current answers, which lets a
        # prompt-only or frozen generator adapt through the selection.
        policy_score="mean",
        anchor_weight=1.0,  # lambda of the generator's reward
        # KL to its warm start, the recipes' 0.01. Without one the policy's reward kept rising
        # while its held-out quality fell under most learned evaluators (it finds what the
        # rubrics miss). Its rubric scores become advantages as "no_std": each prompt's scores
        # centred without dividing by their spread (Dr. GRPO's form), so the policy's step
        # follows the size of the score gaps, not only their order: the regime in which
        # DynamicRubric's claim that closing gaps starve the policy can show in its quality.
        # With "group_std" (the 8B recipes') every evaluator's gaps became full-size advantages
        # as long as their order was right, and the stale run reached the ceiling
        # (docs/history.md). Adam keeps the step's overall scale, so the first rounds train
        # about as before.
        policy=RoleConfig(beta=0.01, advantage_mode="no_std"),
        # KL to its reference (the 8B recipes use 0.01), "sampled" (k3 on the tokens it
        # writes), at temperature 1, with no entropy bonus, in every run and in the generators'
        # own rounds. The reference is the role's weights at the start of each run: the cold
        # start for the generator's own rounds, their result for the compared runs
        # (`ToyWorldConfig.generator_reference`). Without one the character-level generator
        # drifts out of the criterion language.
        generator=RoleConfig(beta=0.04, kl="sampled", temperature=1.0, entropy=0.0),
        # Of the G rubrics, how many the generator's SFT cold start writes in every run and in
        # the generators' own rounds: judged and rewarded with the group, learned from, never
        # scoring the policy (frozen and oracle runs sample them too, unused, so every run
        # compiles the same program). None by default: they did not bring a lost item back
        # (docs/history.md).
        explorer_rubrics=0,
        item_credit=0.0,  # item-level credit on the generators' item tokens, in every run
        # Which roles train and what rewards the policy are inputs of the compiled round, so
        # the generators' rounds and the compared runs share two programs (dynamic and static
        # rubrics) through the compilation cache instead of compiling one each.
        runtime_switches=True)


@dataclasses.dataclass(frozen=True)
class ToyWorldConfig:
    """Sizes and budgets of the DynamicRubric toy world; the world's `timings.json` splits
    its time by stage."""

    seed: int = 0
    # Co-evolution rounds of each compared run: staleness takes time to show, so the runs
    # last until the stale evaluator's gaps have fallen below the co-evolving one's.
    rounds: int = 90
    # The generators' rounds against the warm-started policy before the compared runs start.
    # Few: more wore down the items the co-evolving generator later needs (`has <big digit>`,
    # the check on the mistake the policy makes next).
    generator_rounds: int = 10
    # The stale evaluator's further rounds against the warm-started policy: the frozen run's
    # generator is the same generator-only run continued this long, so it has trained as long
    # as the co-evolving generator will (generator_rounds + rounds), on the start's answers
    # alone. 0: the frozen run keeps the generator the co-evolving run starts from.
    stale_rounds: int = 90
    eval_every: int = 30  # held-out evaluations at rounds 0, 30, 60 and 90
    batch_size: int = 8  # prompts per round
    # Held-out prompts per evaluation, K answers each (`eval/quality_se`: the standard error of
    # a run's quality, clustered by question).
    eval_batch_size: int = 256
    # The final evaluation (`toy/final_eval.py`): every run's last policy answers each of those
    # questions this many times, every run with the same sampling draws, so two runs' quality
    # difference is paired by question: the training-time evaluations' 4 answers per question
    # leave too wide an interval on the difference of two runs near the ceiling.
    final_samples: int = 16
    max_items: int = 4
    max_item_tokens: int = 7
    num_anchors: int = 3
    # The anchor lists' answers (`digits_task.anchor_answers`): "covering" (one of each kind of
    # single mistake), "distinct" (random noisy answers of distinct quality) or "every_digit"
    # (every single mistake; num_anchors 8: the correct answer and one per digit).
    anchors: str = "covering"
    policy_p_correct: float = 0.3  # warm start: share of correct answers in its targets
    teacher_informed: float = 0.5  # generator cold start: share of sound rubric items
    # Of its items about the contested digits (teacher_focus "contested"): the share with the
    # sound sign. At 1 the cold start reads its answers both ways: "has <big digit>" where one
    # of them drops it, "omits <small digit>" where one keeps it.
    teacher_focus_informed: float = 1.0
    # The verifier's warm start (`VerifierSettings` says why each value).
    verifier_steps: int = VERIFIER.verifier_steps
    verifier_items: int = VERIFIER.verifier_items
    verifier_malformed: float = VERIFIER.verifier_malformed
    verifier_stray: float = VERIFIER.verifier_stray
    # The policy's warm start: long enough that it writes answers in the task's format. A
    # shorter one (its loss still falling) wrote most answers out of order or with a character
    # that is not a digit (`diagnostics.mistake_profile`), a mistake no `has`/`omits` item can
    # see, which then drifted under every learned evaluator and dominated the runs'
    # differences; at this length its loss is flat and it makes the mistake the world is built
    # on: it keeps small digits, and seldom drops a big one.
    policy_steps: int = 1000
    # Share of the policy's warm-start targets (and of the answers the answer-seeing
    # generator's cold start is shown) with a stray letter: a mistake of 9 kinds that the
    # prompt does not foretell and the answers show. Without one every mistake of the world
    # could be listed from the prompt, and the prompt-only evaluator's run was level with the
    # ground truth's.
    policy_stray: float = 0.25
    # The generators' warm starts: long enough, at a high enough rate, that the answer-seeing
    # one writes in the criterion language and aims its items at what its shown answers differ
    # on (`diagnostics.generator_aim`): shorter or slower ones aimed at chance or below. Aim is
    # the last thing its SFT learns, and reading a stray letter off the answers last of all
    # (`generator_aim(w, stray=0.25)`'s `names_the_letter`), which keeps improving to here.
    generator_steps: int = 1000
    generator_sft_lr: float = 3e-3
    sft_batch: int = 64
    sft_lr: float = 1e-3  # the verifier's and the policy's warm starts
    policy_lr: float = 1e-4
    generator_lr: float = 5e-4
    # The stale-evaluator setting: the warm-started policy copies too much (it keeps small
    # digits, never drops a big one). The generator's cold start knows both kinds of sound
    # item ("omits" a small digit, "has" a big one): with "omits" alone the co-evolving
    # generator never wrote "has <big digit>" again. See `jaxrubric.toy.world`.
    policy_mistakes: str = "keeps_small"  # digits_task.policy_warm_start_answer
    teacher_sound: str = "both"  # digits_task.sound_criterion kinds of the cold start
    # Where the answer-seeing generator's cold-start items look: "contested" (first the digits
    # its shown answers differ on, `digits_task.contested_symbols`) or "prompt" (any digit).
    teacher_focus: str = "contested"
    # The mistakes of the answers the cold start shows it (`digits_task.POLICY_MISTAKES`):
    # those of the warm-started policy ("keeps_small"), or "flips" (any digit, so the
    # contested digits are big as often as small: the cold start sees both kinds of mistake).
    teacher_mistakes: str = "flips"
    # The compared runs' generator KL reference: "run_start" (the generator they start from,
    # after its own rounds) or "cold_start" (its SFT cold start, as RLHF keeps its SFT model:
    # the only start that still writes every kind of sound item).
    generator_reference: str = "run_start"
    # The round of every run and of the generators' own rounds: each run's switches (a frozen
    # role, the prompt-only generator, the ground truth as reward) are applied to it.
    round: DynamicRubricConfig = dataclasses.field(default_factory=world_round)
    hidden_size: int = 64
    num_layers: int = 2
    verifier_hidden_size: int = VERIFIER.verifier_hidden_size
    verifier_layers: int = VERIFIER.verifier_layers
    runs: tuple[str, ...] = RUNS

    def __post_init__(self) -> None:
        if isinstance(self.round, Mapping):  # the round as saved (JSON), e.g. toy_config.json
            object.__setattr__(self, "round", DynamicRubricConfig.from_tree(self.round))
        unknown = set(self.runs) - set(RUNS)
        if unknown:
            raise ValueError(f"unknown toy runs {sorted(unknown)}; choose from {RUNS}")
        if self.final_samples < 1:
            raise ValueError("ToyWorldConfig.final_samples must be >= 1 (answers per question "
                             f"in the final evaluation), got {self.final_samples}")
        if self.generator_rounds < 1 or self.stale_rounds < 0:
            raise ValueError("ToyWorldConfig.generator_rounds must be >= 1 and stale_rounds "
                             f">= 0, got {self.generator_rounds} and {self.stale_rounds}")
        for name, allowed in (("policy_mistakes", task.POLICY_MISTAKES),
                              ("teacher_sound", task.SOUND_KINDS),
                              ("teacher_mistakes", task.POLICY_MISTAKES),
                              ("teacher_focus", TEACHER_FOCUS),
                              ("generator_reference", GENERATOR_REFERENCES),
                              ("anchors", task.ANCHOR_KINDS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"ToyWorldConfig.{name} {getattr(self, name)!r} is not one of "
                                 f"{allowed}")

    def verifier_settings(self) -> VerifierSettings:
        """What the verifier's warm start reads of this config."""
        return VerifierSettings(**{f.name: getattr(self, f.name)
                                   for f in dataclasses.fields(VerifierSettings)})

    def start_settings(self) -> dict[str, Any]:
        """What the stages before the compared runs read: everything but `RUN_ONLY_SETTINGS`
        (the shipped starts' key, `toy/warm_starts.py`), the round as a nested mapping."""
        settings = dataclasses.asdict(self)
        for name in RUN_ONLY_SETTINGS:
            del settings[name]
        return settings
