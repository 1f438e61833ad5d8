"""`jaxrubric train` and `jaxrubric export`: a config -> models, data and the co-evolution round,
run by the generic host loop (`train_loop.run_training`)."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import jax
import ml_collections
from etils import epath
import numpy as np
import optax
from flax import nnx

import jaxrubric
from jaxrubric import coevolve, flops, placement
from jaxrubric import sharding as shd
from jaxrubric.config import load_config, round_config
from jaxrubric.data import load_anchors, prompt_text
from jaxrubric.genrubric_round import build_genrubric_setup, genrubric_round
from jaxrubric.models.transformer import Decoder
from jaxrubric.toy import digits_task as toy_digits
from jaxrubric.train_loop import restore_checkpoint, run_training

_CONFIG_FILE = "config.json"


def _optimizer(lr: float, config: ml_collections.ConfigDict) -> optax.GradientTransformation:
    return optax.chain(
        optax.clip_by_global_norm(config.optim.max_grad_norm),
        optax.adamw(lr, b1=config.optim.b1, b2=config.optim.b2,
                    weight_decay=config.optim.weight_decay),
    )


def _role_model(role: ml_collections.ConfigDict, vocab_size: int, tokenizer: Any,
                mesh) -> Decoder:
    """An HF checkpoint from `role.path`, or (empty path) a tiny random Qwen3 over the vocab."""
    if role.path:
        return jaxrubric.load_pretrained(role.path, dtype=role.dtype, param_dtype=role.param_dtype,
                                         mesh=mesh, remat=role.remat,
                                         attention_chunk=role.attention_chunk)
    cfg = jaxrubric.tiny_config(
        "qwen3", vocab_size=vocab_size, eos_token_ids=(tokenizer.eos_token_id,),
        pad_token_id=tokenizer.pad_token_id, dtype=role.dtype, param_dtype=role.param_dtype,
        remat=role.remat, attention_chunk=role.attention_chunk,
        vocab_multiple=shd.vocab_multiple(mesh))
    return shd.shard_model(jaxrubric.init_model(cfg, seed=role.seed), mesh)


def reference_params(model: Decoder) -> nnx.State:
    """A frozen copy of `model`'s parameters for the KL term, in its compute dtype.

    The forward casts every weight to the compute dtype before using it, so a reference stored
    in that dtype gives the same log-probs bit for bit; with fp32 master weights and bf16
    compute (the 8B recipes) it takes half the memory.
    """
    compute = jax.numpy.dtype(model.config.dtype)
    return jax.tree.map(
        lambda x: x.astype(compute) if compute.itemsize < x.dtype.itemsize else x.copy(),
        nnx.state(model, nnx.Param))


# config.method -> (setup builder, round function)
_METHODS = {
    "dynamic_rubric": (coevolve.build_setup, coevolve.dynamic_rubric_round),
    "genrubric": (build_genrubric_setup, genrubric_round),
}

# config.oracle -> a jittable ground-truth reward (see `coevolve.RoundSetup.oracle_reward`)
ORACLES = {"toy_digits": toy_digits.oracle_reward}


class CoevolveTask:
    """The `train_loop.Task` of co-evolution by either method (`config.method`). GenRubric
    ignores the anchor answers of its data rows."""

    def __init__(self, config: ml_collections.ConfigDict):
        self.config = config
        if any(config.submeshes.values()):
            self.meshes = placement.make_submeshes(dict(config.submeshes))
        else:
            self.meshes = dict.fromkeys(placement.ROLES, shd.make_mesh(dict(config.mesh)))
        self.colocated = len({id(m) for m in self.meshes.values()}) == 1
        # Batches are placed on the policy's mesh; a stage on another mesh moves what it reads.
        self.mesh = self.meshes["policy"]
        for role, mesh in self.meshes.items():
            ways = shd.batch_ways(mesh)
            for key in ("batch_size", "eval_batch_size") if config.data.eval else ("batch_size",):
                size = config.data[key] or config.data.batch_size
                if size % ways:
                    raise ValueError(
                        f"config.data.{key}={size} must be a multiple of the {ways} ways the "
                        f"{role}'s mesh {dict(mesh.shape)} splits the batch")
        tokenizer_path = config.tokenizer or config.policy.path
        self.tokenizer = jaxrubric.load_tokenizer(tokenizer_path)
        loaded = load_anchors(config.data.train, skip_bad_rows=config.data.skip_bad_rows)
        if not loaded.records:
            raise ValueError(f"{config.data.train}: no usable rows")
        self.records = loaded.records
        self.skipped_rows = len(loaded.problems)
        self.eval_records = []
        if config.data.eval:
            size = config.data.eval_batch_size or config.data.batch_size
            self.eval_records = load_anchors(config.data.eval, skip_bad_rows=False).records
            if len(self.eval_records) < size:
                raise ValueError(f"{config.data.eval}: {len(self.eval_records)} rows, the "
                                 f"held-out batch needs {size}")
            self.eval_records = self.eval_records[:size]
        if config.oracle and config.oracle not in ORACLES:
            raise ValueError(f"config.oracle {config.oracle!r} is not one of {sorted(ORACLES)}")
        models = {role: _role_model(config[role], len(self.tokenizer), self.tokenizer,
                                    self.meshes[role]) for role in placement.ROLES}
        rc = round_config(config)
        build, round_fn = _METHODS[config.method]
        oracle = {"oracle_reward": ORACLES[config.oracle]} if config.oracle else {}
        if oracle and config.method != "dynamic_rubric":
            raise ValueError("config.oracle is supported by the dynamic_rubric method only")
        self.setup = build(
            rc, self.tokenizer, models["policy"], models["generator"], models["verifier"],
            max_items=config.rubric.max_items, max_item_tokens=config.rubric.max_item_tokens,
            policy_optimizer=_optimizer(config.optim.policy_lr, config),
            generator_optimizer=_optimizer(config.optim.generator_lr, config),
            chat_template_kwargs=dict(config.chat_template_kwargs) or None,
            template_style=config.rubric.template_style, **oracle)
        frozen = {"verifier": nnx.state(models["verifier"], nnx.Param)}
        if rc.policy_beta > 0:
            frozen["policy_ref"] = reference_params(models["policy"])
        if rc.generator_beta > 0:
            frozen["generator_ref"] = reference_params(models["generator"])
        self.models = models
        self.frozen = frozen
        d = config.data
        self.round_flops = flops.round_flops_from_setup(
            self.setup, {"prompt": (d.batch_size, d.prompt_tokens),
                         "policy_input": (d.batch_size, d.policy_tokens),
                         "anchors": (d.batch_size, d.num_anchors, d.anchor_tokens)},
            **{role: models[role].config for role in ("policy", "generator", "verifier")})
        self._evaluate = None
        if self.colocated:
            self._round = coevolve.make_round_step(self.setup, frozen, round_fn)
            evaluate = jax.jit(lambda state, frozen, batch, rng: (
                coevolve.dynamic_rubric_evaluation(self.setup, state, frozen, batch, rng)))
        else:
            run = placement.SubMeshes(self.setup, self.meshes)
            self._round = coevolve.make_submesh_round_step(self.setup, frozen, run, round_fn)
            evaluate = functools.partial(coevolve.dynamic_rubric_evaluation, self.setup, run=run)
        if self.eval_records and config.method == "dynamic_rubric":
            self._eval_batch = self._encode(self.eval_records)
            self._evaluate = evaluate

    # -------------------------------------------------------------- train_loop.Task
    def init_state(self, rng: jax.Array):
        return coevolve.init_state(self.setup, self.models["policy"], self.models["generator"])

    def abstract_state(self):
        return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                            self.init_state(jax.random.key(0)))

    def round_step(self, state, batch, rng):
        state, out = self._round(state, batch, rng)
        return state, {**out["scalars"], "outputs": out["outputs"]}

    def batch(self, position: int) -> dict[str, jax.Array]:
        """The global batch at `position`; each process reads and encodes only the rows its
        own devices hold (`shd.local_rows`), the rest of the global array lives elsewhere."""
        size = self.config.data.batch_size
        return self._encode([self.records[(position * size + i) % len(self.records)]
                             for i in range(size)])

    def evaluate(self, state, round_: int) -> dict[str, jax.Array]:
        """The held-out batch's rollout without updates (`coevolve.dynamic_rubric_evaluation`),
        with the same key every time, so that curves move with the models only."""
        return self._evaluate(state, self.frozen, self._eval_batch,
                              jax.random.key(self.config.seed + 1))

    def _encode(self, records: list) -> dict[str, jax.Array]:
        cfg = self.config.data
        local = shd.local_rows(self.mesh, len(records))
        rows = [records[i] for i in local]
        host = coevolve.encode_batch(
            self.tokenizer, [prompt_text(r.messages) for r in rows],
            [[a.text for a in r.answers[:cfg.num_anchors]] for r in rows],
            prompt_tokens=cfg.prompt_tokens, policy_tokens=cfg.policy_tokens,
            anchor_tokens=cfg.anchor_tokens, num_anchors=cfg.num_anchors)
        return shd.global_batch(self.mesh, host, local, len(records))

    def text_samples(self, state, batch, metrics) -> dict[str, str]:
        out = metrics["outputs"]
        decode = lambda ids, n: self.tokenizer.decode(np.asarray(ids)[:int(n)])  # noqa: E731
        return {
            "sample/prompt": self.tokenizer.decode(
                np.asarray(batch["prompt"][0])[: int(batch["prompt_len"][0])]),
            "sample/response": decode(out["responses"][0, 0], out["response_len"][0, 0]),
            "sample/rubric": decode(out["rubrics"][0, 0], out["rubric_len"][0, 0]),
        }


def train(config: ml_collections.ConfigDict, workdir: str | Path) -> dict:
    """Builds the task and runs (or resumes) training in `workdir`."""
    # gs:// and other URLs stay URLs (one shared workdir for every host of a pod).
    workdir = epath.Path(workdir if "://" in str(workdir) else Path(workdir).absolute())
    if jax.process_index() == 0:  # one writer on the shared workdir
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / _CONFIG_FILE).write_text(config.to_json_best_effort(indent=2))
    task = CoevolveTask(config)
    return run_training(
        task, workdir=str(workdir), rounds=config.rounds, seed=config.seed,
        checkpoint_every=config.checkpoint_every, keep_checkpoints=config.keep_checkpoints,
        log_every=config.log_every, config=_fingerprinted(config),
        eval_fn=task.evaluate if task._evaluate is not None else None,
        eval_every=config.eval_every or None, profile_round=config.profile_round or None)


def _fingerprinted(config: ml_collections.ConfigDict) -> dict:
    """The config minus what may change on resume (the number of rounds, logging)."""
    data = json.loads(config.to_json_best_effort())
    for key in ("rounds", "log_every", "checkpoint_every", "keep_checkpoints", "eval_every",
                "profile_round"):
        data.pop(key, None)
    return data


def export(workdir: str | Path, role: str, out: str | Path, *, dtype: str | None = None) -> Path:
    """Writes the latest checkpoint's `role` (policy or generator) as an HF checkpoint,
    with the tokenizer beside it."""
    if role not in ("policy", "generator"):
        raise ValueError(f"role must be 'policy' or 'generator', got {role!r}")
    workdir = Path(workdir).absolute()
    config_file = workdir / _CONFIG_FILE
    if not config_file.is_file():
        raise FileNotFoundError(f"missing file {config_file}: is {workdir} a training workdir?")
    task = CoevolveTask(load_config(config_file))
    state, meta = restore_checkpoint(str(workdir), task.abstract_state())
    model = nnx.merge(task.setup.policy_graph if role == "policy" else
                      task.setup.generator_graph, state[role])
    path = jaxrubric.save_pretrained(model, out, dtype=dtype)
    task.tokenizer.save_pretrained(path)
    print(f"exported the {role} of round {meta['round']} to {path}")
    return path
