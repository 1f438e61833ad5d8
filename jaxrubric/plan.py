"""`jaxrubric plan`: will a training config fit in device memory, per device, before any run?

A co-evolution round holds three models, two optimiser states and the references at once, and
its rollouts and updates need KV caches and activations on top. This module answers from the
config alone, in seconds on a laptop CPU: no weights are loaded and no devices of the target
mesh are needed. Parameter shapes and their `logical_axes` come from the real model code
(`nnx.eval_shape` of `Decoder`), their per-device shards from `sharding.logical_to_spec` on an
abstract mesh, and optimiser state from `optax`'s own `init` evaluated on those shards.

Memory is counted in two kinds:

- **state**, held for the whole round: policy and generator parameters, their AdamW states
  (two moments in the parameter dtype and a step count; gradient clipping keeps nothing),
  the reference copies of each role whose beta > 0 (in the compute dtype when it is narrower
  than the parameters', as `train.reference_params` keeps them), the verifier's parameters
  and the batch;
- **phases**, one after another inside the round, each freeing its buffers before the next:
  policy rollout, generator rollout, verifier passes, generator update, policy update. The
  peak is the state plus the largest phase, not the sum of all phases; this is also what
  XLA's buffer assignment reports as temporary memory (`--compile` compares the two).

The phases' formulas (bytes per device of each stage, from the model's dimensions and the
round's shapes) are in `jaxrubric.plan_phases`; `--compile`'s check against XLA is in
`jaxrubric.plan_compile`.

With roles on sub-meshes (`config.submeshes`, `jaxrubric.placement`) a chip holds only the
state of the roles on its mesh and runs only their stages, each stage a program of its own, so
the plan has one section per mesh and fits when every mesh does. The batch lives on the
policy's mesh; a stage on another mesh also holds the inputs moved to it (the batch, responses,
rubrics, advantages: small next to the models). `--compile` then compiles each stage program
and sets XLA's numbers beside the plan's, per mesh.

Checked against XLA (`tests/test_plan.py`, tiny config, CPU): arguments agree to the byte;
temporaries within 0.9-1.25x where XLA partitions as the rules intend (data-parallel mesh),
0.88x with the 8B recipes' memory settings (chunked attention, micro-batched rollouts and
updates, remat full; XLA:CPU allocates the gradient sum's zeros early). On an `fsdp` mesh
XLA may keep some activations whole over the batch (the model code puts no sharding
constraints on activations), and then needs more than the plan says: twice as much on the
tiny config with fsdp=8.

Where the tokenizer cannot be read offline (a hub id not in the local cache) the prompt
templates' constant lengths are estimated from their text (`CHARS_PER_TOKEN`) and the plan
says so; those templates are a few hundred tokens next to prompts and responses of thousands.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
import sys
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx
from jax.sharding import AbstractMesh, AxisType

from jaxrubric import placement
from jaxrubric.placement import ROLES
from jaxrubric import sharding as shd
from jaxrubric.config import ConfigFileError, load_config, round_config
from jaxrubric.models.config import ConfigError, ModelConfig, tiny_config
from jaxrubric.models.hf import CheckpointError, load_tokenizer, read_config_json
from jaxrubric.genrubric_round import GENRUBRIC_WEIGHTS
from jaxrubric.models.transformer import Decoder
from jaxrubric.plan_phases import (Local, Phase, rollout_phase, rows_per_device, update_phase,
                                   verifier_phase, with_inputs)
from jaxrubric.rubric import grammar as grammar_lib
from jaxrubric.rubric import templates as tpl

GIB = 1024**3
TRAINED = ("policy", "generator")
CHARS_PER_TOKEN = 4  # English prose under a 128k-150k BPE vocabulary: about 4 characters
CHAT_HEAD_TOKENS = 32  # chat-template tokens before the user text (Llama 3.1 adds a system turn)
CHAT_TAIL_TOKENS = 16  # end of turn + assistant header (+ Qwen3's empty think block)
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4}

# The config.json fields of hub checkpoints the recipes name, for planning offline (no
# download, no cache): only what `ModelConfig.from_hf_dict` reads.
KNOWN_ARCHITECTURES: dict[str, dict[str, Any]] = {
    "Qwen/Qwen3-8B": {
        "model_type": "qwen3", "vocab_size": 151936, "hidden_size": 4096,
        "intermediate_size": 12288, "num_hidden_layers": 36, "num_attention_heads": 32,
        "num_key_value_heads": 8, "head_dim": 128, "rms_norm_eps": 1e-6, "rope_theta": 1e6,
        "tie_word_embeddings": False, "max_position_embeddings": 40960,
        "bos_token_id": 151643, "eos_token_id": 151645,
    },
    **{name: {
        "model_type": "llama", "vocab_size": 128256, "hidden_size": 4096,
        "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
        "num_key_value_heads": 8, "head_dim": 128, "rms_norm_eps": 1e-5, "rope_theta": 5e5,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        "tie_word_embeddings": False, "max_position_embeddings": 131072,
        "bos_token_id": 128000, "eos_token_id": eos,
    } for name, eos in (("meta-llama/Llama-3.1-8B-Instruct", [128001, 128008, 128009]),
                        ("meta-llama/Llama-3.1-8B", 128001))},
}
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


class PlanError(ValueError):
    """A plan that cannot be made as asked: a bad mesh, memory size or model source."""


# ----------------------------------------------------------------------------- parsing
def parse_mesh(text: str) -> dict[str, int]:
    """`data=D,fsdp=F,tensor=T` (any subset; missing axes are 1, one size may be -1)."""
    try:
        return placement.parse_mesh_spec(text)
    except ValueError as err:
        raise PlanError(f"--{err}") from None


def parse_bytes(text: str) -> int:
    """`95GiB`, `80GB`, `16384MiB` or a plain byte count -> bytes."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    if not match or match.group(2).lower() not in _UNITS:
        raise PlanError(f"memory size {text!r}: expected a number and a unit "
                        "(GiB, GB, MiB, MB, TiB, TB), e.g. 95GiB")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def resolve_mesh(shape: Mapping[str, int], devices: int | None) -> dict[str, int]:
    """A mesh shape with its -1 filled in from `devices`, checked against `devices`."""
    sizes = {axis: int(shape.get(axis, 1)) for axis in shd.MESH_AXES}
    if any(s == 0 or s < -1 for s in sizes.values()) or list(sizes.values()).count(-1) > 1:
        raise PlanError(f"mesh {sizes}: sizes must be positive, with at most one -1")
    known = math.prod(s for s in sizes.values() if s != -1)
    if -1 in sizes.values():
        if devices is None:
            raise PlanError(f"mesh {sizes} has a -1 axis: give --devices N or every axis size")
        if devices % known:
            raise PlanError(f"mesh {sizes} does not divide {devices} devices")
        sizes = {a: devices // known if s == -1 else s for a, s in sizes.items()}
    elif devices is not None and known != devices:
        raise PlanError(f"mesh {sizes} covers {known} devices, not {devices}")
    return sizes


def abstract_mesh(shape: Mapping[str, int]) -> AbstractMesh:
    """A device-free mesh: all that `sharding.logical_to_spec` needs is its shape."""
    return AbstractMesh(tuple(shape[a] for a in shd.MESH_AXES), shd.MESH_AXES,
                        axis_types=(AxisType.Auto,) * len(shd.MESH_AXES))


# ----------------------------------------------------------------------------- models
def _tokenizer_source(config: ml_collections.ConfigDict) -> str:
    return config.tokenizer or config.policy.path


def load_tokenizer_offline(source: str) -> Any | None:
    """The tokenizer of a local folder, or of a hub id already in the local cache; None when
    neither exists (planning never downloads)."""
    if not source:
        return None
    folder = Path(source).expanduser()
    if folder.is_dir():  # a weights-only folder has no tokenizer to read
        has_files = any((folder / f).is_file() for f in _TOKENIZER_FILES)
        return load_tokenizer(folder) if has_files else None
    from transformers import AutoTokenizer
    try:
        return AutoTokenizer.from_pretrained(source, local_files_only=True)
    except (OSError, ValueError):
        return None


def _hf_config(path: str) -> tuple[dict[str, Any], str]:
    """config.json of a local folder, a cached hub id or a built-in architecture, and where
    it came from."""
    folder = Path(path).expanduser()
    if folder.is_dir():
        return read_config_json(folder), f"{folder}/config.json"
    from huggingface_hub import try_to_load_from_cache
    cached = try_to_load_from_cache(path, "config.json")
    if isinstance(cached, str):
        return json.loads(Path(cached).read_text()), f"{path} (local hub cache)"
    if path in KNOWN_ARCHITECTURES:
        return KNOWN_ARCHITECTURES[path], f"{path} (built-in architecture table)"
    raise PlanError(f"{path}: no such local folder, not in the local hub cache, and not a "
                    f"built-in architecture ({', '.join(KNOWN_ARCHITECTURES)}); pass a folder "
                    "holding its config.json")


def role_model_config(role: ml_collections.ConfigDict, tokenizer: Any, mesh: AbstractMesh,
                      config_tokenizer: str = "") -> tuple[ModelConfig, str]:
    """The `ModelConfig` the trainer builds for a role (see `train._role_model`), and its
    source; an empty path is the tiny random Qwen3 over the tokenizer's vocabulary."""
    common = dict(dtype=role.dtype, param_dtype=role.param_dtype, remat=role.remat,
                  attention_chunk=role.attention_chunk, vocab_multiple=shd.vocab_multiple(mesh))
    if role.path:
        hf, source = _hf_config(role.path)
        return ModelConfig.from_hf_dict(hf, source=source, **common), source
    if tokenizer is None:
        raise PlanError("an empty role path means a tiny random model over the tokenizer's "
                        f"vocabulary, but the tokenizer {config_tokenizer!r} cannot be read "
                        "offline")
    return tiny_config("qwen3", vocab_size=len(tokenizer), eos_token_ids=(tokenizer.eos_token_id,),
                       pad_token_id=tokenizer.pad_token_id, **common), "tiny random Qwen3"


def _param_variables(model_config: ModelConfig) -> list[nnx.Variable]:
    """The abstract parameters of the real `Decoder`, with their logical axes."""
    abstract = nnx.eval_shape(lambda: Decoder(model_config, rngs=nnx.Rngs(0)))
    return [v for _, v in nnx.to_flat_state(nnx.state(abstract, nnx.Param))]


def shard_shape(shape: Sequence[int], spec: Any, mesh_shape: Mapping[str, int]) -> tuple[int, ...]:
    """One device's slice of an array of `shape` partitioned by `spec`."""
    out = []
    for dim, entry in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec))):
        axes = () if entry is None else ((entry,) if isinstance(entry, str) else entry)
        out.append(dim // math.prod(mesh_shape[a] for a in axes))
    return tuple(out)


@dataclasses.dataclass(frozen=True)
class RoleParams:
    """A role's parameters: model config, global counts, and this device's shards."""

    config: ModelConfig
    source: str
    count: int
    layer_count: int  # parameters of one layer
    shards: list[jax.ShapeDtypeStruct]

    @property
    def bytes(self) -> int:
        return tree_bytes(self.shards)

    @property
    def reference_dtype(self) -> str:
        """The dtype `train.reference_params` stores this role's frozen copy in."""
        compute, stored = jnp.dtype(self.config.dtype), jnp.dtype(self.config.param_dtype)
        return str(compute if compute.itemsize < stored.itemsize else stored)

    @property
    def reference_bytes(self) -> int:
        size = jnp.dtype(self.reference_dtype).itemsize
        return sum(math.prod(x.shape) * size for x in self.shards)


def role_params(model_config: ModelConfig, source: str, mesh: AbstractMesh) -> RoleParams:
    """Shapes from `nnx.eval_shape` of the real model, sharded by the training rules."""
    shards, count, layer_count = [], 0, 0
    for var in _param_variables(model_config):
        axes = var.get_metadata()["logical_axes"]
        spec = shd.logical_to_spec(axes, var.shape, mesh)
        shards.append(jax.ShapeDtypeStruct(shard_shape(var.shape, spec, mesh.shape), var.dtype))
        count += math.prod(var.shape)
        if axes[0] == "layers":
            layer_count += math.prod(var.shape[1:])
    return RoleParams(model_config, source, count, layer_count, shards)


def tree_bytes(tree: Any) -> int:
    return sum(math.prod(x.shape) * jnp.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree))


def optimizer_bytes(config: ml_collections.ConfigDict, role: str, params: RoleParams) -> int:
    """The trainer's optimiser state for one role, per device: AdamW is element-wise, so its
    state for a parameter shard is its state for the whole parameter, sliced."""
    from jaxrubric.train import _optimizer
    optimizer = _optimizer(config.optim[f"{role}_lr"], config)
    return tree_bytes(jax.eval_shape(optimizer.init, params.shards))


# ----------------------------------------------------------------------------- lengths
def _estimated_template(messages: list[dict[str, str]], slots: Sequence[str]
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


def shown_responses(config: ml_collections.ConfigDict) -> int:
    """How many responses the DynamicRubric generator sees (none for the static baseline)."""
    return 0 if config.round.rubric_source == "static" else config.round.num_responses


def round_templates(config: ml_collections.ConfigDict, tokenizer: Any
                    ) -> dict[str, tpl.TokenTemplate]:
    """The generator, verifier and (GenRubric) induced-response templates of the round:
    tokenised with the real tokenizer when there is one, else estimated."""
    m, style = config.rubric.max_items, config.rubric.template_style
    genrubric = config.method == "genrubric"
    if tokenizer is not None:
        kwargs = dict(chat_template_kwargs=dict(config.chat_template_kwargs) or None, style=style)
        out = {"verifier": tpl.verifier_template(tokenizer, **kwargs)}
        if genrubric:
            out["generator"] = tpl.genrubric_generator_template(tokenizer, max_items=m, **kwargs)
            out["induced"] = tpl.induced_response_template(tokenizer, **kwargs)
        else:
            out["generator"] = tpl.dynamic_rubric_generator_template(
                tokenizer, shown_responses(config), max_items=m, **kwargs)
        return out
    mark = tpl.slot_marker
    out = {"verifier": _estimated_template(
        tpl.verifier_messages(mark("prompt"), mark("response"), mark("criterion"), style=style),
        ("prompt", "response", "criterion"))}
    if genrubric:
        out["generator"] = _estimated_template(
            tpl.genrubric_generator_messages(mark("prompt"), max_items=m, style=style),
            ("prompt",))
        out["induced"] = _estimated_template(
            tpl.induced_response_messages(mark("prompt"), mark("rubric"), style=style),
            ("rubric", "prompt"))
    else:
        responses = [f"response_{i}" for i in range(1, shown_responses(config) + 1)]
        out["generator"] = _estimated_template(
            tpl.dynamic_rubric_generator_messages(mark("prompt"), [mark(r) for r in responses],
                                                  max_items=m, style=style),
            ("prompt", *responses))
    return out


def rubric_tokens(config: ml_collections.ConfigDict) -> int:
    """The generator's output length: the grammar's longest rubric (its own property, read
    from the weights, M and Li without building the token automaton)."""
    weights = GENRUBRIC_WEIGHTS if config.method == "genrubric" else tuple(range(1, 6))
    fields = SimpleNamespace(weights=weights, max_items=config.rubric.max_items,
                             max_item_tokens=config.rubric.max_item_tokens)
    return grammar_lib.RubricGrammar.max_rubric_tokens.fget(fields)


@dataclasses.dataclass(frozen=True)
class Shapes:
    """The sequence lengths and row counts (global) of every stage of the round."""

    rubric: int  # Lrub
    generator_prompt: int  # Lgen
    policy_prompt: int  # the prompt the policy answers (chat prompt or induced prompt)
    policy_rows: int  # sampled responses per round
    generator_rows: int  # sampled rubrics per round
    verifier: dict[str, tuple[int, int]]  # pass -> (rows, tree length)


def round_shapes(config: ml_collections.ConfigDict, templates: dict[str, tpl.TokenTemplate]
                 ) -> Shapes:
    """Static shapes as `coevolve.dynamic_rubric_round` / `genrubric_round` build them."""
    d, rc = config.data, config.round
    b, k, g = d.batch_size, rc.num_responses, rc.num_rubrics
    n = rc.response_tokens
    lrub = rubric_tokens(config)
    ver = templates["verifier"]
    prefix = ver.head(2).constant_length + d.prompt_tokens
    branches = g * config.rubric.max_items * (config.rubric.max_item_tokens
                                              + len(ver.segments[-1]))
    gen_const = templates["generator"].constant_length
    if config.method == "genrubric":
        return Shapes(
            rubric=lrub, generator_prompt=gen_const + d.prompt_tokens,
            policy_prompt=templates["induced"].constant_length + lrub + d.prompt_tokens,
            policy_rows=b * g, generator_rows=b * g,
            verifier={"induced responses": (b * g, prefix + n + branches)})
    return Shapes(
        rubric=lrub,
        generator_prompt=gen_const + d.prompt_tokens + shown_responses(config) * n,
        policy_prompt=d.policy_tokens, policy_rows=b * k, generator_rows=b * g,
        verifier={"responses": (b * k, prefix + n + branches),
                  "anchors": (b * d.num_anchors, prefix + d.anchor_tokens + branches)})


# ----------------------------------------------------------------------------- the plan
def state_items(config: ml_collections.ConfigDict, params: dict[str, RoleParams], ways: int,
                roles: Collection[str] = ROLES) -> list[tuple[str, int]]:
    """What a mesh holding `roles` keeps through the round: their part of
    `coevolve.init_state`'s state and of the frozen weights (`train.CoevolveTask`), and on the
    policy's mesh the batch; colocated, exactly the compiled round's arguments."""
    rc = round_config(config)
    trained = [r for r in TRAINED if r in roles]
    items = [(f"{r} params ({params[r].config.param_dtype})", params[r].bytes) for r in trained]
    if trained:
        items.append((f"AdamW state, {'both roles' if len(trained) == 2 else trained[0]}",
                      sum(optimizer_bytes(config, r, params[r]) for r in trained)))
    items += [(f"{r} reference ({params[r].reference_dtype})", params[r].reference_bytes)
              for r in trained if getattr(rc, f"{r}_beta") > 0]
    if "verifier" in roles:
        items.append((f"verifier params ({params['verifier'].config.param_dtype})",
                      params["verifier"].bytes))
    if "policy" in roles:  # the batch is placed on the policy's mesh
        # + the rng key (2 x uint32) and the int32 round counter
        items.append(("batch, rng, round counter",
                      rows_per_device(config.data.batch_size, ways) * batch_row_bytes(config)
                      + 8 + 4))
    return items


def batch_row_bytes(config: ml_collections.ConfigDict) -> int:
    """One row of `coevolve.encode_batch`'s arrays: int32 tokens and lengths, bool masks."""
    d = config.data
    return (4 * (d.prompt_tokens + 1) + 5 * d.policy_tokens + 4
            + d.num_anchors * (4 * d.anchor_tokens + 4 + 1))


def stage_key(role: str, keep: int) -> str:
    """The plan's name of a stage program (`placement.Placement`'s `role` and `keep`): a role's
    update keeps its parameters and optimiser state; the verifier's passes are one program;
    the other stages are the roles' rollouts."""
    if keep:
        return f"{role} update"
    return "verifier" if role == "verifier" else f"{role} rollout"


def stage_role(stage: str) -> str:
    """The role whose mesh runs a stage: its name's first word (see `stage_key`)."""
    return stage.split()[0]


def sample_row_bytes(length: int) -> int:
    """One sample of `sampling.SampleResult`: int32 tokens, float32 log-probs and sampling
    log-probs, an int32 length and a bool `finished`."""
    return 12 * length + 5


def parsed_row_bytes(config: ml_collections.ConfigDict, rubric: int) -> int:
    """One rubric of `grammar.ParsedRubric`: int32 item tokens, lengths and weights, bool
    validity per item, an int32 item per rubric token and a bool `complete`."""
    m, li = config.rubric.max_items, config.rubric.max_item_tokens
    return 4 * m * li + 9 * m + 4 * rubric + 1


def moved_inputs(config: ml_collections.ConfigDict, shapes: Shapes, owners: Mapping[str, str],
                 ways: Mapping[str, int]) -> dict[str, list[tuple[str, int]]]:
    """Per stage, what its program receives from another role's mesh, per device: on
    sub-meshes a stage's inputs move to its role's mesh first (`placement.to_mesh`: split over
    that mesh's batch ways). `owners[role]` names the role's mesh (roles sharing one name the
    same role), `ways[role]` its batch ways. Empty when every role is on one mesh."""
    d, rc = config.data, round_config(config)
    g, n = rc.num_rubrics, rc.response_tokens
    question = 4 * (d.prompt_tokens + 1)  # prompt, prompt_len
    rubrics = g * sample_row_bytes(shapes.rubric)
    parsed = g * parsed_row_bytes(config, shapes.rubric)
    # stage -> the role whose mesh it reads from -> (what, bytes per prompt, bytes replicated)
    if config.method == "genrubric":
        induced = g * (5 * shapes.policy_prompt + 4 + sample_row_bytes(n) + 4)
        reads = {
            "generator rollout": {"policy": ("prompts, rng key", question, 8)},
            "policy rollout": {"generator": ("rubrics", rubrics, 0)},
            "verifier": {"policy": ("prompts, induced prompts and responses",
                                    question + induced, 0),
                         "generator": ("rubrics, parsed", rubrics + parsed, 0)},
            "generator update": {"verifier": ("token advantages", 4 * g * shapes.rubric, 0)},
            "policy update": {"verifier": ("advantages", 4 * g, 0)},
        }
    else:
        responses = rc.num_responses * (sample_row_bytes(n) + 4)  # + text_len
        reads = {
            "policy rollout": {},
            "generator rollout": {"policy": ("prompts, responses, rng key",
                                             question + responses, 8)},
            "verifier": {"policy": ("batch, responses", batch_row_bytes(config) + responses, 0),
                         "generator": ("rubrics, parsed", rubrics + parsed, 0)},
            "generator update": {"verifier": ("advantages", 4 * g, 0)},
            "policy update": {"verifier": ("advantages", 4 * rc.num_responses, 0)},
        }
    moved: dict[str, list[tuple[str, int]]] = {}
    for stage, sources in reads.items():
        role = stage_role(stage)
        moved[stage] = [
            (f"moved from the {source}'s mesh: {what}",
             rows_per_device(d.batch_size, ways[role]) * per_row + replicated)
            for source, (what, per_row, replicated) in sources.items()
            if owners[source] != owners[role]]
    return moved


def round_phases(config: ml_collections.ConfigDict, shapes: Shapes, loc: dict[str, Local],
                 params: dict[str, RoleParams], ways: int, roles: Collection[str] = ROLES,
                 moved: Mapping[str, list[tuple[str, int]]] | None = None) -> dict[str, Phase]:
    """The stages of `roles` in the round's order (`dynamic_rubric_round` / `genrubric_round`),
    on a mesh that splits the batch `ways` ways; each with the inputs `moved` to it from other
    meshes (see `moved_inputs`), held while its program runs."""
    d, rc = config.data, round_config(config)
    m = rc.rollout_micro_batches
    generator = rollout_phase(loc["generator"], d.batch_size, rc.num_rubrics,
                              shapes.generator_prompt, shapes.rubric, ways, m)
    if config.method == "genrubric":  # (stage, phase name, phase)
        stages = [("generator rollout", "generator rollout", generator),
                  ("policy rollout", "policy rollout (induced responses)", rollout_phase(
                      loc["policy"], shapes.policy_rows, 1, shapes.policy_prompt,
                      rc.response_tokens, ways, m))]
    else:
        stages = [("policy rollout", "policy rollout", rollout_phase(
                      loc["policy"], d.batch_size, rc.num_responses, shapes.policy_prompt,
                      rc.response_tokens, ways, m)),
                  ("generator rollout", "generator rollout", generator)]
    for name, (rows, length) in shapes.verifier.items():
        stages.append(("verifier", f"verifier: {name}", verifier_phase(
            loc["verifier"], rows, length, rc.num_rubrics * config.rubric.max_items, ways, m)))
    updates = {"generator": (shapes.generator_rows, shapes.generator_prompt + shapes.rubric),
               "policy": (shapes.policy_rows, shapes.policy_prompt + rc.response_tokens)}
    for role, (rows, length) in updates.items():  # the generator is updated first
        if not getattr(rc, f"freeze_{role}"):
            stages.append((f"{role} update", f"{role} update", update_phase(
                loc[role], params[role], rows, length, rc.logprob_chunk, ways,
                rc.update_micro_batches)))
    return {name: with_inputs(phase, (moved or {}).get(stage, []))
            for stage, name, phase in stages if stage_role(stage) in roles}


def uneven_micro_batches(config: ml_collections.ConfigDict, shapes: Shapes, ways: int,
                         roles: Collection[str] = ROLES) -> list[str]:
    """Notes for micro-batches whose rows do not split evenly over the chips holding the
    batch (on a mesh of `roles`): the plan counts the rows of the busiest chip, and the others
    repeat or idle."""
    rc = round_config(config)
    sampled = {"generator": shapes.generator_rows, "policy": shapes.policy_rows}
    stages = {"rollout": (config.data.batch_size, "prompts", rc.rollout_micro_batches),
              **{f"{r} update": (sampled[r], "rows", rc.update_micro_batches)
                 for r in ("generator", "policy") if r in roles}}
    notes = []
    for stage, (rows, unit, n) in stages.items():
        if (rows // n) % ways:
            notes.append(f"{stage} micro-batches of {rows // n} {unit} do not split evenly over "
                         f"the {ways} chips holding the batch (fewer micro-batches would)")
    return notes


def role_meshes(config: ml_collections.ConfigDict, devices: int | None
                ) -> dict[str, tuple[dict[str, int], str]]:
    """`{role: (mesh shape, owner)}` as `train.CoevolveTask` places the roles: all on
    `config.mesh` (owner "policy"), or on `config.submeshes` (`placement.resolve_submeshes`),
    -1 axes filled from `devices`."""
    specs = dict(config.submeshes)
    if not any(specs.values()):
        shape = resolve_mesh(dict(config.mesh), devices)
        return {role: (shape, "policy") for role in ROLES}
    try:
        resolved = placement.resolve_submeshes(specs, devices)
    except ValueError as err:
        raise PlanError(str(err)) from err
    for role, (shape, owner) in resolved.items():
        if role == owner and -1 in shape.values():
            raise PlanError(f"config.submeshes.{role}={specs[role]!r} has a -1 axis (the devices "
                            "the other meshes leave): give --devices N")
    return {role: (dict(shape), owner) for role, (shape, owner) in resolved.items()}


def mesh_name(roles: Sequence[str]) -> str:
    """A mesh named by the roles on it: `policy + generator`."""
    return " + ".join(roles)


def _mesh_plan(config: ml_collections.ConfigDict, roles: Sequence[str], shape: dict[str, int],
               params: dict[str, RoleParams], loc: dict[str, Local], shapes: Shapes,
               moved: Mapping[str, list[tuple[str, int]]], usable: int) -> dict[str, Any]:
    """One mesh's part of the plan: the state of `roles`, their phases, the peak."""
    ways = shd.batch_ways(abstract_mesh(shape))
    state = state_items(config, params, ways, roles)
    phases = round_phases(config, shapes, loc, params, ways, roles, moved)
    state_total = sum(b for _, b in state)
    phase_totals = {name: phase.total for name, phase in phases.items()}
    peak_phase = max(phase_totals, key=phase_totals.get)
    total = state_total + phase_totals[peak_phase]
    return {"mesh": shape, "devices": math.prod(shape.values()), "batch_ways": ways,
            "state": state, "state_total": state_total, "phases": phases,
            "phase_totals": phase_totals, "peak_phase": peak_phase, "total": total,
            "fits": total <= usable}


def plan_memory(config: ml_collections.ConfigDict, device_memory: int, *, headroom: float = 0.1,
                devices: int | None = None) -> dict[str, Any]:
    """The per-device memory plan of one round of `config` on `config.mesh`, or on
    `config.submeshes` (a -1 axis filled from `devices`).

    Colocated: `state` (a list of `(label, bytes)`), `phases` (name -> `Phase`), their totals,
    the peak `total` (state + largest phase), the `usable` memory after `headroom`, `fits`,
    the models, the round's lengths and the notes a reader needs (estimated templates,
    micro-batches that do not split over the chips). On sub-meshes a chip holds only its
    roles' state and runs only their stages, so `meshes` has those keys per distinct mesh
    (with its `roles`, `name` and `moved` inputs per stage); `total` is the largest peak and
    `fits` holds when every mesh fits.
    """
    if not 0 <= headroom < 1:
        raise PlanError(f"--headroom must be in [0, 1), got {headroom}")
    meshes = role_meshes(config, devices)
    groups: dict[str, list[str]] = {}  # owner -> the roles on its mesh
    for role, (_, owner) in meshes.items():
        groups.setdefault(owner, []).append(role)
    colocated = len(groups) == 1
    for owner, roles in groups.items():
        shape = meshes[owner][0]
        ways = shd.batch_ways(abstract_mesh(shape))
        if config.data.batch_size % ways:
            where = "mesh" if colocated else f"{mesh_name(roles)} mesh"
            raise PlanError(f"config.data.batch_size={config.data.batch_size} must be a multiple "
                            f"of the {ways} ways the {where} {shape} splits the batch")
    round_config(config)  # a bad round section fails here, before any model is read
    source = _tokenizer_source(config)
    tokenizer = load_tokenizer_offline(source)
    notes = [] if tokenizer is not None else [
        f"template lengths estimated: tokenizer {source!r} is not available offline "
        f"(~{CHARS_PER_TOKEN} characters per token)"]
    params = {}
    for role in ROLES:  # each role's model is built for its own mesh (vocabulary padding)
        mesh = abstract_mesh(meshes[role][0])
        params[role] = role_params(*role_model_config(config[role], tokenizer, mesh, source), mesh)
    shapes = round_shapes(config, round_templates(config, tokenizer))
    loc = {role: Local.of(params[role], meshes[role][0]["tensor"]) for role in ROLES}
    usable = int(device_memory * (1 - headroom))
    owners = {role: owner for role, (_, owner) in meshes.items()}
    role_ways = {role: shd.batch_ways(abstract_mesh(shape)) for role, (shape, _) in meshes.items()}
    moved = moved_inputs(config, shapes, owners, role_ways)
    sections = []
    for owner, roles in groups.items():
        section = _mesh_plan(config, roles, meshes[owner][0], params, loc, shapes, moved, usable)
        prefix = "" if colocated else f"{mesh_name(roles)} mesh: "
        notes += [prefix + note for note in uneven_micro_batches(
            config, shapes, section["batch_ways"], roles)]
        sections.append((roles, section))
    plan = {
        "method": config.method,
        "models": {r: {"source": params[r].source, "parameters": params[r].count,
                       "dtype": params[r].config.dtype,
                       "param_dtype": params[r].config.param_dtype} for r in ROLES},
        "lengths": {"rubric": shapes.rubric, "generator_prompt": shapes.generator_prompt,
                    "policy_prompt": shapes.policy_prompt,
                    **{f"verifier {k}": v[1] for k, v in shapes.verifier.items()}},
        "templates_estimated": tokenizer is None,
        "device_memory": device_memory, "headroom": headroom, "usable": usable,
        "notes": notes,
    }
    if colocated:
        return {**plan, **sections[0][1]}
    return {**plan, "devices": sum(s["devices"] for _, s in sections),
            "total": max(s["total"] for _, s in sections),
            "fits": all(s["fits"] for _, s in sections),
            "meshes": [dict(section, roles=roles, name=mesh_name(roles),
                            moved={stage: items for stage, items in moved.items()
                                   if stage_role(stage) in roles})
                       for roles, section in sections]}


# ----------------------------------------------------------------------------- printing
def _unit(nbytes: int) -> tuple[str, int]:
    """GiB, or MiB for plans under 1 GiB (tiny configs) so the numbers are not all 0.00."""
    return ("GiB", GIB) if nbytes >= GIB else ("MiB", 1024**2)


def _verdict(total: int, usable: int) -> str:
    return "fits" if total <= usable else (
        f"DOES NOT FIT ({total / usable:.1f}x the usable memory)")


def format_plan(plan: dict[str, Any], title: str = "") -> str:
    """The plan as a table: sections with their items, the peak and the verdict; on
    sub-meshes one table per mesh, then the verdict over all of them."""
    unit, scale = _unit(plan["total"])
    width = 66
    row = lambda label, value: f"{label:<{width}}{value / scale:>12.2f}"  # noqa: E731
    shape = lambda mesh: " ".join(f"{a}={s}" for a, s in mesh.items())  # noqa: E731
    meshes = plan.get("meshes")
    head = f"jaxrubric plan: {title} ({plan['method']}), "
    lines = [head + (f"roles on {len(meshes)} sub-meshes = {plan['devices']} devices" if meshes
                     else f"mesh {shape(plan['mesh'])} = {plan['devices']} devices, batch split "
                          f"{plan['batch_ways']} ways")]
    for role, m in plan["models"].items():
        lines.append(f"  {role:<10} {m['source']}: {m['parameters']:,} parameters, "
                     f"{m['param_dtype']} weights, {m['dtype']} compute")
    lines += [f"  note: {note}" for note in plan["notes"]]

    def table(section: dict[str, Any]) -> list[str]:
        out = [f"{'per device':<{width}}{unit:>12}",
               row("state, held through the round", section["state_total"])]
        out += [row(f"  {label}", value) for label, value in section["state"]]
        for phase_name, phase in section["phases"].items():
            out.append(row(phase_name, phase.total))
            out += [row(f"  {label}", value) for label, value in phase.items]
            if phase.rule != "sum":
                out.append(f"  (peak: {phase.rule})")
        return out

    usable = plan["usable"]
    memory = (f"device memory {plan['device_memory'] / GIB:.2f} GiB, headroom "
              f"{plan['headroom']:.0%}: {usable / GIB:.2f} GiB usable")
    if not meshes:
        state_verdict = "fits" if plan["state_total"] <= usable else "does not fit"
        return "\n".join(lines + [""] + table(plan) + [
            "",
            row(f"peak = state + largest phase ({plan['peak_phase']})", plan["total"]),
            f"{memory} -> {_verdict(plan['total'], usable)}",
            f"state alone: {plan['state_total'] / GIB:.2f} GiB -> {state_verdict}",
        ])
    for section in meshes:
        state_verdict = "fits" if section["state_total"] <= usable else "does not fit"
        lines += ["", f"{section['name']} mesh {shape(section['mesh'])} ({section['devices']} "
                      f"devices), batch split {section['batch_ways']} ways"]
        lines += table(section) + [
            row(f"peak = state + largest phase ({section['peak_phase']})", section["total"]),
            f"{section['name']} mesh -> {_verdict(section['total'], usable)}; state alone: "
            f"{section['state_total'] / GIB:.2f} GiB -> {state_verdict}"]
    over = [s["name"] for s in meshes if not s["fits"]]
    lines += ["", f"{memory} -> " + ("fits on every mesh" if not over else
                                     f"DOES NOT FIT on the {' and '.join(over)} mesh"
                                     + ("es" if len(over) > 1 else ""))]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- command line
def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True, help="a training config file (configs/NAME.py)")
    p.add_argument("--mesh", help="data=D,fsdp=F,tensor=T (default: the config's mesh); roles "
                                  "on sub-meshes take --config.submeshes.ROLE=MESH instead")
    p.add_argument("--devices", type=int, help="chips in the slice: fills a -1 mesh axis and "
                                               "is checked against the mesh (or sub-meshes)")
    p.add_argument("--device-memory", required=True,
                   help="memory of one chip, e.g. 95GiB (v5p), 16GiB (v5e), 80GiB (H100)")
    p.add_argument("--headroom", type=float, default=0.1,
                   help="fraction of device memory kept free for XLA and fragmentation")
    p.add_argument("--compile", action="store_true",
                   help="also compile the real round (on sub-meshes: each stage) on this "
                        "machine's devices and print XLA's memory analysis beside the plan")


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Registers the `plan` subcommand on an `add_subparsers()` object."""
    p = subparsers.add_parser(
        "plan", help="per-device memory of a training config on a mesh, without loading weights",
        description=__doc__.split("\n\n")[0] + " Extra --config.KEY=VALUE arguments override "
                                               "the config.")
    _add_arguments(p)
    p.set_defaults(func=run, takes_overrides=True)
    return p


def run(args: argparse.Namespace, overrides: Sequence[str]) -> int:
    """The `plan` command: prints the plan (and XLA's analysis with --compile)."""
    from jaxrubric import plan_compile  # here: it builds on this module

    try:
        config = load_config(args.config, overrides)
        if args.mesh and any(config.submeshes.values()):
            raise PlanError("--mesh sets the mesh of colocated roles (config.mesh), but the "
                            "config places the roles on sub-meshes (config.submeshes): set "
                            "those instead, e.g. --config.submeshes.policy=fsdp=4")
        if args.mesh:
            for axis, size in parse_mesh(args.mesh).items():
                config.mesh[axis] = size
        devices = (plan_compile.local_devices_for(config, args.devices) if args.compile
                   else args.devices)
        result = plan_memory(config, parse_bytes(args.device_memory), headroom=args.headroom,
                             devices=devices)
        print(format_plan(result, args.config))
        if args.compile:
            print()
            print(plan_compile.format_comparison(result, plan_compile.compiled_memory(config))
                  if "meshes" not in result else plan_compile.format_stage_comparison(
                      result, plan_compile.compiled_stage_memory(config)))
    except (PlanError, ConfigFileError, ConfigError, CheckpointError) as err:
        print(f"jaxrubric plan: error: {err}", file=sys.stderr)
        return 2
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """`jaxrubric plan ARGS` without the rest of the command line (tests, `python -m`)."""
    parser = argparse.ArgumentParser(prog="jaxrubric plan", description=__doc__.split("\n\n")[0])
    _add_arguments(parser)
    args, extra = parser.parse_known_args(argv)
    bad = [item for item in extra if not item.startswith("--config.")]
    if bad:
        parser.error(f"unrecognized arguments: {' '.join(bad)}")
    return run(args, [item.removeprefix("--config.") for item in extra])


if __name__ == "__main__":
    sys.exit(main())
