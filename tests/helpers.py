"""What several test files share (not a test file: nothing here is collected).

- the tiny tokenizer and tiny models of the round tests;
- ONE builder of a co-evolution round for every method (`round_case`: models, setup, state,
  frozen weights and a batch on a mesh), and the pieces it is made of for tests that need only
  some of them (`build_setup`, `frozen_weights`, `device_batch`, ...);
- subprocess helpers for the tests that run processes of their own (multi-process training, mesh
  equivalence) and the comparison of two updates (`flat`, `update_error`);
- the host-side reference check of a parsed rubric (`check_against_text`).

Importing this module imports jax: in the test session conftest.py sets `XLA_FLAGS` first; a
process a test starts gets its environment from the test.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from tokenizer_fixtures import byte_level_bpe

import jaxrubric
from jaxrubric import sharding as shd
from jaxrubric.methods import get_method
from jaxrubric.methods.batches import encode_batch
from jaxrubric.methods.data import Frozen, RoundBatch, RoundState, base_weights
from jaxrubric.methods.method import Method
from jaxrubric.methods.programs import make_round_step
from jaxrubric.methods.round_config import RoundConfig
from jaxrubric.methods.setup import RoundSetup, init_state
from jaxrubric.models.transformer import Decoder
from jaxrubric.roles import ROLES, TRAINED, Role

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
TINY_TOKENIZER = CONFIGS / "assets" / "tiny_tokenizer"  # the tokenizer the tiny configs ship

# ------------------------------------------------------------------ tiny tokenizer and models
SEEDS: Mapping[Role, int] = {Role.POLICY: 1, Role.GENERATOR: 2, Role.VERIFIER: 3}
QUESTIONS = ["Sort the digits 3 1 2.", "Reverse the word cat."]
ANCHORS = [["1 2 3", "1 3 2", "3 2 1"], ["tac", "act"]]  # best first


def tiny_tokenizer():
    """The byte-level BPE of `tokenizer_fixtures` (1500 tokens, ChatML template), cached."""
    return byte_level_bpe()


def tiny_model_config(tokenizer, *, extra_vocab: int = 0, vocab_multiple: int | None = None,
                      **overrides: Any) -> jaxrubric.ModelConfig:
    """A tiny Qwen3 over `tokenizer`'s vocabulary (plus `extra_vocab` ids, as real checkpoints
    often have), its eos and pad ids; `vocab_multiple` pads the vocabulary for a tensor axis."""
    if vocab_multiple is not None:
        overrides["vocab_multiple"] = vocab_multiple
    return jaxrubric.tiny_config("qwen3", vocab_size=len(tokenizer) + extra_vocab,
                                 eos_token_ids=(tokenizer.eos_token_id,),
                                 pad_token_id=tokenizer.pad_token_id, **overrides)


def tiny_models(tokenizer, mesh=None, *, seeds: Mapping[Role, int] = SEEDS,
                config: jaxrubric.ModelConfig | None = None) -> dict[Role, Decoder]:
    """Policy, generator and verifier: the tiny model with each role's seed, sharded on
    `mesh` when one is given."""
    cfg = config or tiny_model_config(tokenizer)
    models = {role: jaxrubric.init_model(cfg, seed=seeds[role]) for role in ROLES}
    if mesh is not None:
        models = {role: shd.shard_model(model, mesh) for role, model in models.items()}
    return models


def abstract_models(cfg: jaxrubric.ModelConfig) -> dict[Role, Decoder]:
    """A model with parameter shapes but no weights, in every role: enough to compile it or to
    build a setup (a setup takes only the models' graphs and configs)."""
    model = nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0)))
    return dict.fromkeys(ROLES, model)


def params_copy(model: Decoder) -> nnx.State:
    """A copy of a model's parameters (a frozen weight or a KL reference)."""
    return jax.tree.map(jnp.copy, nnx.state(model, nnx.Param))


# ------------------------------------------------------------------ rounds
def optimizers(lr: float = 1e-3) -> dict[Role, optax.GradientTransformation]:
    """Adam without weight decay for both trained roles: it moves only on gradients."""
    return {role: optax.adam(lr) for role in TRAINED}


def build_setup(method: str | Method, config: RoundConfig, tokenizer,
                models: Mapping[Role, Decoder], *, max_items: int = 3, max_item_tokens: int = 6,
                oracle_reward: Callable[..., jax.Array] | None = None,
                lr: float = 1e-3) -> RoundSetup:
    """`method`'s setup (a name of the registry or a `Method`) over the shared tokenizer."""
    method = get_method(method) if isinstance(method, str) else method
    return method.build_setup(config, tokenizer, models, optimizers=optimizers(lr),
                              max_items=max_items, max_item_tokens=max_item_tokens,
                              oracle_reward=oracle_reward)


def frozen_weights(models: Mapping[Role, Decoder]) -> Frozen:
    """The verifier and both trained roles' KL references: copies of the models' weights (a
    LoRA role's reference is its base, held instead)."""
    def reference(role: Role) -> nnx.State | None:
        return None if models[role].config.lora is not None else params_copy(models[role])
    return Frozen(verifier=params_copy(models[Role.VERIFIER]),
                  policy_ref=reference(Role.POLICY), generator_ref=reference(Role.GENERATOR),
                  policy_base=base_weights(models[Role.POLICY]),
                  generator_base=base_weights(models[Role.GENERATOR]))


def device_batch(host: RoundBatch, mesh) -> RoundBatch:
    """`methods.batches.encode_batch`'s NumPy arrays, rows split over `mesh`'s batch axes."""
    return jax.tree.map(lambda v: jax.device_put(v, shd.batch_sharding(mesh, v.ndim)), host)


def encode(tokenizer, questions: Sequence[str], anchors: Sequence[Sequence[str]], mesh, *,
           prompt_tokens: int = 16, policy_tokens: int = 32, anchor_tokens: int = 8,
           num_anchors: int | None = None) -> RoundBatch:
    """The round's batch of these questions and best-first anchor answers, on `mesh`
    (`num_anchors` defaults to the longest anchor list)."""
    host = encode_batch(
        tokenizer, list(questions), [list(a) for a in anchors], prompt_tokens=prompt_tokens,
        policy_tokens=policy_tokens, anchor_tokens=anchor_tokens,
        num_anchors=num_anchors or max(len(a) for a in anchors))
    return device_batch(host, mesh)


class RoundCase(NamedTuple):
    """Everything one round of a method needs, on one mesh."""

    method: Method
    tokenizer: Any
    models: dict[Role, Decoder]
    setup: RoundSetup
    state: RoundState
    frozen: Frozen
    batch: RoundBatch

    def round_step(self):
        """The jitted round (`methods.programs.make_round_step`), state donated."""
        return make_round_step(self.setup, self.frozen, self.method.round)


def round_case(method: str | Method, config: RoundConfig, mesh, *, tokenizer=None,
               models: Mapping[Role, Decoder] | None = None,
               questions: Sequence[str] = QUESTIONS,
               anchors: Sequence[Sequence[str]] = ANCHORS, max_items: int = 3,
               max_item_tokens: int = 6,
               oracle_reward: Callable[..., jax.Array] | None = None,
               **encode_kwargs: Any) -> RoundCase:
    """THE round builder of the tests, for either method: tiny models on `mesh` (or `models`),
    `method`'s setup, the initial state, frozen weights with both KL references and the batch
    of `questions` / `anchors` on `mesh` (`encode_kwargs` as `encode`)."""
    method = get_method(method) if isinstance(method, str) else method
    tokenizer = tokenizer or tiny_tokenizer()
    models = dict(models) if models is not None else tiny_models(tokenizer, mesh)
    setup = build_setup(method, config, tokenizer, models, max_items=max_items,
                        max_item_tokens=max_item_tokens, oracle_reward=oracle_reward)
    return RoundCase(method, tokenizer, models, setup, init_state(setup, models),
                     frozen_weights(models),
                     encode(tokenizer, questions, anchors, mesh, **encode_kwargs))


def trained_params(state: RoundState) -> dict[Role, Any]:
    """Host copies of both trained roles' parameters."""
    return {role: jax.tree.map(np.asarray, state.role(role).params) for role in TRAINED}


def changed_roles(before: Mapping[Role, Any], state: RoundState) -> set[Role]:
    """The trained roles any of whose parameters differ from `before` (`trained_params`)."""
    changed = set()
    for role in TRAINED:
        moved = jax.tree.map(lambda a, b: not np.allclose(a, np.asarray(b)), before[role],
                             state.role(role).params)
        if any(jax.tree.leaves(moved)):
            changed.add(role)
    return changed


# ---------------------------------------------------------------------------- training runs
def stopped_after(run: Path, copy: Path, round_: int) -> Path:
    """`copy`: the finished training run `run` as a run stopped after `round_` leaves its
    workdir, the later checkpoints gone (their logs stay, as a run killed before its next
    checkpoint is written leaves them). A resume test trains once fewer so (each `train`
    compiles its round again) than by stopping a run for real."""
    shutil.copytree(run, copy)
    later = [step for step in (copy / "checkpoints").iterdir()
             if step.name.isdigit() and int(step.name) > round_]
    assert later, f"{run} has no checkpoint after round {round_}"
    for step in later:
        shutil.rmtree(step)
    return copy


# ------------------------------------------------------------------ processes and updates
def start_processes(commands: list[list[str]], env: dict[str, str], logs: Path
                    ) -> list[subprocess.Popen]:
    """Starts every command at once (in the repository root, with the repository importable),
    output to `logs/process<i>.log`. A script in tests/ imports this module as its own
    directory is on its path."""
    env = {**env, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))}
    processes = []
    for i, command in enumerate(commands):
        with open(logs / f"process{i}.log", "w") as log:
            processes.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                              env=env, cwd=ROOT))
    return processes


def wait_processes(processes: list[subprocess.Popen], logs: Path, timeout_s: float) -> None:
    """Waits for every process until `timeout_s` after the call; on a failure or the deadline
    kills the rest and fails with the tail of every process's log."""
    deadline = time.monotonic() + timeout_s
    try:
        for process in processes:
            process.wait(timeout=max(deadline - time.monotonic(), 1))
    except subprocess.TimeoutExpired:
        pass
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    if any(p.returncode != 0 for p in processes):
        tails = "\n".join(
            f"--- process {i} (exit {p.returncode}):\n"
            + "\n".join((logs / f"process{i}.log").read_text().splitlines()[-40:])
            for i, p in enumerate(processes))
        pytest.fail(f"a process failed or ran out of its {timeout_s:.0f} s:\n{tails}")


def flat(tree) -> np.ndarray:
    """Every leaf of a parameter tree, raveled into one float64 vector."""
    return np.concatenate([np.ravel(np.asarray(x, np.float64)) for x in jax.tree.leaves(tree)])


def named_leaves(tree) -> dict[str, np.ndarray]:
    """Every leaf of a pytree (a round's outputs: arrays and nested NamedTuples) by its path."""
    return {jax.tree_util.keystr(path): np.asarray(leaf)
            for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def update_error(final: np.ndarray, reference: np.ndarray, initial: np.ndarray) -> float:
    """How far an update (final minus initial parameters) is from the reference update,
    relative to the reference's size. Not element by element: Adam's step g / (|g| + eps) is
    ill-conditioned where a gradient cancels to rounding level, and there one element may step
    up to lr differently without anything being wrong."""
    expected = reference - initial
    assert np.linalg.norm(expected) > 0, "the reference did not move"
    return float(np.linalg.norm(final - reference) / np.linalg.norm(expected))


# ------------------------------------------------------------------ rubrics
LINE = re.compile(r"\[(-?[0-9]+)\] (.+)")
STRUCTURE_CHARS = set("[]-0123456789 \n")


def check_against_text(tok, grammar, ids: np.ndarray, parsed) -> None:
    """Host reference: decode, parse lines with a regex, compare with the token-level parse
    (`grammar.parse_rubric_tokens` of one rubric)."""
    ids = [int(i) for i in ids]
    end = ids.index(grammar.end_token_id)
    text = tok.decode(ids[:end], skip_special_tokens=False)
    assert text.endswith("\n"), text
    lines = [LINE.fullmatch(line) for line in text[:-1].split("\n")]
    assert all(lines), text
    assert 1 <= len(lines) <= grammar.max_items
    n = len(lines)
    assert bool(parsed.complete)
    assert parsed.valid.tolist() == [True] * n + [False] * (grammar.max_items - n)
    assert parsed.weights[:n].tolist() == [int(line[1]) for line in lines]
    assert all(int(line[1]) in grammar.weights for line in lines)
    token_item = np.asarray(parsed.token_item)
    for j, line in enumerate(lines):
        criterion = line[2]
        assert criterion[0] not in " \t\x0b\x0c\r", text
        length = int(parsed.item_lengths[j])
        assert 1 <= length <= grammar.max_item_tokens
        item = [int(i) for i in parsed.items[j, :length]]
        assert item == [ids[k] for k in np.flatnonzero(token_item == j)]
        decoded = tok.decode(item, skip_special_tokens=False)
        assert decoded.strip() == criterion.strip()
        assert re.fullmatch(" ?" + re.escape(criterion) + "\n?", decoded), (decoded, criterion)
        first = tok.decode(item[:1]).removeprefix(" ")
        assert first and first[0] not in " \t\n\x0b\x0c\r", "an item starts at its first text byte"
        assert tok.decode(item[-1:]) != "\n", "a lone newline is structure"
    for k in np.flatnonzero(token_item[:end] < 0):
        assert set(tok.decode([ids[k]])) <= STRUCTURE_CHARS, tok.convert_ids_to_tokens(ids[k])
    assert (token_item[end:] == -1).all()


# ------------------------------------------------------------------------ host-loop tasks
class WalkTask:
    """A state of random-looking floats (so its data files do not compress to nothing) that
    each round changes deterministically: a resumed run must end where an uninterrupted one
    does."""

    def init_state(self, rng):
        return {"w": jax.random.normal(jax.random.key(0), (4096,)),
                "round": jnp.zeros((), jnp.int32)}

    def abstract_state(self):
        return jax.eval_shape(lambda: self.init_state(None))

    def round_step(self, state, batch, rng):
        return ({"w": state["w"] * 0.9 + jax.random.normal(rng, (4096,)),
                 "round": state["round"] + 1}, {"loss": 0.0})

    def batch(self, position):
        return jnp.zeros(())
