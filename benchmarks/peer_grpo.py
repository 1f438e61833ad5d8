"""Peer table: jaxrubric's sampler and GRPO update against TRL (PyTorch) and Tunix, the same
work on the same weights.

One tiny random Qwen3 (hidden 256, 4 layers, 8 heads / 4 kv heads of 32, MLP 1024, vocabulary
8192, tied embeddings, fp32) is written once as a Hugging Face checkpoint
(`transformers.Qwen3ForCausalLM.save_pretrained`) and loaded by each stack's own loader
(`jaxrubric.load_pretrained`, transformers `from_pretrained`, Tunix's
`qwen3.params.create_model_from_safe_tensors`). Rows:

- **sampling**: 8 prompts x K=8 samples, 16-token prompts, 64 new tokens (no stop token),
  temperature 1 over the whole vocabulary; tokens/s over the whole call (prefill included).
  jaxrubric `sampling.generate`; transformers `generate(do_sample=True,
  num_return_sequences=8)`; Tunix's vanilla `Sampler` (64 rows: it has no samples per prompt;
  prompts pass as text through a tokenizer that reads ids).
- **GRPO iteration**: 64 completions x 64 tokens after their 16-token prompts, fixed random
  tokens and advantages (the same arrays in every stack), beta 0.04 with a reference model
  (k3 KL), token-mean loss, one AdamW step (lr 1e-6): the reference forward, the policy's
  forward and backward, the step. jaxrubric `methods.update.grpo_role_update` (a row per
  completion, the work the peers do; and its default for a prompt's K samples, the prompt
  encoded once). TRL: not `GRPOTrainer.train` (its step samples the completions first) but a
  hand-written loop over the trainer's own pieces on the same tensors: a `GRPOTrainer` built
  with a constant reward and this config (fp32 and gradient checkpointing off, where TRL's
  GRPO defaults are bf16 autocast and on), its `_get_per_token_logps_and_entropies` on its
  reference model, its `compute_loss`, backward, its `create_optimizer` AdamW. Tunix likewise:
  `rl.common.compute_per_token_logps` on the reference, then one jitted step of
  `rl.algo_core.grpo_loss_fn` (the loss `GRPOLearner` trains with) and an `nnx.Optimizer`.

Times are the best of `--repeats` calls after a first one; "compile s" is that first call
minus the best (compilation, and for torch its warm-up). Speed-ups are jaxrubric's speed over
the peer's (> 1: jaxrubric is faster). A busy box moves every stack (the header gives the
load average before and after): compare within one run.
jaxrubric's layers are one `lax.scan` (its loader's default); `--unrolled` unrolls them.

Tunix pins `safetensors<0.8`, so it runs in its own environment: `--tunix-python` names that
venv's interpreter, which runs `TUNIX_SCRIPT` as a subprocess (skipped without it). Such a
venv (google-tunix 0.1.7 with jax 0.10.2 ran on CPU):

    python3 -m venv /tmp/tunix && /tmp/tunix/bin/pip install google-tunix jax flax transformers
    python benchmarks/peer_grpo.py [--repeats N] [--tunix-python /tmp/tunix/bin/python]
        [--unrolled]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
import torch
import transformers
from flax import nnx
from timing import first_and_best

import jaxrubric
from jaxrubric.methods.data import RoleState, trainable
from jaxrubric.methods.round_config import RoleConfig, RoundConfig
from jaxrubric.methods.setup import RoleSpec
from jaxrubric.methods.update import completion_logprobs, grpo_role_update
from jaxrubric.sampling import generate

QWEN3 = dict(vocab_size=8192, hidden_size=256, intermediate_size=1024, num_hidden_layers=4,
             num_attention_heads=8, num_key_value_heads=4, head_dim=32,
             tie_word_embeddings=True, max_position_embeddings=512)
PROMPTS, SAMPLES, PROMPT_LEN, NEW = 8, 8, 16, 64
BETA, LR = 0.04, 1e-6
TOKENIZER = Path(__file__).resolve().parents[1] / "configs" / "assets" / "tiny_tokenizer"


class Work(NamedTuple):
    """The arrays every stack works on (ids in [3, vocab): no pad or stop id among them)."""

    prompts: np.ndarray  # [P, PROMPT_LEN], each prompt sampled K times
    completions: np.ndarray  # [P * K, NEW], rows of prompt p at p * K ... p * K + K - 1
    advantages: np.ndarray  # [P * K]


class Timing(NamedTuple):
    first_s: float
    best_s: float

    @property
    def compile_s(self) -> float:
        return self.first_s - self.best_s


class Result(NamedTuple):
    sampling: Timing | None
    iteration: Timing | None
    note: str = ""


def make_work(seed: int = 0) -> Work:
    rng = np.random.default_rng(seed)
    vocab = QWEN3["vocab_size"]
    return Work(rng.integers(3, vocab, (PROMPTS, PROMPT_LEN)).astype(np.int32),
                rng.integers(3, vocab, (PROMPTS * SAMPLES, NEW)).astype(np.int32),
                rng.normal(size=PROMPTS * SAMPLES).astype(np.float32))


def write_checkpoint(folder: Path) -> None:
    """The random Qwen3 every stack loads."""
    torch.manual_seed(0)
    transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**QWEN3)).save_pretrained(folder)


def timed(fn, repeats: int) -> Timing:
    return Timing(*first_and_best(fn, repeats))


# ------------------------------------------------------------------------------ jaxrubric
def jaxrubric_sampling(model: jaxrubric.Decoder, work: Work, repeats: int) -> Timing:
    prompts = work.prompts.tolist()
    return timed(lambda: jax.block_until_ready(generate(
        model, prompts, max_new_tokens=NEW, num_samples=SAMPLES, temperature=1.0,
        stop_token_ids=[], rng=jax.random.key(0)).tokens), repeats)


def jaxrubric_iteration(model: jaxrubric.Decoder, work: Work, repeats: int,
                        shared: bool) -> Timing:
    """`grpo_role_update` on the work's rows (`shared`: each prompt once under its K
    completions), the state carried from call to call as in training."""
    graph, params = nnx.graphdef(model), nnx.state(model, trainable(model))
    prompt = jnp.asarray(np.repeat(work.prompts, SAMPLES, axis=0))
    completion = jnp.asarray(work.completions)
    ones = jnp.ones_like(completion, bool)
    # The rows' own log-probs as the sampler's: ratio 1, as in the peers (num_iterations 1).
    old = completion_logprobs(model, prompt, jnp.ones_like(prompt, bool), completion, NEW)
    inputs = (prompt, jnp.ones_like(prompt, bool), completion, ones, old,
              jnp.asarray(work.advantages))
    if shared:
        by_prompt = lambda x: x.reshape(PROMPTS, SAMPLES, *x.shape[1:])  # noqa: E731
        inputs = (jnp.asarray(work.prompts), jnp.ones(work.prompts.shape, bool),
                  *map(by_prompt, inputs[2:]))
    optimizer = optax.adamw(LR)
    spec = RoleSpec(graph, optimizer, RoleConfig(beta=BETA), compiled_out=False)
    cfg = RoundConfig(logprob_chunk=NEW, policy=RoleConfig(beta=BETA))
    update = jax.jit(lambda state, ref: grpo_role_update(
        cfg, spec, state, None, ref, *inputs, jax.random.key(0))[0], donate_argnums=0)
    trained = jax.tree.map(jnp.copy, params)  # donated: the model's own weights stay
    state = [RoleState(trained, optimizer.init(trained))]

    def step():
        state[0] = jax.block_until_ready(update(state[0], params))

    return timed(step, repeats)


def run_jaxrubric(folder: Path, work: Work, repeats: int, scan_layers: bool
                  ) -> dict[str, Result]:
    model = jaxrubric.load_pretrained(folder, scan_layers=scan_layers)
    return {"jaxrubric": Result(jaxrubric_sampling(model, work, repeats),
                                jaxrubric_iteration(model, work, repeats, shared=False),
                                "`generate`; `grpo_role_update`, a row per completion"),
            "jaxrubric, prompt once": Result(
                None, jaxrubric_iteration(model, work, repeats, shared=True),
                "`grpo_role_update`, each prompt encoded once under its K completions")}


# ------------------------------------------------------------------------------ TRL
def transformers_sampling(model, work: Work, repeats: int) -> Timing:
    prompts = torch.as_tensor(work.prompts, dtype=torch.long)

    def call():
        with torch.no_grad():
            model.generate(prompts, attention_mask=torch.ones_like(prompts), do_sample=True,
                           num_return_sequences=SAMPLES, max_new_tokens=NEW,
                           min_new_tokens=NEW, temperature=1.0, top_k=0, top_p=1.0,
                           pad_token_id=0, use_cache=True)

    return timed(call, repeats)


def trl_trainer(folder: Path, output_dir: Path):
    """A `GRPOTrainer` with this benchmark's config and a constant reward (which nothing calls:
    `trl_iteration` feeds the trainer fixed tensors)."""
    import datasets
    from trl import GRPOConfig, GRPOTrainer

    # fp32 and no recomputed activations, as in the other stacks (TRL's GRPO defaults: bf16
    # autocast, gradient checkpointing on).
    args = GRPOConfig(
        output_dir=str(output_dir), use_cpu=True, bf16=False, gradient_checkpointing=False,
        beta=BETA, loss_type="dapo", num_generations=SAMPLES,
        per_device_train_batch_size=PROMPTS * SAMPLES, max_completion_length=NEW,
        learning_rate=LR, report_to=[], save_strategy="no")
    return GRPOTrainer(
        model=transformers.AutoModelForCausalLM.from_pretrained(folder),
        reward_funcs=[lambda completions, **_: [1.0] * len(completions)], args=args,
        train_dataset=datasets.Dataset.from_dict({"prompt": ["a"] * PROMPTS}),
        processing_class=transformers.AutoTokenizer.from_pretrained(TOKENIZER))


def trl_iteration(trainer, work: Work, repeats: int) -> Timing:
    """The trainer's reference forward, loss, backward and AdamW step on the work's rows
    (`loss_type="dapo"`: the token mean over the batch, jaxrubric's "token-mean")."""
    prompt = torch.as_tensor(np.repeat(work.prompts, SAMPLES, axis=0), dtype=torch.long)
    completion = torch.as_tensor(work.completions, dtype=torch.long)
    ids = torch.cat([prompt, completion], dim=1)
    optimizer = trainer.create_optimizer()
    trainer.model.train()
    # What `Trainer.train` sets before its first step (the loss scales by it).
    trainer.current_gradient_accumulation_steps = trainer.args.gradient_accumulation_steps

    def step():
        with torch.no_grad():
            ref, _, _ = trainer._get_per_token_logps_and_entropies(
                trainer.ref_model, ids, torch.ones_like(ids), NEW)
        inputs = dict(prompt_ids=prompt, prompt_mask=torch.ones_like(prompt),
                      completion_ids=completion, completion_mask=torch.ones_like(completion),
                      advantages=torch.as_tensor(work.advantages), ref_per_token_logps=ref,
                      num_items_in_batch=torch.tensor(float(completion.numel())))
        trainer.compute_loss(trainer.model, inputs).backward()
        optimizer.step()
        optimizer.zero_grad()

    return timed(step, repeats)


def run_trl(folder: Path, work: Work, repeats: int) -> dict[str, Result]:
    import trl

    with tempfile.TemporaryDirectory() as output_dir:
        trainer = trl_trainer(folder, Path(output_dir))
        sampling = transformers_sampling(trainer.model.eval(), work, repeats)
        iteration = trl_iteration(trainer, work, repeats)
    return {f"TRL {trl.__version__} / transformers {transformers.__version__}": Result(
        sampling, iteration, "`generate`; `GRPOTrainer`'s loss and reference, own loop")}


# ------------------------------------------------------------------------------ Tunix
# Runs in Tunix's interpreter: argv = checkpoint folder, work .npz, repeats; prints one JSON
# line {"version", "sampling": [first, best], "iteration": [first, best]}.
TUNIX_SCRIPT = r'''
import importlib.metadata, json, sys, time
import jax, jax.numpy as jnp, numpy as np, optax
from flax import nnx
from tunix.generate import sampler as sampler_lib
from tunix.models.qwen3 import model as model_lib, params as params_lib
from tunix.rl import algo_core, common
from tunix.rl.grpo.grpo_learner import GRPOConfig

folder, work, repeats = sys.argv[1], np.load(sys.argv[2]), int(sys.argv[3])
c = json.load(open(f"{folder}/config.json"))
cfg = model_lib.ModelConfig(
    num_layers=c["num_hidden_layers"], vocab_size=c["vocab_size"], embed_dim=c["hidden_size"],
    hidden_dim=c["intermediate_size"], num_heads=c["num_attention_heads"],
    head_dim=c["head_dim"], num_kv_heads=c["num_key_value_heads"],
    rope_theta=int(c["rope_parameters"]["rope_theta"]), norm_eps=c["rms_norm_eps"],
    use_tied_embedding=c["tie_word_embeddings"])
mesh = jax.make_mesh((1, 1), ("fsdp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
load = lambda: params_lib.create_model_from_safe_tensors(folder, cfg, mesh=mesh)
PAD, EOS = 0, 1  # the work's ids start at 3

def timed(fn):
    start = time.perf_counter(); fn(); first = time.perf_counter() - start
    times = []
    for _ in range(repeats):
        start = time.perf_counter(); fn(); times.append(time.perf_counter() - start)
    return [first, min(times)]

class IdTokenizer:  # prompts travel as text: "12 873 ..." <-> ids
    def encode(self, text, **_): return [int(t) for t in text.split()]
    def decode(self, ids, **_): return " ".join(map(str, ids))
    def bos_id(self): return 0  # falsy: no BOS prepended
    def eos_id(self): return EOS
    def pad_id(self): return PAD

policy = load()
prompts, completions = work["prompts"], work["completions"]
samples, new = completions.shape[0] // prompts.shape[0], completions.shape[1]
sampler = sampler_lib.Sampler(policy, IdTokenizer(), sampler_lib.CacheConfig(
    cache_size=prompts.shape[1] + new, num_layers=cfg.num_layers,
    num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim))
rows = [" ".join(map(str, p)) for p in prompts for _ in range(samples)]
sampling = timed(lambda: sampler(rows, max_generation_steps=new,
                                 max_prompt_length=prompts.shape[1], temperature=1.0,
                                 top_p=1.0, eos_tokens=[-1], seed=0))

algo = GRPOConfig(num_generations=samples, beta=float(work["beta"]),
                  loss_agg_mode="token-mean", kl_loss_mode="low_var_kl")
algo.temperature = 1.0  # GRPOLearner copies it from the rollout config
ref_graph, ref_state = nnx.split(load())
optimizer = nnx.Optimizer(policy, optax.adamw(float(work["lr"])), wrt=nnx.Param)
prompt = jnp.asarray(np.repeat(prompts, samples, axis=0))
completion = jnp.asarray(completions)

@nnx.jit
def train_step(model, optimizer, example):
    grad_fn = nnx.value_and_grad(algo_core.grpo_loss_fn, argnums=nnx.DiffState(0, nnx.Param),
                                 has_aux=True)
    (loss, _), grads = grad_fn(model, example, algo, PAD, EOS)
    optimizer.update(model, grads)
    return loss

def iteration():
    ref = common.compute_per_token_logps(ref_graph, ref_state, prompt, completion, PAD, EOS)
    example = common.TrainExample(
        prompt_ids=prompt, prompt_mask=prompt != PAD, completion_ids=completion,
        completion_mask=jnp.ones_like(completion), advantages=jnp.asarray(work["advantages"]),
        ref_per_token_logps=ref, old_per_token_logps=None)
    jax.block_until_ready(train_step(policy, optimizer, example))

print(json.dumps({"version": importlib.metadata.version("google-tunix"),
                  "sampling": sampling, "iteration": timed(iteration)}))
'''


def run_tunix(python: str | None, folder: Path, work: Work, repeats: int) -> dict[str, Result]:
    if python is None:
        return {"Tunix": Result(None, None, "skipped: no --tunix-python (Tunix pins "
                                "safetensors<0.8, so it needs its own venv)")}
    arrays = folder / "work.npz"
    np.savez(arrays, **work._asdict(), beta=BETA, lr=LR)
    done = subprocess.run([python, "-c", TUNIX_SCRIPT, str(folder), str(arrays), str(repeats)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"Tunix": Result(None, None, f"failed: {last[:150]}")}
    out = json.loads(done.stdout.strip().splitlines()[-1])
    return {f"Tunix {out['version']}": Result(
        Timing(*out["sampling"]), Timing(*out["iteration"]),
        "vanilla `Sampler`; `compute_per_token_logps` + `grpo_loss_fn`, own loop")}


# ------------------------------------------------------------------------------ table
def cell(x: float | None, spec: str) -> str:
    return "n/a" if x is None else format(x, spec)


def table(results: dict[str, Result]) -> list[str]:
    tokens = PROMPTS * SAMPLES * NEW
    ours = results["jaxrubric"]

    def speed_up(theirs: Timing | None, mine: Timing, peer: bool) -> float | None:
        return theirs.best_s / mine.best_s if theirs and peer else None

    lines = ["| stack | sampling tok/s | sampling compile s | GRPO iteration s | "
             "GRPO compile s | sampling speed-up | iteration speed-up | note |",
             "|---|---:|---:|---:|---:|---:|---:|---|"]
    for name, r in results.items():
        s, it, peer = r.sampling, r.iteration, not name.startswith("jaxrubric")
        lines.append(
            f"| {name} | {cell(s and tokens / s.best_s, '.0f')} "
            f"| {cell(s and s.compile_s, '.1f')} | {cell(it and it.best_s, '.2f')} "
            f"| {cell(it and it.compile_s, '.1f')} "
            f"| {cell(speed_up(s, ours.sampling, peer), '.2f')} "
            f"| {cell(speed_up(it, ours.iteration, peer), '.2f')} | {r.note} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="timed calls after the first")
    parser.add_argument("--tunix-python", default=None,
                        help="python of a venv with google-tunix (runs the Tunix rows)")
    parser.add_argument("--unrolled", action="store_true",
                        help="jaxrubric's layers unrolled, not lax.scan")
    args = parser.parse_args()
    work = make_work()
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        write_checkpoint(folder)
        results = {**run_jaxrubric(folder, work, args.repeats, not args.unrolled),
                   **run_trl(folder, work, args.repeats),
                   **run_tunix(args.tunix_python, folder, work, args.repeats)}
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}, torch {torch.__version__} "
          f"({torch.get_num_threads()} threads); random Qwen3 h{QWEN3['hidden_size']} "
          f"L{QWEN3['num_hidden_layers']}, vocab {QWEN3['vocab_size']}, fp32, jaxrubric layers "
          f"{'unrolled' if args.unrolled else 'scanned'}; sampling "
          f"{PROMPTS} prompts x K={SAMPLES}, prompt {PROMPT_LEN}, {NEW} new, temperature 1; "
          f"GRPO {PROMPTS * SAMPLES} x {NEW} tokens, beta {BETA}, one AdamW step; best of "
          f"{args.repeats}; speed-up: peer time / jaxrubric time; load average (1 min) "
          f"{load_before:.1f} before, {os.getloadavg()[0]:.1f} after, {os.cpu_count()} cores\n")
    print("\n".join(table(results)))


if __name__ == "__main__":
    main()
