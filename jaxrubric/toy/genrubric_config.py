"""The GenRubric toy world's settings (`GenRubricWorldConfig`) and the names of its runs.

Each setting's comment says why it has its value; what each was measured to do, with the
commands, is in the docs (`docs/toy_worlds_measured.md`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from jaxrubric.methods.genrubric import GenRubricConfig
from jaxrubric.methods.round_config import RoleConfig
from jaxrubric.toy import config_tree
from jaxrubric.toy.runs import TOY_ROUND
from jaxrubric.toy.verifier_sft import VerifierSettings

RUNS = ("evolving", "control")
VERIFIER = VerifierSettings()  # the verifier's defaults, one for both worlds


def world_round() -> GenRubricConfig:
    """Both runs' round (`GenRubricWorldConfig.round`)."""
    # Sampling temperatures. At 1 the character-level cold start writes some of its items
    # outside the criterion language (the tails of a short SFT), and GRPO's noise walks it
    # further out; at 0.7 it writes almost all in the language (held-out rubrics are sampled at
    # it too). The frozen answerer at 0.5 follows the rubric it is shown better and still
    # tosses a fair coin where no item speaks, so the induced response says more about its
    # rubric: comprehensiveness has less noise.
    # Advantages "no_std" for both roles: each query's rewards centred without dividing by their
    # spread, so a query whose rubrics earn nearly the same comprehensiveness (coin flips, not
    # rubric quality) moves the generator little; z-scored, it got full-size advantages.
    return GenRubricConfig(
        **TOY_ROUND,
        # G: groups per query, each inducing one answer and judging the others' (with half as
        # many the comprehensiveness signal drowned in its noise)
        num_rubrics=12,
        # Each group's comprehensiveness averaged over two responses it induced (the paper:
        # one). The answerer flips a coin on every digit no item names, and much of a group's
        # reward is that noise: two halve it, and the rise grew.
        induced_responses=2,
        # The answerer is frozen: it stays the one the rubrics were checked with
        # (`answerer_follows`).
        policy=RoleConfig(temperature=0.5, advantage_mode="no_std", freeze=True),
        # KL to its cold start: without it the character-level generator collapsed into text
        # outside the language.
        generator=RoleConfig(temperature=0.7, beta=0.04, advantage_mode="no_std"),
        discrimination_spread="pairs",
        # The reward's terms: comprehensiveness alone (the paper's ablation). Here the
        # discrimination terms pay an item for contradicting the other rubrics, the only way to
        # split answers that follow them (docs/history.md).
        comprehensiveness_coef=1.0, discrimination_coef=0.0, discriminative_coef=0.0,
        nonredundant_coef=0.0)
# What the warm starts (and the answerer's rubric-following check) read: a config keeps only
# these for them (`starts_only`), so starts made for one config serve every config that
# agrees on these.
START_SETTINGS = ("seed", "max_items", "max_item_tokens", "teacher_informed", "verifier_steps",
                  "verifier_malformed", "answerer_steps", "answerer_lr", "answerer_follows",
                  "answerer_stages", "generator_steps", "sft_batch", "sft_lr",
                  "round.policy.temperature", "hidden_size", "num_layers", "answerer_hidden_size",
                  "answerer_layers")


@dataclasses.dataclass(frozen=True)
class GenRubricWorldConfig:
    """Sizes and budgets of the GenRubric toy world."""

    seed: int = 0
    # GenRubric rounds of each run: with two induced responses per group (below) the rise is
    # there by this round, and longer runs did not raise it further.
    rounds: int = 40
    eval_every: int = 20
    # Queries per round: with fewer a run walked far between evaluations and a training draw
    # could end below its cold start; each update here averages twice the rubrics.
    batch_size: int = 16
    max_items: int = 4
    max_item_tokens: int = 7
    eval_queries: int = 128  # held-out rows, 8 responses each
    eval_rubric_runs: int = 4  # R sampled rubrics per held-out query (plus a greedy one)
    # Generator cold start: share of items drawn sound, the rest random (half of those sound
    # too). Much higher and soundness had nowhere to go (the rise came from writing more items
    # only); from here it has room to rise. Before the temperature, KL and 12 groups below,
    # this share drifted away from sound items.
    teacher_informed: float = 0.5
    # The verifier's warm start: the DynamicRubric world's (`VerifierSettings` says why).
    verifier_steps: int = VERIFIER.verifier_steps
    verifier_malformed: float = VERIFIER.verifier_malformed
    # The answerer trains in stages of `answerer_steps` (each a warm-up and cosine decay of
    # `answerer_lr`) until it follows at least `answerer_follows` of the digits a fresh rubric
    # names (`follows`), at most `answerer_stages` of them: the world's signal is only
    # there when it follows. After one stage the answerers of some seeds followed far less
    # (uniformly across item kinds: the lookup half learned), and their GenRubric runs fell
    # below the cold start.
    answerer_steps: int = 800
    answerer_lr: float = 2e-3
    answerer_follows: float = 0.8
    answerer_stages: int = 4
    generator_steps: int = 300
    sft_batch: int = 64
    sft_lr: float = 1e-3
    # Slower left a seed flat for its first evaluations; faster did worse on most draws.
    generator_lr: float = 4e-4
    # config.optim.lr_schedule: a cosine decay to a tenth did not steady the weakest seed.
    generator_lr_schedule: str = "constant"
    # The round of both runs (the control's shuffled credit aside, `genrubric_world.run_round`).
    round: GenRubricConfig = dataclasses.field(default_factory=world_round)
    hidden_size: int = 64
    num_layers: int = 2
    # Following a rubric is a lookup (which item names this digit, with which sign): a wider
    # answerer learns it in fewer steps than a deeper one.
    answerer_hidden_size: int = 128
    answerer_layers: int = 2
    runs: tuple[str, ...] = RUNS
    bootstrap: int = 2000  # resamples of the queries for the intervals

    def __post_init__(self) -> None:
        if isinstance(self.round, Mapping):  # the round as saved (JSON), e.g. toy_config.json
            object.__setattr__(self, "round", GenRubricConfig.from_tree(self.round))
        unknown = set(self.runs) - set(RUNS)
        if unknown:
            raise ValueError(f"unknown GenRubric toy runs {sorted(unknown)}; choose from {RUNS}")

    def verifier_settings(self) -> VerifierSettings:
        """The verifier this world uses: the DynamicRubric world's, trained on this world's
        settings where it has them."""
        return VerifierSettings(seed=self.seed, max_item_tokens=self.max_item_tokens,
                                verifier_steps=self.verifier_steps,
                                verifier_malformed=self.verifier_malformed,
                                sft_batch=self.sft_batch, sft_lr=self.sft_lr)

    def starts_only(self) -> GenRubricWorldConfig:
        """This config with everything but `START_SETTINGS` at its default: all that the warm
        starts are given, so that they can read nothing else."""
        return config_tree.replace(GenRubricWorldConfig(), self.start_settings())

    def start_settings(self) -> dict[str, Any]:
        """What the stages before the runs read, by dotted name (the shipped starts' key,
        `toy/warm_starts.py`)."""
        return {name: config_tree.setting(self, name) for name in START_SETTINGS}
