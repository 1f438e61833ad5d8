"""The round's inputs without any weights: abstract state, frozen weights, batch and rng key
with the shardings training gives them, on any devices (this machine's, or a TPU slice that
does not exist, `plan.topology`), so that `plan.compile` lowers the real round for them.

What `train.CoevolveTask` builds, built from shapes: each role's `Decoder` by `nnx.eval_shape`
(the model config `plan.models.role_model_config` gives, as `train.role_model` loads it),
its parameters placed by the sharding rules, the optimiser state `optax` would make for them,
the references in the dtype `train.reference_params` keeps, the batch as `encode_batch` lays
it out. The setup (templates, grammar, readout) needs a tokenizer: the recipe's own when it
can be read offline; else a stand-in, the tiny tokenizer the repository ships, whose
templates are replaced by the plan's estimates (`plan.templates`), so that the compiled shapes
are the ones the plan counts. Token ids are then placeholders: only shapes reach the compiler.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxrubric import placement
from jaxrubric import sharding as shd
from jaxrubric.config import role_lora, round_config
from jaxrubric.methods import get_method
from jaxrubric.methods.batches import batch_shapes
from jaxrubric.methods.data import Frozen, RoleState, RoundBatch, RoundState
from jaxrubric.methods.method import Method
from jaxrubric.methods.setup import RoundSetup
from jaxrubric.models.config import LoraConfig, ModelConfig
from jaxrubric.models.hf import load_tokenizer
from jaxrubric.models.transformer import Decoder
from jaxrubric.plan.errors import PlanError
from jaxrubric.plan.models import load_tokenizer_offline, role_model_config, tokenizer_source
from jaxrubric.plan.templates import round_templates
from jaxrubric.roles import ROLES, TRAINED, Role
from jaxrubric.rubric import verifier as ver
from jaxrubric.train import make_optimizer

# The tiny tokenizer the tiny configs use (configs/assets/README.md), a stand-in for a recipe's
# tokenizer that cannot be read offline.
STANDIN_TOKENIZER = Path(__file__).resolve().parents[2] / "configs" / "assets" / "tiny_tokenizer"


class AbstractRound(NamedTuple):
    """Everything `programs.round_program` (or a stage program) is lowered with."""

    method: Method
    setup: RoundSetup
    meshes: dict[Role, Mesh]
    state: RoundState
    frozen: Frozen
    batch: RoundBatch
    rng: jax.ShapeDtypeStruct
    configs: dict[Role, ModelConfig]  # each role's model config (a setup holds graphs only)
    tokenizer_note: str  # empty when the recipe's own tokenizer built the setup


def _sds(shape: Sequence[int], dtype: Any, sharding: NamedSharding) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(tuple(shape), jnp.dtype(dtype), sharding=sharding)


def role_meshes_on(config: ml_collections.ConfigDict, devices: Sequence[jax.Device]
                   ) -> dict[Role, Mesh]:
    """The meshes `train.CoevolveTask` builds, over `devices` instead of `jax.devices()`."""
    try:
        if any(config.submeshes.values()):
            return placement.make_submeshes(dict(config.submeshes), devices)
        return dict.fromkeys(ROLES, shd.make_mesh(dict(config.mesh), devices))
    except ValueError as err:
        raise PlanError(str(err)) from err


def abstract_model(role: ml_collections.ConfigDict, tokenizer: Any, mesh: Mesh, source: str,
                   lora: LoraConfig | None = None
                   ) -> tuple[Decoder, nnx.State, nnx.State | None]:
    """A role's `Decoder` as shapes (`nnx.eval_shape`), its trained parameters as
    `ShapeDtypeStruct`s placed by the training rules (`sharding.state_shardings`), and with
    `lora` its frozen base in the compute dtype (`methods.data.base_weights`), else None."""
    model_config, _ = role_model_config(role, tokenizer, mesh, source, lora)
    model = nnx.eval_shape(lambda: Decoder(model_config, rngs=nnx.Rngs(0)))

    def placed(variables: Any, dtype: Any = None) -> nnx.State:
        state = nnx.state(model, variables)
        return jax.tree.map(lambda v, s: _sds(v.shape, dtype or v.dtype, s), state,
                            shd.state_shardings(state, mesh))

    if lora is None:
        return model, placed(nnx.Param), None
    return (model, placed(nnx.LoRAParam),
            placed(nnx.All(nnx.Param, nnx.Not(nnx.LoRAParam)), model_config.dtype))


def optimizer_state(optimizer: Any, params: nnx.State, mesh: Mesh) -> Any:
    """The optimiser state `methods.setup.init_state` makes for `params`, as shapes: AdamW's moments
    (trees like the parameters') take their parameters' shardings, the counts are replicated
    on the role's mesh."""
    tree = jax.tree.structure(params)
    replicated = NamedSharding(mesh, PartitionSpec())

    def place(x: Any) -> Any:
        if jax.tree.structure(x) == tree:
            return jax.tree.map(lambda a, p: _sds(a.shape, a.dtype, p.sharding), x, params)
        return _sds(x.shape, x.dtype, replicated)

    return jax.tree.map(place, jax.eval_shape(optimizer.init, params),
                        is_leaf=lambda x: jax.tree.structure(x) == tree)


def reference(params: nnx.State, compute_dtype: Any) -> nnx.State:
    """`train.reference_params` as shapes: the compute dtype when it is narrower."""
    compute = jnp.dtype(compute_dtype)
    return jax.tree.map(lambda x: _sds(x.shape, compute if compute.itemsize < x.dtype.itemsize
                                       else x.dtype, x.sharding), params)


def abstract_batch(config: ml_collections.ConfigDict, tokenizer: Any, mesh: Mesh
                   ) -> RoundBatch:
    """`CoevolveTask.batch`'s arrays as shapes: `encode_batch`'s layout (read from an empty
    batch) at the config's batch size, split over the mesh's batch axes."""
    return jax.tree.map(lambda x: _sds(x.shape, x.dtype, shd.batch_sharding(mesh, x.ndim)),
                        batch_shapes(tokenizer, config.data))


def _tokenizer(config: ml_collections.ConfigDict) -> tuple[Any, str]:
    """The recipe's tokenizer read offline, else the stand-in and a note saying so."""
    source = tokenizer_source(config)
    tokenizer = load_tokenizer_offline(source)
    if tokenizer is not None:
        return tokenizer, ""
    if not STANDIN_TOKENIZER.is_dir():
        raise PlanError(f"tokenizer {source!r} is not available offline and the stand-in "
                        f"{STANDIN_TOKENIZER} is missing: pass --config.tokenizer=FOLDER")
    return load_tokenizer(STANDIN_TOKENIZER), (
        f"tokenizer {source!r} is not available offline: templates of the estimated lengths "
        "(placeholder ids), grammar and verifier answer ids from the repository's tiny "
        "tokenizer; only shapes reach the compiler")


def abstract_round(config: ml_collections.ConfigDict, devices: Sequence[jax.Device],
                   oracle_reward: Callable[..., jax.Array] | None = None) -> AbstractRound:
    """The round of `config` on `devices`, as `train.CoevolveTask` would build it, in shapes;
    a config that names an oracle needs its reward function (`oracle_reward`)."""
    if config.oracle and oracle_reward is None:
        raise PlanError(f"config.oracle={config.oracle!r} needs its reward function: compile "
                        "a config without an oracle")
    method = get_method(config.method)
    meshes = role_meshes_on(config, devices)
    tokenizer, note = _tokenizer(config)
    source = tokenizer_source(config)
    models, params, bases = {}, {}, {}
    for role in ROLES:
        lora = role_lora(config, role) if role in TRAINED else None
        models[role], params[role], bases[role] = abstract_model(config[role], tokenizer,
                                                                 meshes[role], source, lora)
    rc = round_config(config)
    setup = method.build_setup(
        rc, tokenizer, models, optimizers={r: make_optimizer(config, r) for r in TRAINED},
        max_items=config.rubric.max_items, max_item_tokens=config.rubric.max_item_tokens,
        chat_template_kwargs=dict(config.chat_template_kwargs) or None,
        template_style=config.rubric.template_style, oracle_reward=oracle_reward)
    if note:
        estimated = round_templates(config, method, None)
        setup = dataclasses.replace(
            setup, generator_template=estimated["generator"],
            verifier_template=estimated["verifier"],
            readout=ver.verifier_readout(tokenizer, estimated["verifier"]),
            induced_template=estimated.get("induced", setup.induced_template))
    roles = {r: RoleState(params[r], optimizer_state(setup.roles[r].optimizer, params[r],
                                                          meshes[r])) for r in TRAINED}
    policy_mesh = meshes[Role.POLICY]
    replicated = NamedSharding(policy_mesh, PartitionSpec())
    state = RoundState(roles[Role.POLICY], roles[Role.GENERATOR],
                            _sds((), jnp.int32, replicated))
    refs = {r: reference(params[r], config[r].dtype)
            if rc.needs_reference(r) and bases[r] is None else None for r in TRAINED}
    frozen = Frozen(verifier=params[Role.VERIFIER], policy_ref=refs[Role.POLICY],
                         generator_ref=refs[Role.GENERATOR], policy_base=bases[Role.POLICY],
                         generator_base=bases[Role.GENERATOR],
                         generator_explorer=reference(params[Role.GENERATOR],
                                                      config.generator.dtype)
                         if config.generator.explorer else None)
    rng = jax.ShapeDtypeStruct((), jax.random.key(0).dtype, sharding=replicated)
    return AbstractRound(method, setup, meshes, state, frozen,
                         abstract_batch(config, tokenizer, policy_mesh), rng,
                         {r: m.config for r, m in models.items()}, note)
