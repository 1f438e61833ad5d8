"""`jaxrubric train` and `jaxrubric export`: a config -> models, data and the co-evolution round,
run by the generic host loop (`train_loop.run_training`)."""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import ml_collections
import numpy as np
import optax
from etils import epath
from flax import nnx
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec

import jaxrubric
from jaxrubric import flops, placement
from jaxrubric import sharding as shd
from jaxrubric.config import base_config, load_config, role_lora, round_config, saved_config
from jaxrubric.data import load_anchors, prompt_text
from jaxrubric.logging_utils import CardLog, WandbSettings
from jaxrubric.methods import get_method
from jaxrubric.methods.batches import batch_shapes, encode_batch
from jaxrubric.methods.cards import build_cards, card_table, card_text
from jaxrubric.methods.data import (Frozen, RoleState, RoundBatch, RoundResult, RoundState,
                                    base_weights, role_weights, trainable)
from jaxrubric.methods.gold import GoldRows
from jaxrubric.methods.programs import make_round_step, make_submesh_round_step
from jaxrubric.methods.setup import init_state
from jaxrubric.models import adapters, hf
from jaxrubric.models.config import LoraConfig
from jaxrubric.models.transformer import Decoder
from jaxrubric.roles import ROLES, TRAINED, Role
from jaxrubric.train_loop import restore_checkpoint, run_training
from jaxrubric.watch import WatchSettings

CONFIG_FILE = "config.json"
# A method with its own held-out rows (GenRubric) appends each evaluation's score matrices here,
# one JSON line per query (`ExpertRows.score_rows`); after a resume the later line of a round
# is the valid one.
EVAL_SCORES = "eval_scores.jsonl"


def learning_rate(config: ml_collections.ConfigDict, role: Role, steps: int
                  ) -> float | optax.Schedule:
    """`optim.<role>_lr` under `optim.lr_schedule` over `steps` optimiser steps. A constant rate
    without warm-up stays a float, so its optimiser state is what it always was (checkpoints
    written before schedules existed still restore)."""
    optim = config.optim
    peak = optim[f"{role}_lr"]
    warmup = min(optim.warmup_steps, steps)
    if optim.lr_schedule == "cosine":
        return optax.warmup_cosine_decay_schedule(
            0.0, peak, warmup, max(steps, warmup + 1), end_value=peak * optim.final_lr_fraction)
    return optax.linear_schedule(0.0, peak, warmup) if warmup else peak


def make_optimizer(config: ml_collections.ConfigDict, role: Role, steps: int | None = None
                   ) -> optax.GradientTransformation:
    """The AdamW of a trained role (`config.optim`), after global-norm gradient clipping;
    `steps` is how many optimiser steps the schedule spans (default: a training run's,
    rounds x round.num_updates)."""
    optim = config.optim
    if steps is None:
        steps = config.rounds * config.round.num_updates
    return optax.chain(
        optax.clip_by_global_norm(optim.max_grad_norm),
        optax.adamw(learning_rate(config, role, steps), b1=optim.b1, b2=optim.b2,
                    weight_decay=optim.weight_decay),
    )


def role_model(role: ml_collections.ConfigDict, vocab_size: int, tokenizer: Any,
                mesh, lora: LoraConfig | None = None) -> Decoder:
    """An HF checkpoint from `role.path`, or (empty path) a tiny random Qwen3 over the vocab.

    With `lora` the weights are the frozen base, held in the compute dtype, and fresh adapters
    (in `role.param_dtype`) are added: the model starts as the checkpoint."""
    param_dtype = role.dtype if lora is not None else role.param_dtype
    if role.path:
        model = jaxrubric.load_pretrained(role.path, dtype=role.dtype, param_dtype=param_dtype,
                                          mesh=mesh, remat=role.remat,
                                          attention_chunk=role.attention_chunk,
                                          attention_impl=role.attention_impl,
                                          scan_layers=role.scan_layers)
    else:
        cfg = jaxrubric.tiny_config(
            "qwen3", vocab_size=vocab_size, eos_token_ids=(tokenizer.eos_token_id,),
            pad_token_id=tokenizer.pad_token_id, dtype=role.dtype, param_dtype=param_dtype,
            remat=role.remat, attention_chunk=role.attention_chunk,
            attention_impl=role.attention_impl, scan_layers=role.scan_layers,
            vocab_multiple=shd.vocab_multiple(mesh))
        model = shd.shard_model(jaxrubric.init_model(cfg, seed=role.seed), mesh)
    if lora is not None:
        model.config = model.config.replace(param_dtype=role.param_dtype)
        adapters.add_adapters(model, lora, seed=role.seed, mesh=mesh)
    return model


def reference_params(model: Decoder, *, copy: bool = True) -> nnx.State:
    """A frozen copy of `model`'s parameters for the KL term, in its compute dtype.

    The forward casts every weight to the compute dtype before using it, so a reference stored
    in that dtype gives the same log-probs bit for bit; with fp32 master weights and bf16
    compute (the 8B recipes) it takes half the memory. `copy=False` for a model nothing else
    keeps (a reference loaded for the purpose): weights already in that dtype are taken as
    they are, not held twice at start-up.
    """
    compute = jax.numpy.dtype(model.config.dtype)
    keep = (lambda x: x.copy()) if copy else (lambda x: x)
    return jax.tree.map(
        lambda x: x.astype(compute) if compute.itemsize < x.dtype.itemsize else keep(x),
        nnx.state(model, nnx.Param))


def _param_shapes(model: Decoder) -> dict:
    return jax.tree.map(lambda x: (x.shape, x.dtype),
                        nnx.to_pure_dict(nnx.state(model, nnx.Param)))


OracleReward = Callable[..., jax.Array]


class CoevolveTask:
    """The `train_loop.Task` of co-evolution by the config's method (`jaxrubric.methods`).

    `oracle`: the ground-truth reward `config.oracle` names, for worlds that have one (the toy
    world hands its checker in; `jaxrubric.toy.ORACLES`). `eval_scores`: a JSONL file that
    each evaluation on a method's own held-out rows appends its score matrices to."""

    def __init__(self, config: ml_collections.ConfigDict, oracle: OracleReward | None = None,
                 *, eval_scores: str | None = None):
        self.config = config
        self.eval_scores = eval_scores
        self.method = get_method(config.method)
        if bool(config.oracle) != (oracle is not None):
            raise ValueError(f"config.oracle={config.oracle!r} needs its ground-truth reward "
                             "function passed as `oracle` (and only then): jaxrubric.toy.ORACLES "
                             "has the toy world's")
        if any(config.submeshes.values()):
            self.meshes = placement.make_submeshes(dict(config.submeshes))
        else:
            self.meshes = dict.fromkeys(ROLES, shd.make_mesh(dict(config.mesh)))
        # One program per round, or one per stage (sub-meshes, `config.stage_programs`).
        self.colocated = (len({id(m) for m in self.meshes.values()}) == 1
                          and not config.stage_programs)
        if config.round.runtime_switches and not self.colocated:
            raise ValueError("config.round.runtime_switches needs every role on one mesh "
                             "(config.submeshes empty): sub-mesh stages compile apart anyway")
        # Batches are placed on the policy's mesh; a stage on another mesh moves what it reads.
        self.mesh = self.meshes[Role.POLICY]
        evaluates = bool(config.data.eval) and self.method.evaluates
        held_out_sizes = bool(config.data.eval or config.data.gold)  # eval_batch_size rows
        for role, mesh in self.meshes.items():
            ways = shd.batch_ways(mesh)
            for key in ("batch_size", "eval_batch_size") if held_out_sizes else ("batch_size",):
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
        if loaded.problems and jax.process_index() == 0:
            reasons = "".join(f"\n  {p}" for p in loaded.problems[:3])
            more = f"\n  ... and {len(loaded.problems) - 3} more" if len(loaded.problems) > 3 else ""
            print(f"{config.data.train}: skipped {len(loaded.problems)} bad rows of "
                  f"{len(loaded.problems) + len(loaded.records)} (data.skip_bad_rows):"
                  f"{reasons}{more}", flush=True)
        self.eval_records = []
        # A method's own held-out rows (GenRubric: expert rubrics), else anchor lists.
        held_out = self.method.held_out
        self.held_out = None
        if evaluates and held_out is not None:
            self.held_out = held_out.from_config(config, self.tokenizer)
            if jax.process_index() == 0:
                print(self.held_out.summary(), flush=True)
        elif evaluates:
            size = config.data.eval_batch_size or config.data.batch_size
            self.eval_records = load_anchors(config.data.eval, skip_bad_rows=False).records
            if len(self.eval_records) < size:
                raise ValueError(f"{config.data.eval}: {len(self.eval_records)} rows, the "
                                 f"held-out batch needs {size}")
            self.eval_records = self.eval_records[:size]
        # The gold metric's rows (config.data.gold), read and checked before any model loads.
        self.gold = GoldRows.from_config(config, self.tokenizer) if config.data.gold else None
        if self.gold is not None and jax.process_index() == 0:
            print(self.gold.summary(), flush=True)
        models = {role: role_model(config[role], len(self.tokenizer), self.tokenizer,
                                    self.meshes[role],
                                    role_lora(config, role) if role in TRAINED else None)
                  for role in ROLES}
        rc = round_config(config)
        self.setup = self.method.build_setup(
            rc, self.tokenizer, models,
            optimizers={role: make_optimizer(config, role) for role in TRAINED},
            max_items=config.rubric.max_items, max_item_tokens=config.rubric.max_item_tokens,
            chat_template_kwargs=dict(config.chat_template_kwargs) or None,
            template_style=config.rubric.template_style, oracle_reward=oracle)
        # A LoRA role's KL reference is its frozen base (adapters off): no copy is made.
        references = {role: self._reference(role, models[role]) if rc.needs_reference(role)
                      and models[role].config.lora is None else None for role in TRAINED}
        bases = {role: base_weights(models[role]) for role in TRAINED}
        switches = None
        if rc.runtime_switches:
            switches = jax.device_put(rc.switches(), NamedSharding(self.mesh, PartitionSpec()))
        explorer = (self._same_architecture(Role.GENERATOR, "explorer", models[Role.GENERATOR])
                    if config.generator.explorer else None)
        self.frozen = Frozen(nnx.state(models[Role.VERIFIER], nnx.Param),
                             policy_ref=references[Role.POLICY],
                             generator_ref=references[Role.GENERATOR],
                             policy_base=bases[Role.POLICY], generator_base=bases[Role.GENERATOR],
                             switches=switches, generator_explorer=explorer)
        self.models = models
        # The held-out evaluation's setup: the round's, or with its own micro-batches.
        eval_config = rc.for_evaluation()
        eval_setup = (self.setup if eval_config == rc else
                      dataclasses.replace(self.setup, config=eval_config))
        if self.colocated:
            self._round = make_round_step(self.setup, self.frozen, self.method.round)

            def program(fn):
                return jax.jit(shd.traced_in(lambda state, frozen, batch, rng: (
                    fn(eval_setup, state, frozen, batch, rng)), self.mesh))
        else:
            run = placement.SubMeshes(self.meshes)
            self._round = make_submesh_round_step(self.setup, self.frozen, run,
                                                  self.method.round)

            def program(fn):
                return functools.partial(placement.within(run, fn), eval_setup)
        evaluate = program(self.method.evaluate)
        self._evaluate = None
        if self.eval_records:
            self._eval_batch = self._encode(self.eval_records)
            self._evaluate = evaluate
        elif self.held_out is not None:
            self._eval_batch = self._placed(self.held_out.batch, len(self.held_out.records))
            self._evaluate = evaluate
        self._gold = None
        if self.gold is not None:
            self._gold_batch = self._placed(self.gold.batch, len(self.gold.ids))
            self._gold = program(self.method.gold_evaluate)

    def _placed(self, host: Any, size: int) -> Any:
        """A host batch of `size` rows as a global batch on the policy's mesh, each process
        placing the rows its devices hold."""
        local = shd.local_rows(self.mesh, size)
        return shd.global_batch(self.mesh, jax.tree.map(lambda x: x[local], host), local, size)

    @property
    def evaluates(self) -> bool:
        """Whether the run has a held-out evaluation (`data.eval`) or a gold metric
        (`data.gold`)."""
        return self._evaluate is not None or self._gold is not None

    def _reference(self, role: Role, model: Decoder) -> nnx.State:
        """The KL reference of a fully fine-tuned role: `config.<role>.reference`'s weights,
        which must have `model`'s shapes, or (empty) `model`'s own starting weights."""
        if not self.config[role].reference:
            return reference_params(model)
        return self._same_architecture(role, "reference", model)

    def _same_architecture(self, role: Role, key: str, model: Decoder) -> nnx.State:
        """The frozen weights of the checkpoint `config.<role>.<key>` names, which must have
        `model`'s shapes (loaded as the role is, on its mesh)."""
        spec = self.config[role]
        other = role_model(ml_collections.ConfigDict({**spec.to_dict(), "path": spec[key]}),
                           len(self.tokenizer), self.tokenizer, self.meshes[role])
        if _param_shapes(other) != _param_shapes(model):
            raise ValueError(f"config.{role}.{key}: {spec[key]} is not the "
                             f"architecture of config.{role}.path ({spec.path or 'random'})")
        return reference_params(other, copy=False)

    # -------------------------------------------------------------- train_loop.Task
    def init_state(self, rng: jax.Array) -> RoundState:
        return init_state(self.setup, self.models)

    def abstract_state(self) -> RoundState:
        return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                            self.init_state(jax.random.key(0)))

    @functools.cached_property
    def round_flops(self) -> float:
        """Model FLOPs of one round (what MFU counts), from the shapes of its stages traced on
        the round's input shapes (`Method.round_shapes`), when first read. The trace skips the
        updates, so it is given the trained weights without their optimiser state."""
        roles = {role: RoleState(nnx.state(self.models[role], trainable(self.models[role])), None)
                 for role in TRAINED}
        state = RoundState(roles[Role.POLICY], roles[Role.GENERATOR],
                           jax.ShapeDtypeStruct((), np.int32))
        shapes = self.method.round_shapes(self.setup, state, self.frozen,
                                          batch_shapes(self.tokenizer, self.config.data),
                                          jax.random.key(0))
        return flops.round_flops({role: self.models[role].config for role in ROLES},
                                 self.setup.config, shapes)

    def round_step(self, state: RoundState, batch: RoundBatch, rng: jax.Array
                   ) -> tuple[RoundState, RoundResult]:
        return self._round(state, batch, rng)

    def batch(self, position: int) -> RoundBatch:
        """The global batch at `position`; each process reads and encodes only the rows its
        own devices hold (`shd.local_rows`), the rest of the global array lives elsewhere."""
        size = self.config.data.batch_size
        return self._encode([self.records[(position * size + i) % len(self.records)]
                             for i in range(size)])

    def evaluate(self, state: RoundState, round_: int) -> dict[str, jax.Array | float]:
        """The held-out evaluation and the gold metric, each with the same key every time, so
        that curves move with the models only."""
        key = jax.random.key(self.config.seed + 1)
        out = {} if self._evaluate is None else self._held_out_metrics(state, round_, key)
        if self._gold is not None:
            out |= self._gold(state, self.frozen, self._gold_batch, key)
        return out

    def _held_out_metrics(self, state: RoundState, round_: int, key: jax.Array
                          ) -> dict[str, jax.Array | float]:
        """The held-out batch's rollout without updates (the method's `evaluate`). On a
        method's own held-out rows the device returns score matrices: they are fetched,
        appended to `eval_scores` and turned into the metrics here, on the host."""
        out = self._evaluate(state, self.frozen, self._eval_batch, key)
        if self.held_out is None:
            return out
        out = _on_host(out)
        if self.eval_scores is not None and jax.process_index() == 0:
            with open(self.eval_scores, "a", encoding="utf-8") as f:
                f.writelines(json.dumps(row) + "\n"
                             for row in self.held_out.score_rows(out, round_, self.tokenizer))
        return self.held_out.scalars(out)

    def _encode(self, records: list) -> RoundBatch:
        cfg = self.config.data
        local = shd.local_rows(self.mesh, len(records))
        rows = [records[i] for i in local]
        host = encode_batch(
            self.tokenizer, [prompt_text(r.messages) for r in rows],
            [[a.text for a in r.answers[:cfg.num_anchors]] for r in rows],
            prompt_tokens=cfg.prompt_tokens, policy_tokens=cfg.policy_tokens,
            anchor_tokens=cfg.anchor_tokens, num_anchors=cfg.num_anchors,
            anchor_ranks=[[a.rank for a in r.answers[:cfg.num_anchors]] for r in rows])
        return shd.global_batch(self.mesh, host, local, len(records))

    def text_samples(self, state: RoundState, batch: RoundBatch,
                     result: RoundResult) -> dict[str, str]:
        """The first prompt, its first response and rubric: only those rows leave the device."""
        out = result.outputs
        first = jax.device_get((batch.question.tokens[0], batch.question.lengths[0],
                                out.responses[0, 0], out.response_len[0, 0],
                                out.rubrics[0, 0], out.rubric_len[0, 0]))
        decode = lambda ids, n: self.tokenizer.decode(np.asarray(ids)[:int(n)])  # noqa: E731
        return {"sample/prompt": decode(*first[0:2]), "sample/response": decode(*first[2:4]),
                "sample/rubric": decode(*first[4:6])}

    def cards(self, state: RoundState, batch: RoundBatch, result: RoundResult,
              round_: int) -> CardLog:
        """Rubric cards of the batch's first `logging.card_prompts` prompts: only those rows
        leave the device."""
        rows = min(self.config.logging.card_prompts, self.config.data.batch_size)
        # Every process calls this (a row may live on another host: gathered, a collective).
        outputs, question = _on_host(jax.tree.map(
            lambda x: x[:rows], (result.outputs, (batch.question.tokens, batch.question.lengths))))
        rc = self.setup.config
        records = build_cards(
            outputs, question, self.tokenizer, round_=round_, method=self.method.name,
            soft_verdicts=rc.soft_verdicts,
            # GenRubric's answers come N per rubric; DynamicRubric's explorer writes the last.
            answers_per_group=getattr(rc, "induced_responses", None),
            explorer_rubrics=getattr(rc, "explorer_rubrics", 0))
        return CardLog(records, {f"cards/prompt_{c['row']}": card_text(c) for c in records},
                       card_table(records))


def _on_host(tree: Any) -> Any:
    """Device arrays as NumPy on every process, gathered where some rows live on another host
    (a collective: every process calls it)."""
    return jax.tree.map(lambda x: np.asarray(
        x if x.is_fully_addressable else multihost_utils.process_allgather(x, tiled=True)), tree)


def train(config: ml_collections.ConfigDict, workdir: str | Path, *,
          oracle: OracleReward | None = None, fallback: bool = True) -> dict:
    """Builds the task and runs (or resumes) training in `workdir`; `oracle` as in
    `CoevolveTask`, `fallback` as in `train_loop.run_training` (a damaged newest checkpoint:
    resume from the newest good one, or stop)."""
    # gs:// and other URLs stay URLs (one shared workdir for every host of a pod).
    workdir = epath.Path(workdir if "://" in str(workdir) else Path(workdir).absolute())
    if jax.process_index() == 0:  # one writer on the shared workdir
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / CONFIG_FILE).write_text(config.to_json_best_effort(indent=2))
    task = CoevolveTask(config, oracle, eval_scores=(
        None if "://" in str(workdir) else str(workdir / EVAL_SCORES)))
    return run_training(
        task, workdir=str(workdir), rounds=config.rounds, seed=config.seed,
        checkpoint_every=config.checkpoint_every, keep_checkpoints=config.keep_checkpoints,
        log_every=config.log_every, config=_fingerprinted(config),
        eval_fn=task.evaluate if task.evaluates else None,
        eval_every=config.eval_every or None, profile_round=config.profile_round or None,
        max_skipped_rounds=config.max_skipped_rounds, fallback=fallback,
        wandb=(WandbSettings(config.logging.wandb_project, config.logging.wandb_run_name)
               if config.logging.wandb else None),
        config_defaults=_fingerprinted(base_config(config.method)),
        saved_config=_saved_run, card_every=config.logging.card_every,
        watch=WatchSettings(**config.watch.to_dict()))


def _saved_run(run: dict) -> dict:
    """A checkpoint's run config in today's layout (`config.saved_config`), fingerprinted."""
    return {**run, "config": _fingerprinted(saved_config(run["config"]))}


def _fingerprinted(config: ml_collections.ConfigDict) -> dict:
    """The config minus what may change on resume (the number of rounds, logging)."""
    data = json.loads(config.to_json_best_effort())
    for key in ("rounds", "log_every", "checkpoint_every", "keep_checkpoints", "eval_every",
                "profile_round", "max_skipped_rounds", "logging", "watch"):
        data.pop(key, None)
    return data


def export(workdir: str | Path, role: str, out: str | Path, *, dtype: Any = None,
           oracle: OracleReward | None = None, adapter: bool = False) -> Path:
    """Writes the latest checkpoint's `role` (policy or generator) as an HF checkpoint,
    with the tokenizer beside it; `oracle` as the run was trained with (`CoevolveTask`).

    A LoRA role is written merged (its adapters folded into the weights), or with `adapter`
    as a PEFT adapter folder over the base checkpoint `config.<role>.path`."""
    if role not in TRAINED:
        raise ValueError(f"role must be 'policy' or 'generator', got {role!r}")
    workdir = Path(workdir).absolute()
    config_file = workdir / CONFIG_FILE
    if not config_file.is_file():
        raise FileNotFoundError(f"missing file {config_file}: is {workdir} a training workdir?")
    task = CoevolveTask(load_config(config_file), oracle)
    state, meta = restore_checkpoint(str(workdir), task.abstract_state())
    role = Role(role)
    model = nnx.merge(task.setup.graph(role), role_weights(state, task.frozen, role))
    if adapter:
        if model.config.lora is None:
            raise ValueError(f"--adapter: the {role} of {workdir} was fully fine-tuned "
                             f"(config.{role}.lora.rank is 0); export it without --adapter")
        if not task.config[role].path:
            raise ValueError(f"--adapter: the {role}'s base is a random model (config.{role}."
                             "path is empty), which PEFT cannot load; export it merged")
        path = hf.save_peft_adapter(model, out, base_model=task.config[role].path,
                                          dtype=dtype)
    else:
        path = jaxrubric.save_pretrained(model, out, dtype=dtype)
    task.tokenizer.save_pretrained(path)
    kind = "LoRA adapter" if adapter else "weights"
    print(f"exported the {role}'s {kind} of round {meta['round']} to {path}")
    return path
