"""What is static about a round (`RoundSetup`: graph definitions, token templates, the grammar,
optimisers), built once on the host from the shared tokenizer and the three models, and the
trainable state it starts from (`init_state`). Policy, generator and verifier share one
tokenizer: responses are spliced into the generator's and the verifier's prompts as token ids."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from jaxrubric.methods.data import RoleState, RoundState, trainable
from jaxrubric.methods.round_config import RoleConfig, RoundConfig
from jaxrubric.models.transformer import Decoder
from jaxrubric.roles import TRAINED, Role
from jaxrubric.rubric import grammar as grammar_lib
from jaxrubric.rubric import templates as tpl
from jaxrubric.rubric import verifier as ver


@dataclasses.dataclass(frozen=True, eq=False)
class RoleSpec:
    """What a round knows of a role: its graph definition and, when trained, its optimiser,
    its settings (`RoleConfig`) and whether its update is left out of the round
    (`compiled_out`)."""

    graph: Any
    optimizer: optax.GradientTransformation | None = None
    settings: RoleConfig | None = None
    compiled_out: bool = True


@dataclasses.dataclass(frozen=True, eq=False)
class RoundSetup:
    """Everything static about a round: built once on the host from the tokenizer."""

    config: RoundConfig
    graphs: Mapping[Role, Any]  # every role's graph definition
    optimizers: Mapping[Role, optax.GradientTransformation]  # the trained roles'
    generator_template: tpl.TokenTemplate
    verifier_template: tpl.TokenTemplate
    readout: ver.VerifierReadout
    grammar: grammar_lib.RubricGrammar
    stop_token_ids: tuple[int, ...]
    pad_id: int
    # GenRubric: the prompt under which the policy answers while shown a rubric.
    induced_template: tpl.TokenTemplate | None = None
    # `oracle_reward(response_tokens [B, K, L], response_len [B, K], question) -> [B, K]`: the
    # ground-truth reward of `policy_reward="oracle"` (a toy world provides one); jittable.
    oracle_reward: Callable[..., jax.Array] | None = None

    @property
    def roles(self) -> dict[Role, RoleSpec]:
        """Each role's spec, its settings and frozen flag read from `config` (so a setup with
        another config, `dataclasses.replace(setup, config=...)`, is consistent)."""
        return {role: RoleSpec(self.graphs[role], self.optimizers.get(role),
                               self.config.roles.get(role), self.config.compiled_out(role))
                for role in Role}

    def graph(self, role: Role) -> Any:
        return self.graphs[role]


Models = Mapping[Role, Decoder]
Optimizers = Mapping[Role, optax.GradientTransformation]


def setup_fields(config: RoundConfig, tokenizer: Any, models: Models, optimizers: Optimizers,
                 chat_template_kwargs: Mapping[str, Any] | None = None,
                 template_style: str = "full") -> dict[str, Any]:
    """What every method's setup takes from the shared tokenizer and the three models."""
    sizes = [models[r].config.vocab_size for r in Role]
    if len(set(sizes)) != 1 or sizes[0] < len(tokenizer):
        raise ValueError(f"policy, generator and verifier must share the tokenizer's vocabulary "
                         f"({len(tokenizer)} tokens); their vocab sizes are {sizes}")
    kwargs = dict(chat_template_kwargs) if chat_template_kwargs else None
    verifier_template = tpl.verifier_template(tokenizer, kwargs, template_style)
    stops = set(models[Role.POLICY].config.eos_token_ids)
    if tokenizer.eos_token_id is not None:
        stops.add(tokenizer.eos_token_id)
    return dict(
        config=config, graphs={role: nnx.graphdef(models[role]) for role in Role},
        optimizers={role: optimizers[role] for role in TRAINED},
        verifier_template=verifier_template,
        readout=ver.verifier_readout(tokenizer, verifier_template),
        stop_token_ids=tuple(sorted(stops)),
        pad_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0,
    )


def init_state(setup: RoundSetup, models: Models) -> RoundState:
    """The trainable state: both trained models' parameters and optimiser states (None for a
    role whose update the round leaves out: it never steps), round 0."""
    # Scalars (optimiser counts, the round counter) go on their role's mesh, replicated, so the
    # state that comes out of a round has the shardings of the one that went in: no recompiles.
    roles = {}
    replicated = {}
    for role in TRAINED:
        params = nnx.state(models[role], trainable(models[role]))
        replicated[role] = NamedSharding(jax.tree.leaves(params)[0].sharding.mesh,
                                         PartitionSpec())
        opt_state = None if setup.roles[role].compiled_out else jax.tree.map(
            lambda x, r=replicated[role]: x if isinstance(x.sharding, NamedSharding)
            else jax.device_put(x, r), setup.roles[role].optimizer.init(params))
        roles[role] = RoleState(params, opt_state)
    return RoundState(roles[Role.POLICY], roles[Role.GENERATOR],
                      jax.device_put(jnp.zeros((), jnp.int32), replicated[Role.POLICY]))

