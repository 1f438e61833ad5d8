"""What every `jaxrubric evaluate` method shares: the run's knobs, rubric items as the verifier
reads them, grammar-constrained rubric writing, the verification of fixed-shape batches and
the output files.

A method (`jaxrubric.eval.genrubric`, `jaxrubric.eval.preference`) decides the rest: what the
generator is shown, the weights its grammar allows, the score and the metrics. Shapes are fixed
for a whole run (batch B, responses K, groups G, items M, item tokens Li, prompt and response
tokens from the data, capped by the config), the last batch padded, so verification compiles
once; generation compiles once per power-of-two prompt length bucket
(`jaxrubric.sampling.generate`). Nothing is cut silently: every cut is counted by the caller.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import jax
import numpy as np
from tqdm.auto import tqdm

from jaxrubric.rubric.grammar import build_rubric_grammar, parse_rubric_tokens
from jaxrubric.rubric.templates import TokenTemplate, assemble, verifier_template
from jaxrubric.rubric.verifier import verifier_readout, verify
from jaxrubric.sampling import generate

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class CommonConfig:
    """The knobs every method has (the CLI flags of the same names)."""

    max_items: int = 16
    max_item_tokens: int = 64
    max_new_tokens: int | None = None  # default: the longest rubric the grammar admits
    max_prompt_tokens: int = 1024
    max_response_tokens: int = 1024
    batch_size: int = 1
    seed: int = 0
    temperature: float = 0.0  # 0: greedy
    chat_template_kwargs: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        for name in ("max_items", "max_item_tokens", "max_prompt_tokens", "max_response_tokens",
                     "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")


@dataclasses.dataclass
class EvalResult:
    """The rows of the output files and the metrics."""

    rubrics: list[dict[str, Any]]
    verdicts: list[dict[str, Any]]
    scores: list[dict[str, Any]]
    metrics: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Item:
    """A criterion as the verifier reads it: ``ids`` are its (possibly cut) tokens."""

    criterion: str
    weight: int
    ids: list[int]
    truncated: bool

    def row(self) -> dict[str, Any]:
        """The item as ``rubrics.jsonl`` shows it."""
        return {"criterion": self.criterion, "weight": self.weight, "tokens": len(self.ids),
                "truncated": self.truncated}


def encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def pad_id(tokenizer: Any) -> int:
    for value in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if value is not None:
            return int(value)
    return 0


def item(tokenizer: Any, criterion: str, weight: int, max_tokens: int) -> Item:
    """The criterion's tokens as a generated item's are (what the verifier was trained to read):
    encoded after the space that follows ``]`` in a rubric line, which stays with the text
    when the tokenizer merges it (``Ġhas``) and is the line's structure, not the item, when it
    is a token of its own (a character-level tokenizer's ``" "``, `jaxrubric.rubric.grammar`)."""
    criterion = " ".join(criterion.split())
    ids = encode(tokenizer, " " + criterion)
    if ids and tokenizer.decode(ids[:1]) == " ":
        ids = ids[1:]
    return Item(criterion, weight, ids[:max_tokens], len(ids) > max_tokens)


def generated_groups(tokenizer: Any, rubrics: list[dict[str, Any]], max_tokens: int,
                     counts: Counter) -> list[list[Item]]:
    """The written rubrics' items (``writer`` rows: ``{"items": [(criterion, weight)]}``) as
    verifier items, one group per rubric; cut criteria are counted as ``generated_items``."""
    groups = [[item(tokenizer, c, w, max_tokens) for c, w in r["items"]] for r in rubrics]
    counts["generated_items"] += sum(i.truncated for group in groups for i in group)
    return groups


def last_tokens(tokenizer: Any, text: str, cap: int, counts: Counter, name: str) -> list[int]:
    """A prompt's last ``cap`` tokens (its latest turns); a cut is counted under ``name``."""
    ids = encode(tokenizer, text)
    counts[name] += len(ids) > cap
    return ids[-cap:]


def first_tokens(tokenizer: Any, text: str, cap: int, counts: Counter, name: str) -> list[int]:
    """A response's first ``cap`` tokens; a cut is counted under ``name``."""
    ids = encode(tokenizer, text)
    counts[name] += len(ids) > cap
    return ids[:cap]


def fill(template: TokenTemplate, slots: Sequence[Sequence[int]]) -> list[int]:
    """The template's tokens with ``slots[i]`` in its slot i (host side)."""
    if len(slots) != len(template.slots):
        raise ValueError(f"need {len(template.slots)} slots {template.slots}, got {len(slots)}")
    ids = list(template.segments[0])
    for slot, segment in zip(slots, template.segments[1:]):
        ids += [*slot, *segment]
    return ids


def batches(rows: Sequence[T], batch_size: int, *, progress: bool, unit: str
            ) -> Iterator[tuple[int, Sequence[T]]]:
    """``(step, rows)`` per batch, with a progress bar counting ``unit``s."""
    with tqdm(total=len(rows), unit=unit, desc="evaluate", disable=not progress) as bar:
        for step, start in enumerate(range(0, len(rows), batch_size)):
            batch = rows[start:start + batch_size]
            yield step, batch
            bar.update(len(batch))


_parse = jax.jit(parse_rubric_tokens, static_argnums=2)


class RubricWriter:
    """Samples ``num_rubrics`` rubrics per prompt, constrained to the rubric grammar with
    ``weights``, and reads their items."""

    def __init__(self, model: Any, tokenizer: Any, config: CommonConfig, *,
                 weights: Sequence[int], num_rubrics: int = 1):
        self.model, self.tokenizer, self.config = model, tokenizer, config
        self.num_rubrics = num_rubrics
        self.grammar = build_rubric_grammar(tokenizer, weights=weights,
                                            max_items=config.max_items,
                                            max_item_tokens=config.max_item_tokens)
        self.max_new_tokens = config.max_new_tokens or self.grammar.max_rubric_tokens
        self.pad = pad_id(tokenizer)

    def __call__(self, prompts: Sequence[Sequence[int]], rng: Any) -> list[list[dict[str, Any]]]:
        """``[query][rubric]``: its text, whether it ended properly, and its items."""
        padded = [*prompts, *[prompts[0]] * (self.config.batch_size - len(prompts))]
        out = generate(self.model, padded, max_new_tokens=self.max_new_tokens, rng=rng,
                       num_samples=self.num_rubrics, temperature=self.config.temperature,
                       grammar=self.grammar, pad_id=self.pad)
        tokens, lengths = np.asarray(out.tokens), np.asarray(out.lengths)
        finished = np.asarray(out.finished)
        parsed = jax.device_get(_parse(tokens, self.grammar, self.pad))
        rubrics = []
        for b in range(len(prompts)):
            rubrics.append([])
            for g in range(self.num_rubrics):
                text_ids = tokens[b, g, :lengths[b, g] - int(finished[b, g])]  # no end token
                items = [(self.tokenizer.decode(
                              parsed.items[b, g, m, :parsed.item_lengths[b, g, m]].tolist()
                          ).strip(), int(parsed.weights[b, g, m]))
                         for m in range(self.grammar.max_items) if parsed.valid[b, g, m]]
                rubrics[b].append(dict(
                    text=self.tokenizer.decode(text_ids.tolist(), skip_special_tokens=False),
                    complete=bool(parsed.complete[b, g]), finished=bool(finished[b, g]),
                    num_tokens=int(lengths[b, g]), items=items))
        return rubrics


Score = Callable[[Any, Any, Any], tuple[jax.Array, jax.Array]]


@functools.partial(jax.jit, static_argnames=("template", "pad_id", "score"))
def _judge(model, readout, prompts, prompt_lengths, responses, response_lengths, items,
           item_lengths, valid, weights, *, template, pad_id, score):
    """Verdicts ``[B, K, G, M]``, and ``score``'s scores ``[B, K, G]`` (hard and soft)."""
    prefix = assemble(template.head(2), [prompts, responses], [prompt_lengths, response_lengths],
                      pad_id=pad_id, align="left")
    out = verify(model, readout, prefix.tokens, prefix.lengths, items, item_lengths, valid,
                 pad_id=pad_id)
    scores, group_valid = score(out.verdicts, weights[:, None], valid[:, None])
    soft, _ = score(out.p_yes, weights[:, None], valid[:, None])
    return out.p_yes, out.verdicts, scores, soft, group_valid[:, 0]


@dataclasses.dataclass(frozen=True)
class Query:
    """One query as the verifier reads it: per response its prompt (queries whose responses
    share a prompt repeat it) and its tokens, and the items of every rubric group."""

    prompts: Sequence[Sequence[int]]
    responses: Sequence[Sequence[int]]
    groups: Sequence[Sequence[Item]]


class Judge:
    """Judges batches of fixed shape: B queries x K responses x G groups x M items.

    ``score(verdicts, weights, valid)`` is the method's rubric score (`jaxrubric.rubric.scores`);
    ``style`` the verifier prompt's (`jaxrubric.rubric.templates.STYLES`), as a run that is
    compared with was trained with (``rubric.template_style``).
    """

    def __init__(self, model: Any, tokenizer: Any, config: CommonConfig, *, score: Score,
                 prompt_len: int, response_len: int, num_responses: int, num_groups: int,
                 num_items: int, style: str = "full"):
        self.model, self.config, self.score = model, config, score
        self.template = verifier_template(tokenizer, config.chat_template_kwargs, style)
        self.readout = verifier_readout(tokenizer, self.template)
        self.pad = pad_id(tokenizer)
        self.shape = (config.batch_size, num_responses, num_groups, num_items)
        self.prompt_len, self.response_len = max(1, prompt_len), max(1, response_len)

    def __call__(self, batch: Sequence[Query]) -> dict[str, np.ndarray]:
        """``p_yes`` and ``verdicts [B, K, G, M]``, ``scores`` and ``soft [B, K, G]``, and
        ``group_valid [B, G]`` (the score's: something to normalise by)."""
        b_, k_, g_, m_ = self.shape
        prompts = np.full((b_, k_, self.prompt_len), self.pad, np.int32)
        prompt_lengths = np.zeros((b_, k_), np.int32)
        responses = np.full((b_, k_, self.response_len), self.pad, np.int32)
        response_lengths = np.zeros((b_, k_), np.int32)
        items = np.full((b_, g_, m_, self.config.max_item_tokens), self.pad, np.int32)
        item_lengths = np.zeros((b_, g_, m_), np.int32)
        valid = np.zeros((b_, g_, m_), bool)
        weights = np.zeros((b_, g_, m_), np.int32)
        for b, query in enumerate(batch):
            for k, (prompt, response) in enumerate(zip(query.prompts, query.responses)):
                prompts[b, k, :len(prompt)], prompt_lengths[b, k] = prompt, len(prompt)
                responses[b, k, :len(response)], response_lengths[b, k] = response, len(response)
            for g, group in enumerate(query.groups):
                for m, it in enumerate(group):
                    items[b, g, m, :len(it.ids)], item_lengths[b, g, m] = it.ids, len(it.ids)
                    valid[b, g, m], weights[b, g, m] = True, it.weight
        p_yes, verdicts, scores, soft, group_valid = _judge(
            self.model, self.readout, prompts, prompt_lengths, responses, response_lengths,
            items, item_lengths, valid, weights, template=self.template, pad_id=self.pad,
            score=self.score)
        return dict(p_yes=np.asarray(p_yes), verdicts=np.asarray(verdicts),
                    scores=np.asarray(scores), soft=np.asarray(soft),
                    group_valid=np.asarray(group_valid))


def verdict_rows(query_id: str, num_responses: int, groups: Sequence[Sequence[Item]],
                 labels: Sequence[Mapping[str, Any]], out: Mapping[str, np.ndarray], b: int
                 ) -> list[dict[str, Any]]:
    """``verdicts.jsonl`` rows of query ``b`` of a judged batch: one per (response, item),
    each carrying its group's ``labels[g]`` (which rubric it is, e.g. ``{"rubric": 2}``)."""
    return [{"id": query_id, "response": k, **label, "item": m, "weight": it.weight,
             "p_yes": float(out["p_yes"][b, k, g, m]), "verdict": bool(out["verdicts"][b, k, g, m])}
            for g, (label, items) in enumerate(zip(labels, groups))
            for k in range(num_responses) for m, it in enumerate(items)]


def write_outputs(result: EvalResult, out: str | Path) -> Path:
    """``rubrics.jsonl``, ``verdicts.jsonl``, ``scores.jsonl`` and ``metrics.json`` in ``out``."""
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    for name, rows in (("rubrics", result.rubrics), ("verdicts", result.verdicts),
                       ("scores", result.scores)):
        with (folder / f"{name}.jsonl").open("w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
    (folder / "metrics.json").write_text(json.dumps(result.metrics, indent=2) + "\n",
                                         encoding="utf-8")
    return folder


def mean(values: Sequence[float]) -> float | None:
    return float(np.mean(values)) if len(values) else None


def fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"
