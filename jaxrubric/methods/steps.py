"""The steps both methods' stages are made of: the generator writing rubrics (and an explorer
writing its share), and the verifier judging answers under them."""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxrubric import sampling
from jaxrubric.methods import shapes
from jaxrubric.methods.data import Question
from jaxrubric.methods.setup import RoundSetup
from jaxrubric.models.transformer import Decoder
from jaxrubric.rubric import grammar as grammar_lib
from jaxrubric.rubric import templates as tpl
from jaxrubric.rubric import verifier as ver


class Rubrics(NamedTuple):
    """What a write stage returns: the rubrics, the prompts they were written after, parsed."""

    prompt: tpl.Packed  # the generator's prompts [B, Lg], left-padded
    samples: sampling.SampleResult  # [B, G, Lrub]
    parsed: grammar_lib.ParsedRubric


def write_rubrics(setup: RoundSetup, generator: Decoder, prompt: tpl.Packed, key: jax.Array,
                  explorer: tuple[Decoder, int, jax.Array] | None = None) -> Rubrics:
    """The generator samples G grammar-constrained rubrics per (left-padded) prompt, parsed;
    with an `explorer` `(model, m, key)` (DynamicRubric's `explorer_rubrics`) it samples G - m
    and the explorer the last m."""
    cfg = setup.config

    def write(model: Decoder, count: int, key: jax.Array) -> sampling.SampleResult:
        return sampling.sample(
            model, prompt.tokens, prompt.mask, prompt.lengths, key,
            num_samples=count, max_new_tokens=setup.grammar.max_rubric_tokens,
            temperature=cfg.generator.temperature, grammar=setup.grammar,
            micro_batches=cfg.rollout_micro_batches)

    explored = 0 if explorer is None else explorer[1]
    rubrics = write(generator, cfg.num_rubrics - explored, key)
    if explorer is not None:
        extra = write(*explorer)
        rubrics = jax.tree.map(lambda a, b: jnp.concatenate([a, b], axis=1), rubrics, extra)
    return Rubrics(prompt, rubrics,
                   grammar_lib.parse_rubric_tokens(rubrics.tokens, setup.grammar, setup.pad_id))


def text_lengths(samples: sampling.SampleResult) -> jax.Array:
    """Sampled lengths without the stop token (what a template splices in)."""
    return samples.lengths - samples.finished.astype(jnp.int32)


def judge_answers(setup: RoundSetup, verifier: Decoder, question: Question, answers: jax.Array,
                  answer_len: jax.Array, parsed: grammar_lib.ParsedRubric, item_valid: jax.Array,
                  name: str) -> jax.Array:
    """Verdicts `[B, N, G, M]` of answers `[B, N, L]` under every valid item: one tree forward
    per (question, answer); 0/1, or p_yes with `soft_verdicts`. `name` says what is judged
    (the pass's name where the round's shapes are read, `shapes.verified`)."""
    prefix = ver.verifier_prefix(setup.verifier_template, question.tokens, question.lengths,
                                 answers, answer_len, pad_id=setup.pad_id)
    items = parsed.items.shape
    shapes.verified(name, math.prod(answers.shape[:-1]), prefix.tokens.shape[-1],
                    items[-3] * items[-2], items[-1] + len(setup.readout.suffix),
                    len(setup.readout.token_ids))
    out = ver.verify(verifier, setup.readout, prefix.tokens, prefix.lengths, parsed.items,
                     parsed.item_lengths, item_valid, pad_id=setup.pad_id,
                     micro_batches=setup.config.rollout_micro_batches)
    return out.p_yes if setup.config.soft_verdicts else out.verdicts.astype(jnp.float32)
