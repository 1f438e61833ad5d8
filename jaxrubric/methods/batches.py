"""Host-side batch encoding: questions and anchor answers as the round's fixed-shape arrays."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from jaxrubric.methods.data import Anchors, PolicyPrompt, Question, RoundBatch


def encode_batch(tokenizer: Any, questions: list[str], anchors: list[list[str]], *,
                 prompt_tokens: int, policy_tokens: int, anchor_tokens: int,
                 num_anchors: int, anchor_ranks: list[list[int]] | None = None) -> RoundBatch:
    """Host side: questions and best-first anchor answers (with their reference ranks, ties
    allowed; None: strictly ordered) -> the round's fixed-shape batch (NumPy arrays).
    Anything longer than its budget is an error naming the row, never cut."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    b = len(questions)
    question = Question(np.full((b, prompt_tokens), pad, np.int32), np.zeros((b,), np.int32))
    policy = PolicyPrompt(np.full((b, policy_tokens), pad, np.int32),
                          np.zeros((b, policy_tokens), bool), np.zeros((b,), np.int32))
    anchor = Anchors(np.full((b, num_anchors, anchor_tokens), pad, np.int32),
                     np.zeros((b, num_anchors), np.int32), np.zeros((b, num_anchors), bool),
                     np.zeros((b, num_anchors), np.int32))

    def fit(ids, limit, what, row):
        if len(ids) > limit:
            raise ValueError(f"row {row}: {what} has {len(ids)} tokens, the budget is {limit}")
        if not ids:
            raise ValueError(f"row {row}: {what} is empty")
        return ids

    for i, text in enumerate(questions):
        ids = fit(tokenizer(text, add_special_tokens=False)["input_ids"], prompt_tokens,
                  "prompt", i)
        question.tokens[i, :len(ids)] = ids
        question.lengths[i] = len(ids)
        chat = tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                             add_generation_prompt=True, tokenize=False)
        ids = fit(tokenizer(chat, add_special_tokens=False)["input_ids"], policy_tokens,
                  "chat-formatted prompt", i)
        policy.tokens[i, policy_tokens - len(ids):] = ids
        policy.mask[i, policy_tokens - len(ids):] = True
        policy.lengths[i] = len(ids)
        if len(anchors[i]) > num_anchors:
            raise ValueError(f"row {i}: {len(anchors[i])} anchor answers, at most {num_anchors}")
        ranks = list(range(1, len(anchors[i]) + 1)) if anchor_ranks is None else anchor_ranks[i]
        if list(ranks) != sorted(ranks) or len(ranks) != len(anchors[i]):
            raise ValueError(f"row {i}: anchor ranks {list(ranks)} must be one per answer, "
                             "best-first (sorted)")
        for j, answer in enumerate(anchors[i]):
            ids = fit(tokenizer(answer, add_special_tokens=False)["input_ids"], anchor_tokens,
                      f"anchor answer {j}", i)
            anchor.tokens[i, j, :len(ids)] = ids
            anchor.lengths[i, j] = len(ids)
            anchor.mask[i, j] = True
            anchor.ranks[i, j] = ranks[j]
    return RoundBatch(question, policy, anchor)


def batch_shapes(tokenizer: Any, data: Any) -> RoundBatch:
    """The batch of a config's `data` section (`ml_collections`) as `jax.ShapeDtypeStruct`s:
    `encode_batch`'s layout, read from an empty batch, at `data.batch_size` rows."""
    empty = encode_batch(tokenizer, [], [], prompt_tokens=data.prompt_tokens,
                         policy_tokens=data.policy_tokens, anchor_tokens=data.anchor_tokens,
                         num_anchors=data.num_anchors)
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct((data.batch_size, *x.shape[1:]),
                                                       x.dtype), empty)
