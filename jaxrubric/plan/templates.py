"""The method's templates from a config alone: tokenised when the tokenizer can be read
offline, else estimated from their text, so that a plan of a recipe whose tokenizer is not here
still traces its round with templates of about the right lengths (`plan.abstract`).

An estimate counts `CHARS_PER_TOKEN` characters per token plus the chat template's turn
markers; the plan says when it estimated. Those templates are a few hundred tokens next to
prompts and responses of thousands.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import ml_collections

from jaxrubric.config import round_config
from jaxrubric.methods.method import Method
from jaxrubric.rubric import templates as tpl

CHARS_PER_TOKEN = 4  # English prose under a 128k-150k BPE vocabulary: about 4 characters
CHAT_HEAD_TOKENS = 32  # chat-template tokens before the user text (Llama 3.1 adds a system turn)
CHAT_TAIL_TOKENS = 16  # end of turn + assistant header (+ Qwen3's empty think block)


def estimated_template(messages: list[dict[str, str]], slots: Sequence[str]
                       ) -> tpl.TokenTemplate:
    """A `TokenTemplate` whose constant segments have the estimated token counts of the
    plainly rendered text plus chat formatting (their ids are placeholders)."""
    text = tpl.render_chat(None, messages)
    pieces = []
    for slot in slots:
        head, text = text.split(tpl.slot_marker(slot), 1)
        pieces.append(head)
    pieces.append(text)
    counts = [-(-len(p) // CHARS_PER_TOKEN) for p in pieces]
    counts[0] += CHAT_HEAD_TOKENS
    counts[-1] += CHAT_TAIL_TOKENS
    return tpl.TokenTemplate(tuple(slots), tuple((0,) * n for n in counts), tuple(pieces))


def round_templates(config: ml_collections.ConfigDict, method: Method, tokenizer: Any
                    ) -> dict[str, tpl.TokenTemplate]:
    """The method's templates (`Method.templates`) with the real tokenizer when there is one,
    else estimated from their messages (`Method.template_messages`)."""
    rc, m, style = round_config(config), config.rubric.max_items, config.rubric.template_style
    if tokenizer is not None:
        return method.templates(rc, tokenizer, max_items=m, style=style,
                                chat_template_kwargs=dict(config.chat_template_kwargs) or None)
    return {name: estimated_template(messages, slots) for name, (messages, slots)
            in method.template_messages(rc, max_items=m, style=style).items()}
