"""A gold metric on real data for DynamicRubric runs: the policy's answers to held-out prompts,
scored by those prompts' expert rubrics (HealthBench rows, `config.data.gold`) as the run's
verifier judges them. No rubric the generator writes enters it, so it is what the reward-hacking
watch compares the training reward with where no ground truth exists (`jaxrubric.watch`).

The rows are read, checked and encoded once, before any model loads; on device
(`methods.dynamic_rubric.gold_evaluation`) the policy answers each prompt as in a round and the
verifier judges every answer under every expert criterion in one tree forward per answer.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

import jax
import numpy as np

from jaxrubric.data import load_healthbench, prompt_text
from jaxrubric.eval import common
from jaxrubric.methods.batches import encode_batch
from jaxrubric.methods.data import PolicyPrompt, Question


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class GoldBatch:
    """The gold prompts as the round reads prompts, with their expert criteria (NumPy on the
    host, global arrays on device)."""

    question: Question  # [B, Lq]: the verifier's view of the prompt
    policy: PolicyPrompt  # [B, Lp]: the chat-formatted prompt the policy answers
    items: Any  # [B, M, Li] int32 expert criteria as the verifier reads them
    item_lengths: Any  # [B, M]
    weights: Any  # [B, M] int32 signed points
    valid: Any  # [B, M] bool


@dataclasses.dataclass(frozen=True)
class GoldRows:
    """`config.data.gold`'s first rows, checked and encoded (host side)."""

    source: str
    ids: list[str]  # the rows' prompt ids, in batch order
    batch: GoldBatch  # NumPy
    cut_criteria: int  # criteria cut to `rubric.max_item_tokens`

    @classmethod
    def from_config(cls, config: Any, tokenizer: Any) -> GoldRows:
        """The first `data.eval_batch_size` (0: `data.batch_size`) rows of `data.gold`, within
        the run's prompt budgets (`data.prompt_tokens`, `data.policy_tokens`: a longer prompt
        is an error naming the file and row) and `rubric.max_item_tokens` per criterion."""
        d = config.data
        return load_gold_rows(d.gold, tokenizer, size=d.eval_batch_size or d.batch_size,
                              prompt_tokens=d.prompt_tokens, policy_tokens=d.policy_tokens,
                              item_tokens=config.rubric.max_item_tokens)

    def summary(self) -> str:
        """One line on what the gold evaluation reads (printed when a run starts)."""
        b = self.batch
        return (f"{self.source}: gold evaluation (the policy's answers under the expert "
                f"rubrics) on {len(self.ids)} prompts, up to {b.items.shape[1]} criteria each; "
                f"criteria cut to fit: {self.cut_criteria}")


def load_gold_rows(source: str, tokenizer: Any, *, size: int, prompt_tokens: int,
                   policy_tokens: int, item_tokens: int) -> GoldRows:
    """Reads and encodes the first `size` rows of `source` (HealthBench schema; a bad row is a
    `DataError` naming the file, row and field)."""
    records = load_healthbench(source, skip_bad_rows=False).records
    if len(records) < size:
        raise ValueError(f"{source}: {len(records)} rows, the gold batch needs {size} "
                         "(config.data.eval_batch_size, or data.batch_size)")
    records = records[:size]
    try:
        prompts = encode_batch(tokenizer, [prompt_text(r.messages) for r in records],
                               [[] for _ in records], prompt_tokens=prompt_tokens,
                               policy_tokens=policy_tokens, anchor_tokens=1, num_anchors=0)
    except ValueError as err:
        raise ValueError(f"{source}: {err} (config.data.gold)") from err
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    m = max(len(r.rubric) for r in records)
    items = np.full((size, m, item_tokens), pad, np.int32)
    lengths, weights = np.zeros((size, m), np.int32), np.zeros((size, m), np.int32)
    valid, cut = np.zeros((size, m), bool), Counter()
    for i, record in enumerate(records):
        for k, criterion in enumerate(record.rubric):
            item = common.item(tokenizer, criterion.criterion, criterion.weight, item_tokens)
            cut["criteria"] += item.truncated
            items[i, k, :len(item.ids)], lengths[i, k] = item.ids, len(item.ids)
            weights[i, k], valid[i, k] = item.weight, True
    batch = GoldBatch(prompts.question, prompts.policy, items, lengths, weights, valid)
    return GoldRows(str(source), [r.id for r in records], batch, cut["criteria"])
