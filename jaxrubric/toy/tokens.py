"""Token ids of the toy worlds' texts, spliced as a round splices them: every warm start's
examples, the final evaluation's prompts and the diagnostics build their inputs here."""

from __future__ import annotations

import functools
from typing import Any

from jaxrubric.rubric import templates as tpl


def text_ids(tokenizer: Any, text: str) -> list[int]:
    """`text` encoded without special tokens."""
    return list(_encoded(tokenizer, text))


# The toy's criteria and short answers repeat, and a call through the tokenizer's Python
# wrapper is slow next to a toy model's step: memoised, the warm starts' batches cost several
# times less host time.
@functools.lru_cache(maxsize=1 << 16)
def _encoded(tokenizer: Any, text: str) -> tuple[int, ...]:
    return tuple(tokenizer.encode(text, add_special_tokens=False))


def template_ids(template: tpl.TokenTemplate, tokenizer: Any, *texts: str) -> list[int]:
    """The template's token ids with ``texts`` in its slots, spliced as the round splices."""
    ids = list(template.segments[0])
    for text, segment in zip(texts, template.segments[1:]):
        ids += text_ids(tokenizer, text) + list(segment)
    return ids


def policy_prompt(tokenizer: Any, question: str) -> list[int]:
    """A question as the policy reads it: one chat-templated user turn."""
    chat = tokenizer.apply_chat_template([{"role": "user", "content": question}],
                                         add_generation_prompt=True, tokenize=False)
    return text_ids(tokenizer, chat)
