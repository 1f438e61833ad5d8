"""Rubric cards: a sampled prompt of a round, its answers, its rubrics and their verdicts, as one
JSON object (a line of `cards.jsonl` in the workdir, written every `logging.card_every`
rounds; docs/observability.md).

A card is built on the host from the first rows of a round's outputs, fetched only on the
rounds that write cards. Its schema (every number a plain JSON number):

    {"round": int, "method": "dynamic_rubric" | "genrubric", "row": int (batch row),
     "prompt": str, "soft_verdicts": bool (verdicts are p_yes, else 0/1),
     "answers": [{"text": str, "length": int (tokens, without the stop token),
                  "reward": float (the policy's), "rewarded": bool (has a reward),
                  "advantage": float (the policy's),
                  "group": int | null (GenRubric: the rubric that induced it),
                  "oracle": float | null (the ground truth, where the world has one),
                  "rubric_reward": float | null (the evaluator's score, DynamicRubric)}],
     "rubrics": [{"text": str (as written), "length": int (tokens),
                  "valid": bool (scores answers), "complete": bool (end token written),
                  "explorer": bool (written by DynamicRubric's explorer),
                  "reward": float, "advantage": float (the generator's, of the rubric),
                  "scores": [float per answer],
                  "items": [{"slot": int, "criterion": str, "token_ids": [int],
                             "weight": int (signed for GenRubric),
                             "verdicts": [float per answer],
                             "reward": float | null (GenRubric's item reward)}]}]}

`items` lists the items that parsed (`Judgement.item_valid`); `verdicts[a]` is answer a's.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from jaxrubric.jsonl import json_lines
from jaxrubric.rewards.telemetry import Judgement


def _optional(values: np.ndarray | None, index: tuple[int, ...]) -> float | None:
    return None if values is None else float(values[index])


def build_cards(outputs: Any, question: tuple[np.ndarray, np.ndarray], tokenizer: Any, *,
                round_: int, method: str, soft_verdicts: bool,
                answers_per_group: int | None = None, explorer_rubrics: int = 0
                ) -> list[dict[str, Any]]:
    """The cards of the fetched rows of a round's outputs (host arrays, rows first).

    `outputs` has the method's outputs' fields `judgement` (`Judgement`), `responses`,
    `rubrics`, `rubric_len`, `policy_advantages`, `generator_reward`, `generator_advantages`
    and `item_reward` (None where the method has none); `question` its rows' tokens and
    lengths. `answers_per_group`: GenRubric's induced answers per rubric (answer a was induced
    by rubric a // N); `explorer_rubrics`: DynamicRubric's last rubrics the explorer wrote.
    """
    j: Judgement = outputs.judgement
    decode = lambda ids, n: tokenizer.decode([int(t) for t in ids[:int(n)]])  # noqa: E731
    cards = []
    for b in range(j.verdicts.shape[0]):
        num_answers, num_rubrics = j.verdicts.shape[1], j.verdicts.shape[2]
        answers = [{
            "text": decode(outputs.responses[b, a], j.answer_lengths[b, a]),
            "length": int(j.answer_lengths[b, a]),
            "reward": float(j.reward[b, a]), "rewarded": bool(j.reward_valid[b, a]),
            "advantage": float(outputs.policy_advantages[b, a]),
            "group": None if answers_per_group is None else a // answers_per_group,
            "oracle": _optional(j.oracle, (b, a)),
            "rubric_reward": _optional(j.rubric_reward, (b, a)),
        } for a in range(num_answers)]
        rubrics = []
        for g in range(num_rubrics):
            items = [{
                "slot": m, "criterion": decode(j.items[b, g, m], j.item_lengths[b, g, m]),
                "token_ids": [int(t) for t in j.items[b, g, m, :int(j.item_lengths[b, g, m])]],
                "weight": int(j.weights[b, g, m]),
                "verdicts": [float(v) for v in j.verdicts[b, :, g, m]],
                "reward": _optional(outputs.item_reward, (b, g, m)),
            } for m in range(j.weights.shape[-1]) if j.item_valid[b, g, m]]
            rubrics.append({
                "text": decode(outputs.rubrics[b, g], outputs.rubric_len[b, g]),
                "length": int(outputs.rubric_len[b, g]),
                "valid": bool(j.group_valid[b, g]), "complete": bool(j.complete[b, g]),
                "explorer": g >= num_rubrics - explorer_rubrics,
                "reward": float(outputs.generator_reward[b, g]),
                "advantage": float(outputs.generator_advantages[b, g]),
                "scores": [float(s) for s in outputs.scores[b, :, g]],
                "items": items,
            })
        cards.append({"round": round_, "method": method, "row": b,
                      "prompt": decode(question[0][b], question[1][b]),
                      "soft_verdicts": soft_verdicts, "answers": answers, "rubrics": rubrics})
    return cards


def card_text(card: dict[str, Any]) -> str:
    """A card as Markdown for TensorBoard's text tab: the prompt, each rubric's items with
    their weights and verdicts (one mark per answer), its scores."""
    lines = [f"**prompt** (round {card['round']}, row {card['row']}): {card['prompt']}", ""]
    for a, answer in enumerate(card["answers"]):
        lines.append(f"- answer {a}: reward {answer['reward']:.3f}, advantage "
                     f"{answer['advantage']:+.3f}: {answer['text']}")
    for g, rubric in enumerate(card["rubrics"]):
        state = "valid" if rubric["valid"] else "invalid"
        lines += ["", f"**rubric {g}** ({state}, reward {rubric['reward']:.3f}, advantage "
                      f"{rubric['advantage']:+.3f}), scores "
                      + " ".join(f"{s:.2f}" for s in rubric["scores"])]
        for item in rubric["items"]:
            marks = "".join("Y" if v > 0.5 else "." for v in item["verdicts"])
            lines.append(f"- [{item['weight']:+d}] `{marks}` {item['criterion']}")
    return "\n".join(lines)


def card_table(cards: Sequence[dict[str, Any]]) -> tuple[list[str], list[list[Any]]]:
    """The cards as one table, a row per rubric item (a W&B table)."""
    columns = ["round", "row", "prompt", "rubric", "valid", "weight", "criterion", "verdicts",
               "rubric_scores"]
    rows = [[card["round"], card["row"], card["prompt"], g, rubric["valid"], item["weight"],
             item["criterion"], " ".join(f"{v:.2f}" for v in item["verdicts"]),
             " ".join(f"{v:.2f}" for v in rubric["scores"])]
            for card in cards for g, rubric in enumerate(card["rubrics"])
            for item in rubric["items"]]
    return columns, rows


def read_cards(path: str, rounds: Sequence[int] | None = None) -> list[dict[str, Any]]:
    """The cards of a `cards.jsonl` (of `rounds` only, when given), by round and row; after a
    resume the later cards of a round replace the earlier ones."""
    by_key = {(card["round"], card["row"]): card for card in json_lines(Path(path))
              if rounds is None or card["round"] in rounds}
    return [by_key[k] for k in sorted(by_key)]
