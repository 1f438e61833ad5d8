"""Training configuration: one ml_collections tree, every value with one home and a default.

Config files are Python modules with `get_config()`; relative paths in them are relative to
the config file's folder. `--config.a.b=value` overrides are parsed with the type of the
default they replace, and everything is checked before any model is loaded.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from collections.abc import Sequence
from pathlib import Path

import ml_collections

from jaxrubric.coevolve import RoundConfig
from jaxrubric.placement import ROLES, resolve_submeshes
from jaxrubric.rubric.templates import STYLES


class ConfigFileError(ValueError):
    """A config file or override that cannot be used, naming the key."""


def base_config() -> ml_collections.ConfigDict:
    """Every key a training config may set, with its default."""
    c = ml_collections.ConfigDict()
    c.method = "dynamic_rubric"
    c.seed = 0
    c.rounds = 1
    c.mesh = ml_collections.ConfigDict({"data": 1, "fsdp": -1, "tensor": 1})
    # Every role on `mesh` (all empty, the default), or each role on its own devices: a mesh
    # such as "fsdp=4" or an earlier role's name to share its mesh, e.g. policy "fsdp=4",
    # generator "policy", verifier "data=-1" (jaxrubric.placement). Then `mesh` is unused.
    c.submeshes = ml_collections.ConfigDict({"policy": "", "generator": "", "verifier": ""})
    c.tokenizer = ""  # a folder or hub id; empty: the policy checkpoint's tokenizer
    c.chat_template_kwargs = ml_collections.ConfigDict({})
    # attention_chunk > 0: attention over blocks of that many queries (ModelConfig).
    for role in ("policy", "generator", "verifier"):
        c[role] = ml_collections.ConfigDict(
            {"path": "", "seed": 0, "dtype": "float32", "param_dtype": "float32",
             "remat": "none", "attention_chunk": 0})
    # data.eval: held-out prompts with anchor lists for the evaluator's Δgap (and, with an
    # oracle, the policy's ground-truth quality), evaluated every `eval_every` rounds on its
    # first `eval_batch_size` rows (0: data.batch_size).
    c.data = ml_collections.ConfigDict({
        "train": "", "eval": "", "batch_size": 8, "eval_batch_size": 0, "prompt_tokens": 512, "policy_tokens": 640,
        "anchor_tokens": 512, "num_anchors": 4, "skip_bad_rows": False,
    })
    # template_style: "full" instructions for real LLMs, "compact" for small models trained
    # from scratch (jaxrubric.rubric.templates.STYLES).
    c.rubric = ml_collections.ConfigDict({"max_items": 12, "max_item_tokens": 48,
                                          "template_style": "full"})
    c.round = ml_collections.ConfigDict(dataclasses.asdict(RoundConfig()))
    c.optim = ml_collections.ConfigDict({
        "policy_lr": 1e-6, "generator_lr": 5e-6, "weight_decay": 0.0, "max_grad_norm": 1.0,
        "b1": 0.9, "b2": 0.999,
    })
    c.checkpoint_every = 1
    c.keep_checkpoints = 3
    c.log_every = 1
    c.eval_every = 0  # 0: evaluate at the start and after the last round only
    c.profile_round = 0  # > 0: a jax.profiler trace of that round in the TensorBoard folder
    # A ground-truth reward by name (jaxrubric.train.ORACLES), for round.policy_reward="oracle"
    # and for the eval quality: only worlds with a known answer (the toy world) have one.
    c.oracle = ""
    return c


def paper_recipe(checkpoint: str, chat_template_kwargs: dict | None = None,
                 method: str = "dynamic_rubric") -> ml_collections.ConfigDict:
    """The paper settings for an 8B model in every role: K = 8, beta = 0.01, AdamW at lr 1e-6
    (policy) / 5e-6 (generator), anchor weight 1, Nectar anchor lists.

    GenRubric uses the same optimiser settings; it writes G = 4 signed groups per query (each
    inducing one response, judged by the other three) and ignores the anchor answers.

    Memory (sized with `jaxrubric plan` for v5p-8, fsdp=4 at 95 GiB, and 8xH100, fsdp=8 at
    80 GiB): attention over blocks of 128 queries, rollouts and verification over 8
    micro-batches of prompts (one or two prompts per chip at a time), and updates over 64
    micro-batches for DynamicRubric (one generator row, all 8 responses and ~10k tokens, per
    v5p chip at a time) or 32 for GenRubric (two of its shorter rows).
    """
    config = base_config()
    config.method = method
    config.rounds = 500
    config.mesh.fsdp = -1
    for key, value in (chat_template_kwargs or {}).items():
        config.chat_template_kwargs[key] = value
    for role in ("policy", "generator", "verifier"):
        config[role].path = checkpoint
        config[role].dtype = "bfloat16"
    for role in ("policy", "generator"):  # trained: fp32 master weights, recomputed layers
        config[role].param_dtype = "float32"
        config[role].remat = "full"
    for role in ("policy", "generator", "verifier"):
        config[role].attention_chunk = 128
    config.verifier.param_dtype = "bfloat16"  # frozen
    config.data.train = "berkeley-nest/Nectar"
    config.data.batch_size = 64
    config.data.prompt_tokens = 512
    config.data.policy_tokens = 640
    config.data.anchor_tokens = 512
    config.data.num_anchors = 4
    config.rubric.max_items = 12
    config.rubric.max_item_tokens = 48
    config.round.num_responses = 8
    config.round.num_rubrics = 4
    config.round.response_tokens = 1024
    config.round.policy_beta = 0.01
    config.round.generator_beta = 0.01
    config.round.anchor_weight = 1.0
    config.round.logprob_chunk = 256
    config.round.rollout_micro_batches = 8
    config.round.update_micro_batches = 32 if method == "genrubric" else 64
    config.optim.policy_lr = 1e-6
    config.optim.generator_lr = 5e-6
    config.checkpoint_every = 25
    config.log_every = 1
    return config


def load_config(path: str | Path, overrides: Sequence[str] = ()) -> ml_collections.ConfigDict:
    """Loads `get_config()` from a Python file, or a training workdir's saved `config.json`,
    applies `a.b=value` overrides, resolves paths, checks."""
    path = Path(path)
    if not path.is_file():
        raise ConfigFileError(f"config file {path} does not exist")
    if path.suffix == ".json":
        config = ml_collections.ConfigDict(json.loads(path.read_text()))
    else:
        spec = importlib.util.spec_from_file_location(f"jaxrubric_config_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        if not hasattr(module, "get_config"):
            raise ConfigFileError(f"{path} has no get_config()")
        config = module.get_config()
    for override in overrides:
        apply_override(config, override)
    base = path.parent.resolve()
    for key in ("tokenizer", "data.train", "data.eval", "policy.path", "generator.path",
                "verifier.path"):
        value = _get(config, key)
        if value and not Path(value).is_absolute() and (base / value).exists():
            _set(config, key, str(base / value))
    check_config(config)
    return config


def apply_override(config: ml_collections.ConfigDict, override: str) -> None:
    """`a.b=value`: the value is parsed with the type of the current value."""
    key, sep, raw = override.partition("=")
    if not sep:
        raise ConfigFileError(f"override {override!r} is not key=value")
    current = _get(config, key)
    if isinstance(current, bool):
        if raw.lower() not in ("true", "false", "1", "0"):
            raise ConfigFileError(f"config.{key} takes true/false, got {raw!r}")
        value = raw.lower() in ("true", "1")
    elif current is None:
        value = raw if raw.lower() != "none" else None
    else:
        try:
            value = type(current)(raw)
        except (TypeError, ValueError) as err:
            raise ConfigFileError(
                f"config.{key} takes a {type(current).__name__}, got {raw!r}") from err
    _set(config, key, value)


def _get(config, key: str):
    node = config
    for part in key.split("."):
        if part not in node:
            raise ConfigFileError(f"config has no key {key!r} (at {part!r})")
        node = node[part]
    return node


def _set(config, key: str, value) -> None:
    *parents, last = key.split(".")
    node = config
    for part in parents:
        node = node[part]
    with node.ignore_type():
        node[last] = value


def round_config(config: ml_collections.ConfigDict) -> RoundConfig:
    return RoundConfig(**config.round.to_dict())


def check_config(config: ml_collections.ConfigDict) -> None:
    """Every check that needs no model: fails before anything is loaded."""
    unknown = set(config.keys()) - set(base_config().keys())
    if unknown:
        raise ConfigFileError(f"unknown config keys {sorted(unknown)}")
    if config.method not in ("dynamic_rubric", "genrubric"):
        raise ConfigFileError(f"config.method {config.method!r} is not 'dynamic_rubric' or "
                              "'genrubric'")
    for key in ("rounds", "data.batch_size", "checkpoint_every", "keep_checkpoints",
                "log_every", "rubric.max_items", "rubric.max_item_tokens"):
        if _get(config, key) < 1:
            raise ConfigFileError(f"config.{key} must be >= 1, got {_get(config, key)}")
    if not config.data.train:
        raise ConfigFileError("config.data.train: no training data file given")
    for key in ("train", "eval"):
        path = config.data[key]
        if Path(path).suffix in (".jsonl", ".json", ".parquet") and not Path(path).exists():
            raise ConfigFileError(f"config.data.{key}: {path} does not exist")
    if config.eval_every < 0 or config.profile_round < 0:
        raise ConfigFileError("config.eval_every and config.profile_round must be >= 0")
    if config.round.policy_reward == "oracle" and not config.oracle:
        raise ConfigFileError("config.round.policy_reward='oracle' needs config.oracle")
    if config.rubric.template_style not in STYLES:
        raise ConfigFileError(f"config.rubric.template_style {config.rubric.template_style!r} "
                              f"is not one of {STYLES}")
    for role in ("policy", "generator", "verifier"):
        if config[role].attention_chunk < 0:
            raise ConfigFileError(f"config.{role}.attention_chunk must be >= 0 (0: off), got "
                                  f"{config[role].attention_chunk}")
    try:
        round_config(config)
    except (TypeError, ValueError) as err:
        raise ConfigFileError(f"config.round: {err}") from err
    check_micro_batches(config)
    check_submeshes(config)


def check_submeshes(config: ml_collections.ConfigDict) -> None:
    """All three sub-meshes given or none; each a mesh or an earlier role (the device count is
    checked when the meshes are made)."""
    specs = dict(config.submeshes)
    if set(specs) != set(ROLES):
        raise ConfigFileError(f"config.submeshes has {sorted(specs)}, expected {list(ROLES)}")
    if not any(specs.values()):
        return
    try:
        resolve_submeshes(specs, device_count=None)
    except ValueError as err:
        raise ConfigFileError(str(err)) from err


def check_micro_batches(config: ml_collections.ConfigDict) -> None:
    """Micro-batches split rows into equal static shapes: each count must divide the rows it
    splits (the updates' sampled rows; the prompts of the training and held-out batches)."""
    d, rc = config.data, config.round
    per_prompt = "num_rubrics" if config.method == "genrubric" else "num_responses"
    checks = [
        ("update_micro_batches", d.batch_size * rc[per_prompt],
         f"the policy update's rows (data.batch_size x round.{per_prompt})"),
        ("update_micro_batches", d.batch_size * rc.num_rubrics,
         "the generator update's rows (data.batch_size x round.num_rubrics)"),
        ("rollout_micro_batches", d.batch_size, "the prompts (data.batch_size)"),
    ]
    if d.eval and config.method == "dynamic_rubric":
        checks.append(("rollout_micro_batches", d.eval_batch_size or d.batch_size,
                       "the held-out prompts (data.eval_batch_size)"))
    for key, rows, what in checks:
        if rows % rc[key]:
            raise ConfigFileError(f"config.round.{key}={rc[key]} must divide {what}, {rows}")
