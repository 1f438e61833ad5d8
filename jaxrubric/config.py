"""Training configuration: one ml_collections tree, every value with one home and a default.

Config files are Python modules with `get_config()` building on `base_config()`; relative paths
in them are relative to the config file's folder. Every key has a declared type (`round.*`: the
method's round config, `Method.round_config`, with its per-role records; the rest: its
default's type, or `_DECLARED` where the default does not say). `--config.a.b=value` overrides
are parsed with it, and `check_config` checks keys, types and string options before any model
is loaded, naming the key and the closest valid one. A config saved in an earlier layout is
read in today's (`config_layouts`).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import json
from collections.abc import Collection, Iterator, Sequence
from pathlib import Path
from typing import Any

import ml_collections

from jaxrubric import config_layouts, config_types
from jaxrubric.methods import METHODS, get_method
from jaxrubric.methods.method import Method
from jaxrubric.methods.round_config import RoleConfig, RoundConfig
from jaxrubric.models.config import (
    ATTENTION_IMPLS,
    LORA_TARGETS,
    REMAT_POLICIES,
    ConfigError,
    DTypeLike,
    LoraConfig,
    did_you_mean,
    dtype_name,
)
from jaxrubric.placement import resolve_submeshes
from jaxrubric.roles import ROLES, TRAINED
from jaxrubric.rubric.templates import STYLES

# Sections whose keys are the user's own: passed as they are to the tokenizer's chat template.
_FREE_FORM = ("chat_template_kwargs",)
# The role dtypes take names or JAX / NumPy dtypes (`jnp.bfloat16`); check_config turns them
# into names. Declare here any other key outside `round` whose default is None.
_DTYPE_KEYS = tuple(f"{role}.{field}" for role in ROLES for field in ("dtype", "param_dtype"))
_DECLARED: dict[str, Any] = {key: DTypeLike for key in _DTYPE_KEYS}
# Each string option -> the names it accepts.
_CHOICES: dict[str, Collection[str]] = {
    **{f"{role}.remat": REMAT_POLICIES for role in ROLES},
    **{f"{role}.attention_impl": ATTENTION_IMPLS for role in ROLES},
    "rubric.template_style": STYLES,
    "optim.lr_schedule": ("constant", "cosine"),
}


class ConfigFileError(ValueError):
    """A config file or override that cannot be used, naming the key."""


def base_config(method: str = "dynamic_rubric") -> ml_collections.ConfigDict:
    """Every key a training config of `method` may set, with its default."""
    c = ml_collections.ConfigDict()
    c.method = method
    c.seed = 0
    c.rounds = 1
    c.mesh = ml_collections.ConfigDict({"data": 1, "fsdp": -1, "tensor": 1})
    # Every role on `mesh` (all empty, the default), or each role on its own devices: a mesh
    # such as "fsdp=4" or an earlier role's name to share its mesh, e.g. policy "fsdp=4",
    # generator "policy", verifier "data=-1" (jaxrubric.placement). Then `mesh` is unused.
    c.submeshes = ml_collections.ConfigDict({"policy": "", "generator": "", "verifier": ""})
    # A program per stage (`placement.SubMeshes`) also on one mesh: the compiler lays out each
    # stage's buffers apart, not all in one program's layout (docs/scale.md: 8B on v5p-8).
    c.stage_programs = False
    c.tokenizer = ""  # a folder or hub id; empty: the policy checkpoint's tokenizer
    c.chat_template_kwargs = ml_collections.ConfigDict({})
    # attention_chunk > 0: attention over blocks of that many queries (ModelConfig).
    # attention_impl: the attention backend, auto (by the platform compiled for: TPU splash,
    # GPU cudnn, CPU xla), xla (the einsum form), splash or cudnn (jaxrubric.models.attention).
    for role in ROLES:
        c[role.value] = ml_collections.ConfigDict(
            {"path": "", "seed": 0, "dtype": _dtype_field(), "param_dtype": _dtype_field(),
             "remat": "none", "attention_chunk": 0, "attention_impl": "auto",
             "scan_layers": True})
    # LoRA on a trained role (rank 0: full fine-tuning): only the adapters train and sit in the
    # optimiser, the base weights stay frozen in the compute dtype and are the KL reference.
    # targets: comma-separated projections (q_proj, k_proj, v_proj, o_proj, gate_proj,
    # up_proj, down_proj). The verifier is never adapted.
    for role in TRAINED:
        c[role.value].lora = ml_collections.ConfigDict(
            {"rank": 0, "alpha": 32.0, "dropout": 0.0, "targets": "q_proj,k_proj,v_proj,o_proj"})
        # The KL reference of a fully fine-tuned role (round.<role>.beta): a checkpoint of the
        # same architecture, e.g. the SFT model when `path` is an earlier RL run's export.
        # Empty: the weights the role starts from (`path`).
        c[role.value].reference = ""
    # The checkpoint that writes `round.explorer_rubrics` of each prompt's rubrics (DynamicRubric;
    # the generator's architecture, e.g. its SFT cold start), loaded frozen.
    c.generator.explorer = ""
    # data.eval: held-out prompts with anchor lists for the evaluator's Δgap (and, with an
    # oracle, the policy's ground-truth quality), evaluated every `eval_every` rounds on its
    # first `eval_batch_size` rows (0: data.batch_size).
    # GenRubric's data.eval is expert-rubric rows (HealthBench schema) instead: per held-out
    # query the generator writes `eval_rubric_runs` rubrics at its temperature (plus a greedy
    # one, reported apart) and agreement with the expert rubric is averaged over those runs;
    # completions are cut to anchor_tokens, prompts to prompt_tokens (eval.expert_agreement).
    # data.gold (DynamicRubric): HealthBench rows whose expert rubrics score the policy's
    # answers at every evaluation, a gold metric for the watch (jaxrubric.methods.gold).
    c.data = ml_collections.ConfigDict({
        "train": "", "eval": "", "batch_size": 8, "eval_batch_size": 0, "prompt_tokens": 512, "policy_tokens": 640,
        "anchor_tokens": 512, "num_anchors": 4, "skip_bad_rows": False, "eval_rubric_runs": 4,
        "gold": "",
    })
    # template_style: "full" instructions for real LLMs, "compact" for small models trained
    # from scratch (jaxrubric.rubric.templates.STYLES).
    c.rubric = ml_collections.ConfigDict({"max_items": 12, "max_item_tokens": 48,
                                          "template_style": "full"})
    # The method's round settings (`Method.round_config`): those every round shares, a record
    # per trained role (`round.policy`, `round.generator`) and the method's own.
    c.round = ml_collections.ConfigDict(dataclasses.asdict(get_method(method).round_config()))
    # lr_schedule: "constant" (after `warmup_steps` of linear warm-up, if any) or "cosine"
    # (warm-up, then a cosine decay to final_lr_fraction x the lr at the run's last optimiser
    # step: rounds x round.num_updates).
    c.optim = ml_collections.ConfigDict({
        "policy_lr": 1e-6, "generator_lr": 5e-6, "weight_decay": 0.0, "max_grad_norm": 1.0,
        "b1": 0.9, "b2": 0.999, "lr_schedule": "constant", "warmup_steps": 0,
        "final_lr_fraction": 0.1,
    })
    c.checkpoint_every = 1
    c.keep_checkpoints = 3
    c.log_every = 1
    c.eval_every = 0  # 0: evaluate at the start and after the last round only
    c.profile_round = 0  # > 0: a jax.profiler trace of that round in the TensorBoard folder
    # wandb: also log TensorBoard's scalars and texts to W&B (needs `pip install
    # 'jaxrubric[wandb]'`), to project `wandb_project` (empty: WANDB_PROJECT or W&B's default)
    # as run `wandb_run_name` (empty: W&B picks one); a rerun in the workdir continues the run.
    # card_every: rubric cards of the first `card_prompts` prompts every this many rounds (0:
    # none) to cards.jsonl, TensorBoard and W&B (docs/observability.md).
    c.logging = ml_collections.ConfigDict({"wandb": False, "wandb_project": "jaxrubric",
                                           "wandb_run_name": "", "card_every": 10,
                                           "card_prompts": 2})
    # The reward-hacking watch (jaxrubric.watch): `gold` an eval metric no rubric trains on
    # (empty: eval/quality where the world has a ground truth, else data.gold's), vs the training
    # reward over `window` evaluations; `length_corr`: the score-length correlation to warn
    # at (> 0: long answers paid for, < 0: short); `stop`: save and stop at a warning.
    c.watch = ml_collections.ConfigDict({"gold": "", "window": 3, "length_corr": 0.5,
                                         "stop": False})
    # Stop once a role's update has been skipped (non-finite loss or gradient) this many rounds
    # in a row; its weights are kept as they were before the skips.
    c.max_skipped_rounds = 3
    # A ground-truth reward by name (jaxrubric.toy.ORACLES), for round.policy_reward="oracle"
    # and for the eval quality: only worlds with a known answer (the toy world) have one.
    c.oracle = ""
    return c


def _dtype_field() -> ml_collections.FieldReference:
    """float32, in a field that also takes dtype objects: ConfigDicts are type-safe, and a
    config file may say `config.policy.dtype = jnp.bfloat16`."""
    return ml_collections.FieldReference("float32", field_type=object)


def paper_recipe(checkpoint: str, chat_template_kwargs: dict | None = None,
                 method: str = "dynamic_rubric",
                 update_micro_batches: int = 8) -> ml_collections.ConfigDict:
    """The paper settings for an 8B model in every role: K = 8, beta = 0.01, AdamW at lr 1e-6
    (policy) / 5e-6 (generator), anchor weight 1, Nectar anchor lists.

    GenRubric uses the same optimiser settings; it writes G = 4 signed groups per query (each
    inducing one response, judged by the other three) and ignores the anchor answers.

    Memory (sized with `jaxrubric plan` for v5p-8, fsdp=4 at 95 GiB, and 8xH100, fsdp=8 at
    80 GiB): attention over blocks of 128 queries, rollouts and verification over 8
    micro-batches of prompts (one or two prompts per chip at a time), and the shared-prefix
    updates (`round.share_prefix`) over 8 micro-batches of prompts (`update_micro_batches`:
    one prompt under its samples per 8xH100 GPU at a time, two per v5p chip; more would leave
    chips without a prompt), their log-probs over 64-token chunks (the 16 rows of a v5p
    chip's two DynamicRubric policy prompts hold `[16, 64, vocabulary]` float32 logits).
    """
    config = base_config(method)
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
    config.round.num_rubrics = 4  # K = 8 and anchor_weight 1 are DynamicRubric's defaults
    config.round.response_tokens = 1024
    for role in TRAINED:
        config.round[role].beta = 0.01
    config.round.logprob_chunk = 64
    config.round.rollout_micro_batches = 8
    config.round.update_micro_batches = update_micro_batches
    config.optim.policy_lr = 1e-6
    config.optim.generator_lr = 5e-6
    config.checkpoint_every = 25
    config.log_every = 1
    return config


def one_chip_recipe(checkpoint: str, method: str = "dynamic_rubric", *,
                    update_micro_batches: int = 8, lora_rank: int = 16,
                    chat_template_kwargs: dict | None = None) -> ml_collections.ConfigDict:
    """`paper_recipe` cut to fit one 16 GB chip with a ~0.6B model: LoRA of `lora_rank` on
    every projection of the policy and the generator (fp32 adapters over a bf16 base; 10x the
    full-fine-tuning learning rates, as LoRA wants), 8 prompts a round, shorter prompts,
    answers and rubrics, rollouts in 2 micro-batches (sized with `jaxrubric plan`)."""
    config = paper_recipe(checkpoint, chat_template_kwargs, method=method,
                          update_micro_batches=update_micro_batches)
    config.rounds = 200
    config.data.batch_size = 8
    config.data.prompt_tokens = 384
    config.data.policy_tokens = 448
    config.data.anchor_tokens = 256
    config.round.response_tokens = 256
    config.rubric.max_items = 8
    config.rubric.max_item_tokens = 32
    config.round.rollout_micro_batches = 2
    for role in ("policy", "generator"):
        config[role].lora.rank = lora_rank
        config[role].lora.alpha = 2.0 * lora_rank
        config[role].lora.targets = ",".join(LORA_TARGETS)
        config[role].param_dtype = "float32"  # the adapters (the base stays in bfloat16)
    config.optim.policy_lr = 1e-5
    config.optim.generator_lr = 5e-5
    config.checkpoint_every = 20
    return config


def load_config(path: str | Path, overrides: Sequence[str] = ()) -> ml_collections.ConfigDict:
    """Loads `get_config()` from a Python file (`FILE.py:ARG`: `get_config("ARG")`, e.g. a
    recipe sized for a slice, `jaxrubric.recipes`), or a training workdir's saved
    `config.json`, applies `a.b=value` overrides, resolves paths, checks."""
    path, argument = split_config_argument(path)
    if not path.is_file():
        raise ConfigFileError(f"config file {path} does not exist")
    if path.suffix == ".json":
        if argument is not None:
            raise ConfigFileError(f"{path}: a saved config takes no ':{argument}'")
        config = saved_config(json.loads(path.read_text()))
    else:
        config = _run_config_file(path, argument)
    for override in overrides:
        apply_override(config, override)
    base, leaves = path.parent.resolve(), dict(_leaves(config))
    for key in ("tokenizer", "data.train", "data.eval", "policy.path", "generator.path",
                "verifier.path", "policy.reference", "generator.reference",
                "generator.explorer"):
        value = leaves.get(key)  # absent or not a string: check_config says so
        if isinstance(value, str) and value and not Path(value).is_absolute() and (
                base / value).exists():
            _set(config, key, str(base / value))
    check_config(config)
    return config


def saved_config(data: dict[str, Any]) -> ml_collections.ConfigDict:
    """A workdir's saved config in today's layout (`config_layouts.upgrade`); keys and sections
    added to `base_config()` since it was written take their defaults (so older runs still
    resume and export), a round of the method's own type (`conform_round`); misspelled keys
    are still refused by the checks."""
    config = ml_collections.ConfigDict(config_layouts.upgrade(data))
    method = config.get("method")
    present = {key for key, _ in _leaves(config)}
    for key, value in _leaves(base_config(method if method in METHODS else "dynamic_rubric")):
        if key not in present:  # a key or section added since
            _set(config, key, value)
    if method in METHODS:
        conform_round(config, get_method(method))
    return config


def split_config_argument(path: str | Path) -> tuple[Path, str | None]:
    """`FILE.py:ARG` -> (FILE.py, ARG); a path without one -> (path, None)."""
    text = str(path)
    head, sep, tail = text.rpartition(":")
    if sep and head.endswith((".py", ".json")) and "/" not in tail:
        return Path(head), tail
    return Path(text), None


def _run_config_file(path: Path, argument: str | None = None) -> ml_collections.ConfigDict:
    """`get_config()` (or `get_config(argument)`) of a Python config file; a value of the
    wrong type assigned there fails as a ConfigFileError (ConfigDicts are type-safe), like any
    other bad value, and so does an argument the file does not take."""
    spec = importlib.util.spec_from_file_location(f"jaxrubric_config_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not hasattr(module, "get_config"):
        raise ConfigFileError(f"{path} has no get_config()")
    try:
        return module.get_config() if argument is None else module.get_config(argument)
    except (TypeError, ValueError) as err:
        raise ConfigFileError(f"{path}: get_config({'' if argument is None else repr(argument)})"
                              f": {err}") from err


def apply_override(config: ml_collections.ConfigDict, override: str) -> None:
    """`a.b=value`: the value is parsed with the key's declared type (`none` gives None where
    the type allows it, bools are true/false/1/0); a free-form section takes new keys."""
    key, sep, raw = override.partition("=")
    if not sep:
        raise ConfigFileError(f"override {override!r} is not key=value")
    section, _, name = key.partition(".")
    if section in _FREE_FORM and name and "." not in name:
        value = config_types.free_form_value(raw)
    elif key in _field_types() and key not in _FREE_FORM:
        value = _parse(key, raw, _field_types()[key])
    elif key in _known():
        raise ConfigFileError(f"config.{key} is a section: set its keys (config.{key}.KEY=...)")
    else:
        raise ConfigFileError(_no_key(key))
    _set(config, key, value)


def _parse(key: str, raw: str, hint: Any) -> Any:
    """`raw` as a value of the declared type `hint`, the first member of a union that parses."""
    members = config_types.union_members(hint)
    if type(None) in members and raw.lower() == "none":
        return None
    for member in members:
        try:
            return config_types.cast(raw, member)
        except ValueError:
            continue
    raise ConfigFileError(f"config.{key} takes a {config_types.type_name(hint)}, got {raw!r}")







@functools.cache
def _field_types() -> dict[str, Any]:
    """Each key of `base_config()`, dotted (a free-form section is one key) -> its declared
    type: for `round.*` every method's round config's (`RoundConfig.declared`), else
    `_DECLARED`, or the default's type."""
    declared = {f"round.{key}": hint for method in METHODS.values()
                for key, hint in method.round_config.declared().items()}
    for key, default in _leaves(base_config()):
        if key.startswith("round."):
            continue
        if key in _DECLARED:
            declared[key] = _DECLARED[key]
        elif default is None:
            raise TypeError(f"config.{key} defaults to None: declare its type in _DECLARED")
        else:
            declared[key] = type(default)
    return declared


def _leaves(node: ml_collections.ConfigDict, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, value) of every leaf; free-form sections are leaves."""
    for name, value in node.items():
        key = prefix + name
        if isinstance(value, ml_collections.ConfigDict) and key not in _FREE_FORM:
            yield from _leaves(value, key + ".")
        else:
            yield key, value


@functools.cache
def _known() -> frozenset[str]:
    """Every key and section of `base_config()`, dotted."""
    return frozenset(".".join(key.split(".")[:n]) for key in _field_types()
                     for n in range(1, key.count(".") + 2))


def _no_key(key: str, keys: Collection[str] | None = None) -> str:
    """Names the shortest part of `key` that `base_config()` lacks, and where it moved or the
    closest of `keys` (default: every key of every method)."""
    moved = config_layouts.moved_to(key)
    if moved:
        return f"config.{key} is {moved} now"
    parts = key.split(".")
    role_key = parts[1:] if parts[0] == "round" else parts
    if len(role_key) == 2 and role_key[0] in ROLES and role_key[1] in {
            f.name for f in dataclasses.fields(RoleConfig)}:
        where = ", ".join(f"config.round.{role}.{role_key[1]}" for role in TRAINED)
        return (f"config has no key {key!r}: the round's per-role settings are the trained "
                f"roles' ({where})")
    prefixes = (".".join(parts[:n]) for n in range(1, len(parts) + 1))
    unknown = next((prefix for prefix in prefixes if prefix not in _known()), key)
    return f"config has no key {unknown!r}{did_you_mean(unknown, keys or _field_types())}"


def _get(config: ml_collections.ConfigDict, key: str) -> Any:
    node = config
    for part in key.split("."):
        node = node[part]
    return node


def _set(config: ml_collections.ConfigDict, key: str, value: Any) -> None:
    """Sets a dotted key, creating the sections it needs."""
    *parents, last = key.split(".")
    node = config
    for part in parents:
        if part not in node:
            with node.ignore_type():
                node[part] = ml_collections.ConfigDict()
        node = node[part]
    with node.ignore_type():
        node[last] = value


def role_lora(config: ml_collections.ConfigDict, role: str) -> LoraConfig | None:
    """A trained role's `lora` section as the decoder's LoraConfig (None at rank 0)."""
    section = config[role].lora
    if section.rank == 0:
        return None
    try:
        return LoraConfig(rank=section.rank, alpha=section.alpha, dropout=section.dropout,
                          targets=tuple(t.strip() for t in section.targets.split(",")
                                        if t.strip()))
    except ConfigError as err:
        raise ConfigFileError(f"config.{role}.{err}") from err


def round_config(config: ml_collections.ConfigDict) -> RoundConfig:
    """The round section as the method's round config the round is built from."""
    return get_method(config.method).round_config.from_tree(config.round.to_dict())


def conform_round(config: ml_collections.ConfigDict, method: Method) -> None:
    """`config.round` as `method` declares it (`Method.round_config`): another method's keys
    left at their defaults (a config built for one method and switched to the other) are
    dropped, keys it lacks take their defaults; another method's key set to anything else is
    refused, named with the closest of this method's keys."""
    own = dict(_leaves(ml_collections.ConfigDict(dataclasses.asdict(method.round_config()))))
    present = dict(_leaves(config.round))
    for key, value in present.items():
        owner = next((m for m in METHODS.values() if key in m.round_config.declared()), None)
        if key in own or owner is None:  # not a round key at all: `_check_keys` names it
            continue
        if value != dataclasses.asdict(owner.round_config()).get(key, value):
            raise ConfigFileError(
                f"config.round.{key} is a {owner.name} setting; {method.name} has no such "
                f"key{did_you_mean(f'round.{key}', [f'round.{k}' for k in own])}")
        del config.round[key]
    for key, value in own.items():
        if key not in present:
            _set(config, f"round.{key}", value)


def check_config(config: ml_collections.ConfigDict) -> None:
    """Every check that needs no model, so a bad config fails in seconds, before anything
    loads: keys at every depth, types, string options, ranges, then the method's own checks.
    Role dtypes given as objects are replaced by their names."""
    try:
        method = get_method(config.method)
    except ValueError as err:
        raise ConfigFileError(str(err)) from err
    conform_round(config, method)
    _check_keys(config, method)
    _check_types(config)
    _check_choices(config, method)
    if config.logging.wandb and importlib.util.find_spec("wandb") is None:
        raise ConfigFileError("config.logging.wandb=True needs the wandb package, which is not "
                              "installed: pip install 'jaxrubric[wandb]'")
    for key in ("rounds", "data.batch_size", "checkpoint_every", "keep_checkpoints",
                "log_every", "rubric.max_items", "rubric.max_item_tokens", "max_skipped_rounds",
                "data.eval_rubric_runs"):
        if _get(config, key) < 1:
            raise ConfigFileError(f"config.{key} must be >= 1, got {_get(config, key)}")
    if not config.data.train:
        raise ConfigFileError("config.data.train: no training data file given")
    for key in ("train", "eval", "gold"):
        path = config.data[key]
        if Path(path).suffix in (".jsonl", ".json", ".parquet") and not Path(path).exists():
            raise ConfigFileError(f"config.data.{key}: {path} does not exist")
    if config.logging.card_every < 0 or config.logging.card_prompts < 1:
        raise ConfigFileError("config.logging.card_every must be >= 0 and card_prompts >= 1")
    if config.watch.window < 2 or not 0 < abs(config.watch.length_corr) <= 1:
        raise ConfigFileError("config.watch.window must be >= 2, watch.length_corr in [-1, 1], "
                              "not 0")
    if config.eval_every < 0 or config.profile_round < 0:
        raise ConfigFileError("config.eval_every and config.profile_round must be >= 0")
    if config.optim.warmup_steps < 0:
        raise ConfigFileError(f"config.optim.warmup_steps must be >= 0, got "
                              f"{config.optim.warmup_steps}")
    if not 0.0 <= config.optim.final_lr_fraction <= 1.0:
        raise ConfigFileError(f"config.optim.final_lr_fraction must be in [0, 1], got "
                              f"{config.optim.final_lr_fraction}")
    for role in ROLES:
        if config[role].attention_chunk < 0:
            raise ConfigFileError(f"config.{role}.attention_chunk must be >= 0 (0: off), got "
                                  f"{config[role].attention_chunk}")
    for role in TRAINED:
        if config[role].lora.rank < 0:
            raise ConfigFileError(f"config.{role}.lora.rank must be >= 0 (0: off), got "
                                  f"{config[role].lora.rank}")
        role_lora(config, role)
        if config[role].reference and config[role].lora.rank:
            raise ConfigFileError(f"config.{role}.reference: a LoRA role's KL reference is its "
                                  "base (its path, the adapters off); leave it empty")
    try:
        round_config(config)
    except (TypeError, ValueError) as err:
        raise ConfigFileError(f"config.round.{err}") from err
    check_submeshes(config)
    try:
        method.check_config(config)
    except ValueError as err:
        raise ConfigFileError(str(err)) from err


def _check_keys(config: ml_collections.ConfigDict, method: Method) -> None:
    """The keys of `base_config()` with `method`'s round, no more (misspellings), no fewer (a
    config file that does not build on it)."""
    keys = {key for key, _ in _leaves(config)}
    declared = {key for key in _field_types() if not key.startswith("round.")} | {
        f"round.{key}" for key in method.round_config.declared()}
    unknown, missing = keys - declared, declared - keys
    if unknown:
        raise ConfigFileError(_no_key(min(unknown), declared))
    if missing:
        raise ConfigFileError(f"config lacks key {min(missing)!r}: build config files on "
                              "jaxrubric.config.base_config()")


def _check_types(config: ml_collections.ConfigDict) -> None:
    """Each value has its key's declared type (dtypes are checked by `_check_choices`)."""
    for key, value in _leaves(config):
        hint = _field_types()[key]
        if key not in _DTYPE_KEYS and not config_types.matches(value, hint):
            raise ConfigFileError(f"config.{key} takes a {config_types.type_name(hint)}, got {value!r} "
                                  f"({type(value).__name__})")


def _check_choices(config: ml_collections.ConfigDict, method: Method) -> None:
    """Every string option names a registered one; role dtypes become names."""
    choices = {**_CHOICES, **{f"round.{key}": allowed
                              for key, allowed in method.round_config.choices().items()}}
    for key, allowed in choices.items():
        value = _get(config, key)
        if value not in allowed:
            raise ConfigFileError(f"config.{key} {value!r} is not one of {sorted(allowed)}"
                                  f"{did_you_mean(value, allowed)}")
    for key in _DTYPE_KEYS:
        try:
            _set(config, key, dtype_name(_get(config, key), field=f"config.{key}"))
        except ConfigError as err:
            raise ConfigFileError(str(err)) from err


def check_submeshes(config: ml_collections.ConfigDict) -> None:
    """All three sub-meshes given or none, each a mesh or an earlier role's; devices: later."""
    specs = dict(config.submeshes)
    if set(specs) != set(ROLES):
        raise ConfigFileError(f"config.submeshes has {sorted(specs)}, expected {list(ROLES)}")
    if config.stage_programs and config.round.runtime_switches:  # a program per stage
        raise ConfigFileError("config.round.runtime_switches needs the round as one program")
    if not any(specs.values()):
        return
    try:
        resolve_submeshes(specs, device_count=None)
    except ValueError as err:
        raise ConfigFileError(str(err)) from err
