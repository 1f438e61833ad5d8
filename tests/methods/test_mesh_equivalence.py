"""The DynamicRubric round is a function of the models, the batch and the key, not of the mesh:
pure data parallelism, data x FSDP and FSDP x tensor parallelism (vocabulary padded to the
tensor axis) sample the same tokens and make the same updates.

The meshes run in two processes started by the test (`python tests/methods/test_mesh_equivalence.py
OUT_DIR MESH...`): two compilations at a time use both cores of a small CI machine while holding
two processes' memory (~2.3 GB each), and a process can be given the XLA thread pool the
tensor-parallel round needs (see `xla_flags.THREADS`).
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from helpers import (SEEDS, flat, round_case, start_processes, tiny_model_config, tiny_tokenizer,
                     update_error, wait_processes)
from xla_flags import THREADS, with_devices

import jaxrubric
from jaxrubric import sharding as shd
from jaxrubric.methods import DYNAMIC_RUBRIC
from jaxrubric.methods.dynamic_rubric import DynamicRubricConfig
from jaxrubric.methods.round_config import RoleConfig
from jaxrubric.roles import ROLES, Role

MESHES = {"data": (8, 1, 1), "data_fsdp": (2, 4, 1), "fsdp_tensor": (1, 2, 4)}
PROCESSES = (("data",), ("data_fsdp", "fsdp_tensor"))  # meshes of each process, in order
# Soft verdicts and advantages without the std keep the update well conditioned (see
# tests/multihost/test_multihost.py, OVERRIDES).
ROUND = DynamicRubricConfig(num_responses=4, num_rubrics=2, response_tokens=8, logprob_chunk=8,
                            soft_verdicts=True, policy=RoleConfig(advantage_mode="no_std"),
                            generator=RoleConfig(advantage_mode="no_std"))
# Relative to each update's size; measured 6e-5 (policy) and 4e-4 (generator: rewards only
# ~300 ulp apart, see tests/multihost/test_multihost.py, UPDATE_RTOL).
UPDATE_RTOL = {Role.POLICY: 1e-3, Role.GENERATOR: 1e-2}
COMPARED_METRICS = ("policy/reward", "policy/reward_std_in_group", "policy/grad_norm",
                    "generator/reward", "generator/grad_norm", "verifier/yes_rate",
                    "rubric/items", "rubric/tokens", "rubric/valid_rate")
SAMPLED = ("responses", "response_len", "rubrics", "rubric_len")
TIMEOUT_S = 900


def _batch_rows() -> tuple[list[str], list[list[str]]]:
    """8 prompts (a multiple of every mesh's data x fsdp) with best-first anchor answers."""
    digits = ["3 1 2", "9 4 7", "5 8 6", "2 0 1"]
    words = ["cat", "sun", "pod", "map"]
    questions = ([f"Sort the digits {d}." for d in digits]
                 + [f"Reverse the word {w}." for w in words])
    anchors = ([[" ".join(sorted(d.split())), d, " ".join(sorted(d.split(), reverse=True))]
                for d in digits] + [[w[::-1], w, w[1:]] for w in words])
    return questions, anchors


def _model_config(mesh=None) -> jaxrubric.ModelConfig:
    # One id more than the tokenizer (as real checkpoints often have): 1501 is padded to 1504
    # on the 4-way tensor axis.
    return tiny_model_config(tiny_tokenizer(), extra_vocab=1,
                             vocab_multiple=shd.vocab_multiple(mesh))


@functools.cache
def _logical_params(seed: int) -> dict:
    """Unpadded initial parameters: a model's random init depends on its padded shape (the
    `lm_head` draw is [embed, padded vocab]), so every mesh starts from these."""
    model = jaxrubric.init_model(_model_config(), seed)
    return jax.device_get(nnx.to_pure_dict(nnx.state(model, nnx.Param)))


def _model(seed: int, mesh) -> jaxrubric.Decoder:
    """The logical parameters, zero-padded to the mesh's vocabulary multiple and sharded."""
    model = jaxrubric.init_model(_model_config(mesh), seed)
    state = nnx.state(model, nnx.Param)
    padded = jax.tree.map(
        lambda x, v: jnp.pad(x, [(0, n - d) for n, d in zip(v.shape, x.shape)]),
        _logical_params(seed), nnx.to_pure_dict(state))
    nnx.replace_by_pure_dict(state, padded)
    nnx.update(model, state)
    return shd.shard_model(model, mesh)


def _logical(params, reference) -> dict:
    """Host copies with the vocabulary padding sliced off, after checking it stayed zero."""
    def unpad(x, ref):
        x = np.array(x)
        logical = tuple(slice(0, d) for d in ref.shape)
        core = x[logical].copy()
        x[logical] = 0
        assert not x.any(), "the vocabulary padding moved"
        return core
    return jax.tree.map(unpad, nnx.to_pure_dict(params), reference)


def _round(shape: tuple[int, int, int]) -> dict[str, np.ndarray]:
    """One round on a mesh of `shape`, always with the same models, batch and key: flat
    logical parameters before and after, the sampled outputs and the metrics."""
    mesh = shd.make_mesh(shape)
    questions, anchors = _batch_rows()
    case = round_case(DYNAMIC_RUBRIC, ROUND, mesh,
                      models={role: _model(SEEDS[role], mesh) for role in ROLES},
                      questions=questions, anchors=anchors, max_items=2, max_item_tokens=6,
                      prompt_tokens=16, policy_tokens=32, anchor_tokens=8, num_anchors=3)
    state, out = case.round_step()(case.state, case.batch, jax.random.key(7))
    out = jax.device_get(out)
    outputs = out.outputs._asdict()
    result = {f"out/{k}": np.asarray(outputs[k]) for k in (*SAMPLED, "scores")}
    result |= {f"metric/{k}": np.asarray(out.scalars[k]) for k in COMPARED_METRICS}
    for role in UPDATE_RTOL:
        initial = _logical_params(SEEDS[role])
        result[f"initial/{role}"] = flat(initial)
        result[f"final/{role}"] = flat(_logical(state.role(role).params, initial))
    return result


@pytest.mark.slow
def test_round_is_the_same_on_every_mesh(tmp_path):
    tests = str(Path(__file__).resolve().parents[1])  # helpers.py and xla_flags.py
    env = {**os.environ, "XLA_FLAGS": with_devices(8), "JAX_PLATFORMS": "cpu", "NPROC": THREADS,
           "PYTHONPATH": os.pathsep.join(filter(None, [tests, os.environ.get("PYTHONPATH")]))}
    processes = start_processes(
        [[sys.executable, __file__, str(tmp_path), *names] for names in PROCESSES], env, tmp_path)
    wait_processes(processes, tmp_path, TIMEOUT_S)
    results = {name: dict(np.load(tmp_path / f"{name}.npz")) for name in MESHES}
    reference = results.pop("data")
    for name, result in results.items():
        # The same key draws the same tokens whatever the sharding and the vocabulary padding:
        # equal, not just close.
        for key in SAMPLED:
            np.testing.assert_array_equal(result[f"out/{key}"], reference[f"out/{key}"],
                                          err_msg=f"{name}: {key}")
        np.testing.assert_allclose(result["out/scores"], reference["out/scores"], rtol=1e-5,
                                   atol=1e-6, err_msg=name)
        for metric in COMPARED_METRICS:
            assert result[f"metric/{metric}"] == pytest.approx(
                reference[f"metric/{metric}"], rel=1e-3, abs=1e-7), f"{name}: {metric}"
        for role, rtol in UPDATE_RTOL.items():
            np.testing.assert_array_equal(result[f"initial/{role}"], reference[f"initial/{role}"])
            error = update_error(result[f"final/{role}"], reference[f"final/{role}"],
                                 reference[f"initial/{role}"])
            assert error < rtol, f"{name}: the {role} updates differ by {error:.3g} of their size"


def _main(out_dir: str, *mesh_names: str) -> None:
    """The body of a process: the round on each named mesh, saved as OUT_DIR/MESH.npz."""
    jax.config.update("jax_default_matmul_precision", "highest")  # as tests/conftest.py
    for name in mesh_names:
        np.savez(Path(out_dir) / f"{name}.npz", **_round(MESHES[name]))


if __name__ == "__main__":
    _main(*sys.argv[1:])
