"""`jaxrubric evaluate`: score HealthBench-style reference completions under a rubric judged by
an LLM verifier, and measure how far generated rubrics agree with the experts'.

For every query with reference completions (the ideal completion and the others shown with
it), the rubric is either written by a generator from the query alone (GenRubric style:
signed weights, constrained to the rubric grammar) or taken from the data set (the
physicians' rubric). The verifier judges every item for every completion in one tree
forward per completion (`jaxrubric.rubric.verifier.verify`), and a completion's score is
HealthBench's: points of the criteria met over the positive points. With generated rubrics
the expert rubric is judged in the same forward (a second group of branches), so the two
score vectors of a query can be compared (`agreement_table`) and both give a Δgap against
the reference order (the ideal completion above the others).

Shapes are fixed for the whole run (batch B, completions K, groups G, items M, item tokens
Li, prompt and response tokens from the data, capped by the config), the last batch padded,
so verification compiles once. Generation compiles once per power-of-two prompt length
bucket (`jaxrubric.sampling.generate`). Nothing is cut silently: truncated prompts,
responses and items are counted in ``metrics.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np
from tqdm.auto import tqdm

import jaxrubric
from jaxrubric.data import HealthBenchRecord, load_healthbench, prompt_text
from jaxrubric.eval.metrics import aggregate, agreement_table, delta_gap_from_ranks
from jaxrubric.rubric.grammar import build_rubric_grammar, parse_rubric_tokens
from jaxrubric.rubric.scores import genrubric_score
from jaxrubric.rubric.templates import genrubric_generator_template, verifier_template
from jaxrubric.rubric.verifier import verifier_prefix, verifier_readout, verify
from jaxrubric.sampling import generate

RUBRIC_SOURCES = ("generated", "expert")
# Signed GenRubric weights: positive items reward a quality, negative ones penalise an error.
GENERATED_WEIGHTS = (-5, -4, -3, -2, -1, 1, 2, 3, 4, 5)
DTYPES = ("float32", "bfloat16", "float16")


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    """Knobs of an evaluation run (the CLI flags of the same names)."""

    rubrics: str = "generated"
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
        if self.rubrics not in RUBRIC_SOURCES:
            raise ValueError(f"rubrics must be one of {RUBRIC_SOURCES}, got {self.rubrics!r}")
        for name in ("max_items", "max_item_tokens", "max_prompt_tokens", "max_response_tokens",
                     "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")

    @property
    def kinds(self) -> tuple[str, ...]:
        """The rubric groups judged, in group order: the expert rubric always, last."""
        return ("generated", "expert") if self.rubrics == "generated" else ("expert",)


@dataclasses.dataclass
class EvalResult:
    """The rows of the output files and the metrics."""

    rubrics: list[dict[str, Any]]
    verdicts: list[dict[str, Any]]
    scores: list[dict[str, Any]]
    metrics: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class _Item:
    """A criterion as the verifier reads it: ``ids`` are its (possibly cut) tokens."""

    criterion: str
    weight: int
    ids: list[int]
    truncated: bool


def _encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def _pad_id(tokenizer: Any) -> int:
    for value in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if value is not None:
            return int(value)
    return 0


def _item(tokenizer: Any, criterion: str, weight: int, max_tokens: int) -> _Item:
    """The criterion on one line, after the space the verifier template expects before it."""
    criterion = " ".join(criterion.split())
    ids = _encode(tokenizer, " " + criterion)
    return _Item(criterion, weight, ids[:max_tokens], len(ids) > max_tokens)


@functools.partial(jax.jit, static_argnames=("template", "pad_id"))
def _judge(model, readout, prompt, prompt_lengths, responses, response_lengths, items,
           item_lengths, valid, weights, *, template, pad_id):
    """Verdicts ``[B, K, G, M]`` and HealthBench scores ``[B, K, G]`` (hard and soft)."""
    prefix = verifier_prefix(template, prompt, prompt_lengths, responses, response_lengths,
                             pad_id=pad_id)
    out = verify(model, readout, prefix.tokens, prefix.lengths, items, item_lengths, valid,
                 pad_id=pad_id)
    scores, group_valid = genrubric_score(out.verdicts, weights[:, None], valid[:, None])
    soft, _ = genrubric_score(out.p_yes, weights[:, None], valid[:, None])
    return out.p_yes, out.verdicts, scores, soft, group_valid


class _Verifier:
    """Tokenises queries for the verifier and judges batches of fixed shape."""

    def __init__(self, model: Any, tokenizer: Any, config: EvalConfig,
                 records: Sequence[HealthBenchRecord], counts: Counter):
        self.model, self.tokenizer, self.config = model, tokenizer, config
        self.template = verifier_template(tokenizer, config.chat_template_kwargs)
        self.readout = verifier_readout(tokenizer, self.template)
        self.pad = _pad_id(tokenizer)
        self.prompts, self.responses, self.expert = {}, {}, {}
        for record in records:
            ids = _encode(tokenizer, prompt_text(record.messages))
            counts["verifier_prompts"] += len(ids) > config.max_prompt_tokens
            self.prompts[record.id] = ids[-config.max_prompt_tokens:]  # keep the latest turns
            self.responses[record.id] = []
            for text in record.responses:
                ids = _encode(tokenizer, text)
                counts["responses"] += len(ids) > config.max_response_tokens
                self.responses[record.id].append(ids[:config.max_response_tokens])
            self.expert[record.id] = [_item(tokenizer, i.criterion, i.weight,
                                            config.max_item_tokens) for i in record.rubric]
            counts["expert_items"] += sum(i.truncated for i in self.expert[record.id])
        self.prompt_len = max(1, *(len(p) for p in self.prompts.values()))
        self.response_len = max(1, *(len(r) for rs in self.responses.values() for r in rs))
        self.num_responses = max(len(r.responses) for r in records)
        expert_items = max(len(r.rubric) for r in records)
        self.num_items = (max(expert_items, config.max_items) if config.rubrics == "generated"
                          else expert_items)

    def item(self, criterion: str, weight: int) -> _Item:
        return _item(self.tokenizer, criterion, weight, self.config.max_item_tokens)

    def __call__(self, batch: Sequence[HealthBenchRecord],
                 groups: Sequence[Sequence[Sequence[_Item]]]) -> dict[str, np.ndarray]:
        """Judges ``groups[g][b]`` (the items of group g for query b) for every response."""
        b_, k_, g_, m_ = self.config.batch_size, self.num_responses, len(groups), self.num_items
        prompt = np.full((b_, self.prompt_len), self.pad, np.int32)
        prompt_lengths = np.zeros((b_,), np.int32)
        responses = np.full((b_, k_, self.response_len), self.pad, np.int32)
        response_lengths = np.zeros((b_, k_), np.int32)
        items = np.full((b_, g_, m_, self.config.max_item_tokens), self.pad, np.int32)
        item_lengths = np.zeros((b_, g_, m_), np.int32)
        valid = np.zeros((b_, g_, m_), bool)
        weights = np.zeros((b_, g_, m_), np.int32)
        for b, record in enumerate(batch):
            ids = self.prompts[record.id]
            prompt[b, :len(ids)], prompt_lengths[b] = ids, len(ids)
            for k, ids in enumerate(self.responses[record.id]):
                responses[b, k, :len(ids)], response_lengths[b, k] = ids, len(ids)
            for g, group in enumerate(groups):
                for m, it in enumerate(group[b]):
                    items[b, g, m, :len(it.ids)], item_lengths[b, g, m] = it.ids, len(it.ids)
                    valid[b, g, m], weights[b, g, m] = True, it.weight
        p_yes, verdicts, scores, soft, group_valid = _judge(
            self.model, self.readout, prompt, prompt_lengths, responses, response_lengths, items,
            item_lengths, valid, weights, template=self.template, pad_id=self.pad)
        return dict(p_yes=np.asarray(p_yes), verdicts=np.asarray(verdicts),
                    scores=np.asarray(scores), soft=np.asarray(soft),
                    group_valid=np.asarray(group_valid))


_parse = jax.jit(parse_rubric_tokens, static_argnums=2)


class _RubricWriter:
    """Writes a GenRubric-style rubric per query, constrained to the rubric grammar."""

    def __init__(self, model: Any, tokenizer: Any, config: EvalConfig):
        self.model, self.tokenizer, self.config = model, tokenizer, config
        self.template = genrubric_generator_template(
            tokenizer, max_items=config.max_items, chat_template_kwargs=config.chat_template_kwargs)
        self.grammar = build_rubric_grammar(tokenizer, weights=GENERATED_WEIGHTS,
                                            max_items=config.max_items,
                                            max_item_tokens=config.max_item_tokens)
        self.max_new_tokens = config.max_new_tokens or self.grammar.max_rubric_tokens
        self.pad = _pad_id(tokenizer)

    def __call__(self, batch: Sequence[HealthBenchRecord], rng: Any,
                 counts: Counter) -> list[dict[str, Any]]:
        """One rubric per query: its text, whether it ended properly, and its items."""
        (before, after), cap = self.template.segments, self.config.max_prompt_tokens
        prompts = []
        for record in batch:
            ids = _encode(self.tokenizer, prompt_text(record.messages))
            counts["generator_prompts"] += len(ids) > cap
            prompts.append([*before, *ids[-cap:], *after])
        prompts += [prompts[0]] * (self.config.batch_size - len(batch))
        out = generate(self.model, prompts, max_new_tokens=self.max_new_tokens, rng=rng,
                       temperature=self.config.temperature, grammar=self.grammar,
                       pad_id=self.pad)
        tokens = np.asarray(out.tokens[:, 0])
        lengths, finished = np.asarray(out.lengths[:, 0]), np.asarray(out.finished[:, 0])
        parsed = jax.device_get(_parse(tokens, self.grammar, self.pad))
        rubrics = []
        for b in range(len(batch)):
            text_ids = tokens[b, :lengths[b] - int(finished[b])].tolist()  # without the end token
            items = [(self.tokenizer.decode(parsed.items[b, m, :parsed.item_lengths[b, m]]
                                            .tolist()).strip(), int(parsed.weights[b, m]))
                     for m in range(self.grammar.max_items) if parsed.valid[b, m]]
            rubrics.append(dict(
                text=self.tokenizer.decode(text_ids, skip_special_tokens=False),
                complete=bool(parsed.complete[b]), finished=bool(finished[b]),
                num_tokens=int(lengths[b]), items=items))
        return rubrics


def evaluate(records: Sequence[HealthBenchRecord], verifier: Any, verifier_tokenizer: Any,
             config: EvalConfig, *, generator: Any = None, generator_tokenizer: Any = None,
             progress: bool = True) -> EvalResult:
    """Judges the reference completions of ``records`` (see the module docstring).

    Records without completions are counted, not scored. ``generator`` and its tokenizer are
    needed for ``config.rubrics == "generated"``.
    """
    kinds = config.kinds
    if "generated" in kinds and (generator is None or generator_tokenizer is None):
        raise ValueError("generated rubrics need a generator model and tokenizer")
    scored = [r for r in records if r.responses]
    if not scored:
        raise ValueError("no record has reference completions to score")
    counts: Counter = Counter()
    judge = _Verifier(verifier, verifier_tokenizer, config, scored, counts)
    writer = (_RubricWriter(generator, generator_tokenizer, config)
              if "generated" in kinds else None)
    result = EvalResult([], [], [], {})
    per_query: list[tuple[HealthBenchRecord, dict[str, np.ndarray | None]]] = []
    key = jax.random.key(config.seed)
    with tqdm(total=len(scored), unit="query", desc="evaluate", disable=not progress) as bar:
        for step, start in enumerate(range(0, len(scored), config.batch_size)):
            batch = scored[start:start + config.batch_size]
            groups, rubric_rows = [], []
            if writer is not None:
                written = writer(batch, jax.random.fold_in(key, step), counts)
                generated = [[judge.item(c, w) for c, w in r["items"]] for r in written]
                counts["generated_items"] += sum(i.truncated for g in generated for i in g)
                groups.append(generated)
                rubric_rows.append([{k: r[k] for k in ("text", "complete", "finished",
                                                       "num_tokens")} for r in written])
            groups.append([judge.expert[r.id] for r in batch])
            rubric_rows.append([{} for _ in batch])
            out = judge(batch, groups)
            for b, record in enumerate(batch):
                vectors = _record_rows(result, record, b, kinds, groups, rubric_rows, out)
                per_query.append((record, vectors))
            bar.update(len(batch))
    result.metrics = _metrics(config, records, per_query, counts, result.rubrics)
    return result


def _record_rows(result: EvalResult, record: HealthBenchRecord, b: int, kinds: tuple[str, ...],
                 groups: Sequence[Sequence[Sequence[_Item]]],
                 rubric_rows: Sequence[Sequence[dict[str, Any]]], out: dict[str, np.ndarray]
                 ) -> dict[str, np.ndarray | None]:
    """Appends the output rows of query ``b``; returns its score vector per rubric kind
    (None where the rubric is invalid: no valid item with positive weight)."""
    num = len(record.responses)
    vectors: dict[str, np.ndarray | None] = {}
    for g, kind in enumerate(kinds):
        items = groups[g][b]
        result.rubrics.append({
            "id": record.id, "rubric": kind, **rubric_rows[g][b],
            "items": [{"criterion": i.criterion, "weight": i.weight, "tokens": len(i.ids),
                       "truncated": i.truncated} for i in items]})
        for k in range(num):
            for m, it in enumerate(items):
                result.verdicts.append({
                    "id": record.id, "response": k, "rubric": kind, "item": m,
                    "weight": it.weight, "p_yes": float(out["p_yes"][b, k, g, m]),
                    "verdict": bool(out["verdicts"][b, k, g, m])})
        valid = bool(out["group_valid"][b, 0, g])
        vectors[kind] = out["scores"][b, :num, g].astype(np.float64) if valid else None
    for k in range(num):
        ok = [bool(out["group_valid"][b, k, g]) for g in range(len(kinds))]
        result.scores.append({
            "id": record.id, "response": k,
            "completion": "ideal" if k == 0 else "reference",
            "scores": {kind: float(out["scores"][b, k, g]) if ok[g] else None
                       for g, kind in enumerate(kinds)},
            "soft_scores": {kind: float(out["soft"][b, k, g]) if ok[g] else None
                            for g, kind in enumerate(kinds)}})
    return vectors


def _mean(values: list[float]) -> float | None:
    return float(np.mean(values)) if values else None


def _metrics(config: EvalConfig, records: Sequence[HealthBenchRecord],
             per_query: list[tuple[HealthBenchRecord, dict[str, np.ndarray | None]]],
             counts: Counter, rubric_rows: list[dict[str, Any]]) -> dict[str, Any]:
    kinds = config.kinds
    metrics: dict[str, Any] = {
        "rubrics": config.rubrics,
        "queries": {"total": len(records), "scored": len(per_query),
                    "without_responses": len(records) - len(per_query)},
        "responses": sum(len(r.responses) for r, _ in per_query),
        "truncated": {name: counts[name] for name in (
            ("verifier_prompts", "responses", "expert_items") + (
                ("generator_prompts", "generated_items") if "generated" in kinds else ()))},
        "scores": {}, "delta_gap": {},
    }
    for kind in kinds:
        by_role: dict[str, list[float]] = {"ideal": [], "reference": []}
        for _, vectors in per_query:
            if vectors[kind] is not None:
                by_role["ideal"].append(float(vectors[kind][0]))
                by_role["reference"].extend(map(float, vectors[kind][1:]))
        metrics["scores"][kind] = {
            "mean": _mean(by_role["ideal"] + by_role["reference"]),
            "ideal": _mean(by_role["ideal"]), "reference": _mean(by_role["reference"]),
            "invalid_rubrics": sum(v[kind] is None for _, v in per_query)}
        metrics["delta_gap"][kind] = aggregate([
            None if v[kind] is None else delta_gap_from_ranks(v[kind], r.reference_ranks)
            for r, v in per_query])
    if "generated" in kinds:
        generated = [row for row in rubric_rows if row["rubric"] == "generated"]
        metrics["generated_rubrics"] = {
            "complete": sum(row["complete"] for row in generated),
            "out_of_tokens": sum(not row["finished"] for row in generated),
            "mean_items": _mean([len(row["items"]) for row in generated])}
        pairs = [(v["generated"], v["expert"]) for r, v in per_query
                 if len(r.responses) >= 2 and v["generated"] is not None
                 and v["expert"] is not None]
        metrics["agreement"] = agreement_table([g for g, _ in pairs], [e for _, e in pairs])
        metrics["agreement_queries"] = {
            "compared": len(pairs),
            "single_response": sum(len(r.responses) < 2 for r, _ in per_query),
            "invalid_rubric": sum(len(r.responses) >= 2 and any(x is None for x in v.values())
                                  for r, v in per_query)}
    return metrics


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


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def format_metrics(metrics: Mapping[str, Any]) -> str:
    """The metrics as a plain-text table."""
    q, data = metrics["queries"], metrics.get("data", {})
    lines = [f"queries scored: {q['scored']} of {q['total']} ({q['without_responses']} without "
             f"reference completions; {data.get('bad_rows_skipped', 0)} bad rows skipped)",
             f"responses scored: {metrics['responses']}",
             "truncated: " + ", ".join(f"{k} {v}" for k, v in metrics["truncated"].items()),
             "", f"{'rubric':<10} {'mean':>8} {'ideal':>8} {'reference':>10} {'Δgap':>8} "
                 f"{'invalid':>8}"]
    for kind, s in metrics["scores"].items():
        lines.append(f"{kind:<10} {_fmt(s['mean']):>8} {_fmt(s['ideal']):>8} "
                     f"{_fmt(s['reference']):>10} {_fmt(metrics['delta_gap'][kind]['mean']):>8} "
                     f"{s['invalid_rubrics']:>8}")
    if "agreement" in metrics:
        g, a = metrics["generated_rubrics"], metrics["agreement_queries"]
        lines += ["", f"generated rubrics: {g['complete']} complete, {g['out_of_tokens']} out of "
                      f"tokens, {_fmt(g['mean_items'])} items on average",
                  f"agreement, generated vs expert ({a['compared']} queries; "
                  f"{a['single_response']} with one response, {a['invalid_rubric']} with an "
                  f"invalid rubric left out)",
                  f"{'metric':<20} {'mean':>8} {'n':>5} {'skipped':>8}"]
        for name, agg in metrics["agreement"].items():
            lines.append(f"{name:<20} {_fmt(agg['mean']):>8} {agg['n']:>5} {agg['skipped']:>8}")
    return "\n".join(lines)


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not valid JSON: {e}") from e
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object, got {text!r}")
    return value


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Registers the ``evaluate`` subcommand on an ``add_subparsers()`` object."""
    defaults = EvalConfig()
    p = subparsers.add_parser(
        "evaluate", help="score reference completions with generated or expert rubrics",
        description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True,
                   help="HealthBench-schema data: a .jsonl/.json/.parquet file or a hub data set")
    p.add_argument("--split", default="train", help="split of a hub data set")
    p.add_argument("--generator", help="rubric generator checkpoint (needed for --rubrics "
                                       "generated)")
    p.add_argument("--verifier", required=True, help="verifier checkpoint")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--rubrics", choices=RUBRIC_SOURCES, default=defaults.rubrics)
    p.add_argument("--skip-bad-rows", action="store_true",
                   help="skip (and count) invalid rows instead of stopping")
    p.add_argument("--max-items", type=_positive_int, default=defaults.max_items,
                   help="items per generated rubric (M)")
    p.add_argument("--max-item-tokens", type=_positive_int, default=defaults.max_item_tokens,
                   help="tokens per item (Li); longer items are cut and counted")
    p.add_argument("--max-new-tokens", type=_positive_int, default=None,
                   help="rubric generation budget (default: the longest rubric the grammar "
                        "admits)")
    p.add_argument("--max-prompt-tokens", type=_positive_int, default=defaults.max_prompt_tokens,
                   help="longer prompts keep their last tokens (counted)")
    p.add_argument("--max-response-tokens", type=_positive_int,
                   default=defaults.max_response_tokens,
                   help="longer responses keep their first tokens (counted)")
    p.add_argument("--batch-size", type=_positive_int, default=defaults.batch_size,
                   help="queries per batch")
    p.add_argument("--seed", type=int, default=defaults.seed)
    p.add_argument("--temperature", type=float, default=defaults.temperature,
                   help="rubric sampling temperature (0: greedy)")
    p.add_argument("--dtype", choices=DTYPES, default=None,
                   help="compute dtype (default: the checkpoint's)")
    p.add_argument("--chat-template-kwargs", type=_json_object, default=None,
                   help='JSON object passed to the chat templates, e.g. \'{"enable_thinking": '
                        'false}\'')
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)
    return p


def _error(message: str) -> int:
    print(f"jaxrubric evaluate: error: {message}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    """The ``evaluate`` command: load, judge, write the outputs, print the metrics."""
    if args.rubrics == "generated" and not args.generator:
        return _error("--rubrics generated needs --generator")
    try:
        config = EvalConfig(
            rubrics=args.rubrics, max_items=args.max_items, max_item_tokens=args.max_item_tokens,
            max_new_tokens=args.max_new_tokens, max_prompt_tokens=args.max_prompt_tokens,
            max_response_tokens=args.max_response_tokens, batch_size=args.batch_size,
            seed=args.seed, temperature=args.temperature,
            chat_template_kwargs=args.chat_template_kwargs)
        loaded = load_healthbench(args.data, skip_bad_rows=args.skip_bad_rows, split=args.split)
    except ValueError as e:  # a DataError, or a config value out of range
        return _error(str(e))
    for problem in loaded.problems:
        print(f"skipped: {problem}", file=sys.stderr)
    if not any(r.responses for r in loaded.records):
        return _error(f"{loaded.source}: no valid row has reference completions to score")
    verifier = jaxrubric.load_pretrained(args.verifier, dtype=args.dtype)
    verifier_tokenizer = jaxrubric.load_tokenizer(args.verifier)
    generator = generator_tokenizer = None
    if args.rubrics == "generated":
        generator = jaxrubric.load_pretrained(args.generator, dtype=args.dtype)
        generator_tokenizer = jaxrubric.load_tokenizer(args.generator)
    result = evaluate(loaded.records, verifier, verifier_tokenizer, config, generator=generator,
                      generator_tokenizer=generator_tokenizer, progress=not args.no_progress)
    result.metrics = {"data": {"source": loaded.source, "rows": len(loaded.records),
                               "bad_rows_skipped": loaded.skipped,
                               "bad_rows": loaded.problems},
                      **result.metrics}
    out = write_outputs(result, args.out)
    print(format_metrics(result.metrics))
    print(f"wrote {out}/rubrics.jsonl, verdicts.jsonl, scores.jsonl, metrics.json")
    return 0
