"""`jaxrubric evaluate`: judge responses under rubrics with an LLM verifier, one method each.

- ``--method genrubric`` (default): rubrics written from the query alone (``--runs`` samples
  per query), or the experts', or those of another HealthBench-schema file (``--rubrics
  FILE``, e.g. a run's rubrics as ``jaxrubric rubrics`` exports them), on HealthBench rows,
  with agreement, per-tag and clipped HealthBench scores as the GenRubric paper and
  HealthBench report them (`jaxrubric.eval.genrubric`);
- ``--method dynamic_rubric``: G rubrics written for the prompt and its candidate set, scored
  against preference data by pairwise accuracy and listwise agreement
  (`jaxrubric.eval.preference`).

Both write ``rubrics.jsonl``, ``verdicts.jsonl``, ``scores.jsonl`` and ``metrics.json`` and
share the machinery of `jaxrubric.eval.common`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable, Mapping
from typing import Any

import jaxrubric
from jaxrubric.data import FORMATS, load_candidate_sets, load_healthbench
from jaxrubric.eval.common import CommonConfig, EvalResult, write_outputs
from jaxrubric.eval.genrubric import (RUBRIC_SOURCES, EvalConfig, evaluate, format_metrics,
                                      rubrics_from)
from jaxrubric.eval.preference import (PreferenceConfig, evaluate_preferences,
                                       format_preference_metrics)
from jaxrubric.rubric.templates import STYLES

DTYPES = ("float32", "bfloat16", "float16")


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
    defaults = CommonConfig()
    p = subparsers.add_parser(
        "evaluate", help="judge responses under generated or expert rubrics: HealthBench "
                         "agreement (genrubric) or preference benchmarks (dynamic_rubric)",
        description=__doc__.split("\n\n")[0])
    p.add_argument("--method", choices=tuple(METHODS), default="genrubric",
                   help="genrubric: HealthBench rows, rubrics from the query alone; "
                        "dynamic_rubric: preference data, rubrics from the prompt and its "
                        "candidate set")
    p.add_argument("--data", required=True,
                   help="a .jsonl/.json/.parquet file or a hub data set: HealthBench rows "
                        "(genrubric) or preference rows (dynamic_rubric, see --format)")
    p.add_argument("--split", default="train", help="split of a hub data set")
    p.add_argument("--generator", help="rubric generator checkpoint (needed for generated "
                                       "rubrics)")
    p.add_argument("--verifier", required=True, help="verifier checkpoint")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--rubrics", default=None, metavar="{generated,expert,FILE}",
                   help="genrubric only: generated (default), expert (the data set's rubric), "
                        "or a HealthBench-schema FILE (a path or hub data set; ./expert for a "
                        "file of that name): each --data row gets the rubric of FILE's row with "
                        "its prompt_id, judged and scored as the expert rubric is (labelled "
                        "expert in the outputs); FILE may be the --data file itself, as for the "
                        "rows `jaxrubric rubrics` exports")
    p.add_argument("--template-style", choices=STYLES, default=None,
                   help="genrubric only: the verifier's and generator's prompt style (default "
                        "full); to judge a run's rubrics as it did, its rubric.template_style")
    p.add_argument("--runs", type=_positive_int, default=None,
                   help="genrubric only: rubric-generation runs per query (default 1); the "
                        "agreement metrics are computed per query and run, averaged over runs, "
                        "then over queries (needs --temperature > 0 for more than one)")
    p.add_argument("--top-k", type=_positive_int, default=None,
                   help="genrubric only: also report agreement on each query's K responses "
                        "the expert rubric scores highest (the paper's high-quality subset: 3)")
    p.add_argument("--num-rubrics", type=_positive_int, default=None,
                   help=f"dynamic_rubric only: rubrics written per candidate set (G, default "
                        f"{PreferenceConfig().num_rubrics})")
    p.add_argument("--format", choices=("auto", *FORMATS), default=None,
                   help="dynamic_rubric only: ab {prompt, response_a, response_b, label}, ranked "
                        "{prompt, answers: [{answer, rank}]} or prometheus (MT-Bench rows "
                        "{idx, instruction, gpt4_score}); auto (default) tells by the first "
                        "row's fields")
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
                   help="queries (candidate sets) per batch")
    p.add_argument("--seed", type=int, default=defaults.seed,
                   help="rubric sampling, the order candidates are shown in and the bootstrap "
                        "resamples")
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


def _common(args: argparse.Namespace) -> dict[str, Any]:
    """The `CommonConfig` fields from the flags."""
    return dict(max_items=args.max_items, max_item_tokens=args.max_item_tokens,
                max_new_tokens=args.max_new_tokens, max_prompt_tokens=args.max_prompt_tokens,
                max_response_tokens=args.max_response_tokens, batch_size=args.batch_size,
                seed=args.seed, temperature=args.temperature,
                chat_template_kwargs=args.chat_template_kwargs)


def _model(path: str, dtype: str | None) -> tuple[Any, Any]:
    return jaxrubric.load_pretrained(path, dtype=dtype), jaxrubric.load_tokenizer(path)


@dataclasses.dataclass(frozen=True)
class _Method:
    """What the command needs of a method: the flags only it reads, whether it writes
    rubrics, how it loads its data and config, how it evaluates and prints."""

    flags: tuple[str, ...]
    generates: Callable[[argparse.Namespace], bool]
    generator_reason: str  # "X needs --generator"
    load: Callable[[argparse.Namespace], tuple[CommonConfig, Any]]
    empty: Callable[[Any], bool]  # loaded data with nothing to score
    evaluate: Callable[..., EvalResult]
    format: Callable[[Mapping[str, Any]], str]
    unit: str  # what ``loaded.records`` are


def _load_genrubric(args: argparse.Namespace) -> tuple[CommonConfig, Any]:
    config = EvalConfig(rubrics=args.rubrics or "generated", runs=args.runs or 1,
                        top_k=args.top_k, template_style=args.template_style or "full",
                        **_common(args))
    loaded = load_healthbench(args.data, skip_bad_rows=args.skip_bad_rows, split=args.split)
    if config.rubrics in RUBRIC_SOURCES:
        return config, loaded
    rubrics = (loaded if config.rubrics == args.data else
               load_healthbench(config.rubrics, skip_bad_rows=args.skip_bad_rows,
                                split=args.split))
    records = rubrics_from(loaded.records, rubrics.records, data=loaded.source,
                           source=rubrics.source)
    problems = loaded.problems + (rubrics.problems if rubrics is not loaded else [])
    return config, dataclasses.replace(loaded, records=records, problems=problems)


def _load_preference(args: argparse.Namespace) -> tuple[CommonConfig, Any]:
    config = PreferenceConfig(num_rubrics=args.num_rubrics or PreferenceConfig.num_rubrics,
                              **_common(args))
    return config, load_candidate_sets(args.data, format=args.format or "auto",
                                       skip_bad_rows=args.skip_bad_rows, split=args.split)


def _genrubric(loaded, config, verifier, verifier_tokenizer, generator, generator_tokenizer,
               progress):
    return evaluate(loaded.records, verifier, verifier_tokenizer, config, generator=generator,
                    generator_tokenizer=generator_tokenizer, progress=progress)


def _preference(loaded, config, verifier, verifier_tokenizer, generator, generator_tokenizer,
                progress):
    return evaluate_preferences(loaded.records, generator, generator_tokenizer, verifier,
                                verifier_tokenizer, config, format=loaded.format,
                                progress=progress)


METHODS = {
    "genrubric": _Method(
        flags=("rubrics", "runs", "top_k", "template_style"),
        generates=lambda args: args.rubrics in (None, "generated"),
        generator_reason="--rubrics generated", load=_load_genrubric,
        empty=lambda loaded: not any(r.responses for r in loaded.records),
        evaluate=_genrubric, format=format_metrics, unit="rows"),
    "dynamic_rubric": _Method(
        flags=("num_rubrics", "format"), generates=lambda args: True,
        generator_reason="--method dynamic_rubric", load=_load_preference,
        empty=lambda loaded: not loaded.records, evaluate=_preference,
        format=format_preference_metrics, unit="sets"),
}
_NOTHING_TO_SCORE = {"rows": "no valid row has reference completions to score",
                     "sets": "no valid candidate set"}


def run(args: argparse.Namespace) -> int:
    """The ``evaluate`` command: load, judge, write the outputs, print the metrics."""
    method = METHODS[args.method]
    for name, other in METHODS.items():
        for flag in set(other.flags) - set(method.flags):
            if getattr(args, flag) is not None:
                return _error(f"--{flag.replace('_', '-')} is not a --method {args.method} "
                              f"flag (it is --method {name}'s)")
    generated = method.generates(args)
    if generated and not args.generator:
        return _error(f"{method.generator_reason} needs --generator")
    try:
        config, loaded = method.load(args)
    except ValueError as e:  # a DataError, or a config value out of range
        return _error(str(e))
    for problem in loaded.problems:
        print(f"skipped: {problem}", file=sys.stderr)
    if method.empty(loaded):
        return _error(f"{loaded.source}: {_NOTHING_TO_SCORE[method.unit]}")
    verifier, verifier_tokenizer = _model(args.verifier, args.dtype)
    generator, generator_tokenizer = (_model(args.generator, args.dtype) if generated
                                      else (None, None))
    result = method.evaluate(loaded, config, verifier, verifier_tokenizer, generator,
                             generator_tokenizer, not args.no_progress)
    result.metrics = {"data": {"source": loaded.source, method.unit: len(loaded.records),
                               "bad_rows_skipped": loaded.skipped, "bad_rows": loaded.problems},
                      **result.metrics}
    out = write_outputs(result, args.out)
    print(method.format(result.metrics))
    print(f"wrote {out}/rubrics.jsonl, verdicts.jsonl, scores.jsonl, metrics.json")
    return 0
