"""The `Method` interface: everything that differs between DynamicRubric and GenRubric. Each
method (`dynamic_rubric.py`, `genrubric.py`) is one: its checks, its setup, its round in
data-flow order (whose stages' shapes are read by tracing it, `shapes.traced_shapes`) and its
held-out evaluation."""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import jax

from jaxrubric.methods.data import Frozen, RoundBatch, RoundResult, RoundState
from jaxrubric.methods.round_config import RoundConfig
from jaxrubric.methods.setup import Models, Optimizers, RoundSetup, setup_fields
from jaxrubric.methods.shapes import RoundShapes, traced_shapes
from jaxrubric.rubric import grammar as grammar_lib
from jaxrubric.rubric import templates as tpl


def verifier_messages(style: str) -> tuple[list[dict[str, str]], tuple[str, ...]]:
    """The verifier template as messages with slot markers, and its slots (both methods')."""
    mark = tpl.slot_marker
    return (tpl.verifier_messages(mark("prompt"), mark("response"), mark("criterion"),
                                  style=style), ("prompt", "response", "criterion"))


class Method(abc.ABC):
    """A co-evolution method: everything that differs between DynamicRubric and GenRubric.

    The registry (`jaxrubric.methods`) maps `config.method` to one instance; training, FLOPs,
    plans and the toy world ask it, and nothing else reads `config.method`.
    """

    name: ClassVar[str]
    weights: ClassVar[tuple[int, ...]]  # the rubric grammar's item weights
    evaluates: ClassVar[bool]  # whether the method has a held-out evaluation
    # Its held-out data when it is not anchor lists (GenRubric: expert-rubric rows): a type
    # with `from_config(config, tokenizer)` (`jaxrubric.eval.expert_agreement.ExpertRows`).
    held_out: ClassVar[Any] = None
    # What a stage's rollout samples, by stage name, where the plan tells a role's rollouts
    # apart (GenRubric's policy samples induced responses).
    rollout_labels: ClassVar[Mapping[str, str]] = {}

    def check_config(self, config: Any) -> None:
        """The method's own checks of a training config (`ml_collections`), before any model
        loads; raises ValueError naming the key. Default: none."""

    def check_round(self, config: RoundConfig,
                    oracle_reward: Callable[..., jax.Array] | None) -> None:
        """The method's checks of a round config (and of the oracle it is given), when its
        setup is built; raises ValueError. Default: none."""

    def build_setup(self, config: RoundConfig, tokenizer: Any, models: Models, *,
                    optimizers: Optimizers, max_items: int, max_item_tokens: int,
                    chat_template_kwargs: Mapping[str, Any] | None = None,
                    template_style: str = "full",
                    oracle_reward: Callable[..., jax.Array] | None = None) -> RoundSetup:
        """Templates, the grammar of the method's weights and answer ids from the shared
        tokenizer; graphs from the models."""
        self.check_round(config, oracle_reward)
        templates = self.templates(config, tokenizer, max_items=max_items,
                                   chat_template_kwargs=chat_template_kwargs,
                                   style=template_style)
        return RoundSetup(
            generator_template=templates["generator"],
            grammar=grammar_lib.build_rubric_grammar(
                tokenizer, weights=self.weights, max_items=max_items,
                max_item_tokens=max_item_tokens),
            induced_template=templates.get("induced"), oracle_reward=oracle_reward,
            **setup_fields(config, tokenizer, models, optimizers, chat_template_kwargs,
                           template_style))

    @abc.abstractmethod
    def round(self, setup: RoundSetup, state: RoundState, frozen: Frozen, batch: RoundBatch,
              rng: jax.Array) -> tuple[RoundState, RoundResult]:
        """One round (pure; `make_round_step` jits it; its stages run where
        `placement.running` places them)."""

    def evaluate(self, setup: RoundSetup, state: RoundState, frozen: Frozen,
                 batch: RoundBatch, rng: jax.Array) -> dict[str, jax.Array]:
        """Held-out metrics of the current models, no update."""
        raise NotImplementedError(f"{self.name} has no held-out evaluation")

    def gold_evaluate(self, setup: RoundSetup, state: RoundState, frozen: Frozen, gold: Any,
                      rng: jax.Array) -> dict[str, jax.Array]:
        """The gold metric on `config.data.gold`'s rows (`methods.gold.GoldBatch`), for the
        reward-hacking watch; only methods whose policy answers prompts have one."""
        raise NotImplementedError(f"{self.name} has no gold evaluation (config.data.gold)")

    @abc.abstractmethod
    def templates(self, config: RoundConfig, tokenizer: Any, *, max_items: int,
                  chat_template_kwargs: Mapping[str, Any] | None = None,
                  style: str = "full") -> dict[str, tpl.TokenTemplate]:
        """The round's templates by name (`generator`, `verifier`, and `induced` where the
        method has one), tokenised as its setup builds them."""

    @abc.abstractmethod
    def template_messages(self, config: RoundConfig, *, max_items: int, style: str = "full"
                          ) -> dict[str, tuple[list[dict[str, str]], tuple[str, ...]]]:
        """The same templates as chat messages with slot markers, and their slots in order:
        for estimating their lengths without a tokenizer (`jaxrubric plan`)."""

    def round_shapes(self, setup: RoundSetup, state: RoundState, frozen: Frozen,
                     batch: RoundBatch, rng: Any) -> RoundShapes:
        """Every stage of the round with its global shapes, in the order the round runs, read
        from the round traced on inputs of these shapes (never run)."""
        return traced_shapes(self.round, setup, state, frozen, batch, rng, self.rollout_labels)
