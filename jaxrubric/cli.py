"""The `jaxrubric` command line: one subcommand per job, each a thin shell over the library."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path


def _smoke(args: argparse.Namespace) -> int:
    """Loads a checkpoint (or writes and reloads a tiny random one) and prints next-token logits."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    import jaxrubric
    from jaxrubric import sharding as shd

    mesh = shd.make_mesh({"fsdp": -1})
    if args.model:
        model = jaxrubric.load_pretrained(args.model, mesh=mesh, dtype=args.dtype)
        tokenizer = jaxrubric.load_tokenizer(args.model)
        ids = tokenizer(args.prompt)["input_ids"]
        decode = tokenizer.decode
        source = args.model
    else:
        # No weights can be assumed offline: build a tiny Qwen3, export it as a Hugging Face
        # checkpoint and load it back through the same path real checkpoints take.
        tmp = Path(tempfile.mkdtemp(prefix="jaxrubric-smoke-"))
        jaxrubric.save_pretrained(jaxrubric.init_model(jaxrubric.tiny_config("qwen3")), tmp)
        model = jaxrubric.load_pretrained(tmp, mesh=mesh, dtype=args.dtype)
        ids = [b % model.config.vocab_size for b in args.prompt.encode()]
        decode = lambda token_ids: f"<id {token_ids[0]}>"  # noqa: E731
        source = f"tiny random Qwen3 written to {tmp}"
    logits = jax.jit(lambda m, x: m(x))(model, jnp.asarray([ids]))
    last = np.asarray(logits[0, -1, : model.config.vocab_size])
    cfg = model.config
    print(f"model: {source}")
    print(f"  {cfg.model_type}, {cfg.num_layers} layers, hidden {cfg.hidden_size}, "
          f"heads {cfg.num_heads}/{cfg.num_kv_heads} kv, vocab {cfg.vocab_size}, {cfg.dtype}")
    print(f"  devices: {len(jax.devices())} x {jax.devices()[0].platform}, mesh {dict(mesh.shape)}")
    print(f"prompt: {args.prompt!r} -> {len(ids)} tokens; logits {tuple(logits.shape)}")
    top = np.argsort(-last)[: args.top]
    for rank, token in enumerate(top, 1):
        print(f"  {rank}. {decode([int(token)])!r:>20}  logit {last[token]:+.4f}")
    return 0


def _read_prompts(args: argparse.Namespace) -> list[str]:
    prompts = list(args.prompt or [])
    if args.prompts_file:
        path = Path(args.prompts_file)
        if not path.is_file():
            raise SystemExit(f"error: --prompts-file {path} does not exist")
        prompts += [line for line in path.read_text().splitlines() if line.strip()]
    if not prompts:
        raise SystemExit("error: give --prompt TEXT (repeatable) or --prompts-file FILE")
    return prompts


def _sample(args: argparse.Namespace) -> int:
    """Chat-templated prompts in, completions out; batched, with a progress bar for many."""
    import jax
    from tqdm import tqdm

    import jaxrubric
    from jaxrubric import sampling

    prompts = _read_prompts(args)
    model = jaxrubric.load_pretrained(args.model, dtype=args.dtype)
    tokenizer = jaxrubric.load_tokenizer(args.model)
    stops = set(model.config.eos_token_ids)
    if tokenizer.eos_token_id is not None:
        stops.add(tokenizer.eos_token_id)
    rng = jax.random.key(args.seed)
    batches = range(0, len(prompts), args.batch_size)
    progress = tqdm(batches, desc="sampling", unit="batch", disable=len(batches) < 2)
    for start in progress:
        chunk = prompts[start:start + args.batch_size]
        ids = [_chat_ids(tokenizer, text) for text in chunk]
        out = sampling.generate(
            model, ids, num_samples=args.num_samples, max_new_tokens=args.max_new_tokens,
            temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
            stop_token_ids=sorted(stops), pad_id=tokenizer.pad_token_id or 0,
            rng=jax.random.fold_in(rng, start))
        tokens, lengths = jax.device_get((out.tokens, out.lengths))
        for i, text in enumerate(chunk):
            progress.write(f"### prompt {start + i + 1}: {text}")
            for k in range(args.num_samples):
                completion = tokenizer.decode(tokens[i, k, :lengths[i, k]],
                                              skip_special_tokens=True)
                progress.write(f"--- sample {k + 1}:\n{completion}")
    return 0


def _chat_ids(tokenizer, text: str) -> list[int]:
    """The chat template applied to one user turn (plain tokens if there is no template)."""
    if tokenizer.chat_template:
        return list(tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True,
            return_dict=True)["input_ids"])
    return tokenizer(text)["input_ids"]


def _convert(args: argparse.Namespace) -> int:
    """Hugging Face folder <-> orbax checkpoint."""
    import jaxrubric
    from jaxrubric import checkpoint

    if args.to == "orbax":
        model = jaxrubric.load_pretrained(args.src, dtype=args.dtype)
        out = checkpoint.save_model(model, args.dst)
    else:
        model = checkpoint.load_model(args.src)
        out = jaxrubric.save_pretrained(model, args.dst, dtype=args.dtype)
    print(f"wrote {args.to} checkpoint to {out}")
    return 0


def _train(args: argparse.Namespace, overrides: Sequence[str]) -> int:
    if args.config is None:
        return _toy_world(args, overrides)
    if args.method:
        raise SystemExit("jaxrubric train: --method picks a toy world; with --config the "
                         "config's `method` key decides (--config.method=...)")
    if args.from_scratch:
        raise SystemExit("jaxrubric train: --from-scratch is the toy world's (its warm starts); "
                         "a config's run starts from the checkpoints it names")
    from jaxrubric.config import load_config
    from jaxrubric.train import train

    if not args.workdir:
        raise SystemExit("jaxrubric train: --workdir is required with --config")
    if args.skip_bad_rows:
        overrides = [*overrides, "data.skip_bad_rows=true"]
    config = load_config(args.config, overrides)
    summary = train(config, args.workdir, oracle=_oracle(config.oracle),
                    fallback=not args.no_fallback)
    if summary.get("preempted"):
        print(f"stopped by SIGTERM after round {summary['final_round']}; checkpoint saved")
    return 0


# Each toy world: its module, config class, runner, default workdir, and worker processes
# without `--jobs` (`default_toy_jobs`).
TOY_WORLDS = {
    "dynamic_rubric": ("jaxrubric.toy.world", "ToyWorldConfig", "run_toy_world", "toy_world",
                       2),
    "genrubric": ("jaxrubric.toy.genrubric_world", "GenRubricWorldConfig",
                  "run_genrubric_world", "toy_genrubric", 2),
}


def default_toy_jobs(method: str) -> int:
    """Worker processes of a toy world without `--jobs`: two where there are two cores, for
    each world's compared runs are independent stages (one stage's compile runs on one core
    while the other stage computes; the results are the same)."""
    return min(TOY_WORLDS[method][4], os.cpu_count() or 1)


def _toy_world(args: argparse.Namespace, overrides: Sequence[str]) -> int:
    """`jaxrubric train` without a config: a toy world, end to end (`--method`: DynamicRubric's
    or GenRubric's)."""
    if overrides:
        raise SystemExit("--config.KEY=VALUE overrides need --config; the toy world takes "
                         "--method, --seed, --rounds, --jobs and --from-scratch")
    rounds = {"rounds": args.rounds} if args.rounds else {}
    method = args.method or "dynamic_rubric"
    module, config_class, runner, workdir, _ = TOY_WORLDS[method]
    world = importlib.import_module(module)  # imported on use: it pulls in matplotlib & co
    getattr(world, runner)(args.workdir or workdir,
                           getattr(world, config_class)(seed=args.seed, **rounds),
                           jobs=args.jobs or default_toy_jobs(method),
                           from_scratch=args.from_scratch)
    return 0


def _oracle(name: str):
    """The ground-truth reward a config's `oracle` names (`jaxrubric.toy.ORACLES`), or None."""
    from jaxrubric.toy import ORACLES

    if name and name not in ORACLES:
        raise SystemExit(f"config.oracle {name!r} is not one of {sorted(ORACLES)}")
    return ORACLES[name] if name else None


def _export(args: argparse.Namespace) -> int:
    from pathlib import Path

    from jaxrubric.config import load_config
    from jaxrubric.train import CONFIG_FILE, export

    config_file = Path(args.workdir) / CONFIG_FILE
    oracle = _oracle(load_config(config_file).oracle) if config_file.is_file() else None
    export(args.workdir, args.role, args.out, dtype=args.dtype, oracle=oracle,
           adapter=args.adapter)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jaxrubric", description=__doc__)
    parser.add_argument("--debug", action="store_true",
                        help="show the traceback of a known error (config, data, checkpoint, "
                             "lock) instead of its one-line message, and what the libraries "
                             "print about a handled fault (else kept in the workdir's "
                             "fault_details.log)")
    from jaxrubric import distributed
    distributed.add_arguments(parser)  # multi-host: before the subcommand, or the environment
    sub = parser.add_subparsers(dest="command", required=True)

    smoke = sub.add_parser("smoke", help="load a model and print next-token logits")
    smoke.add_argument("--model", help="HF checkpoint folder or hub id (default: a tiny random "
                                       "Qwen3 written and reloaded on the spot)")
    smoke.add_argument("--prompt", default="Write a rubric for a good answer.")
    smoke.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None)
    smoke.add_argument("--top", type=int, default=5, help="how many top tokens to print")
    smoke.set_defaults(func=_smoke)

    sample = sub.add_parser("sample", help="sample completions of chat prompts")
    sample.add_argument("--model", required=True, help="HF checkpoint folder or hub id")
    sample.add_argument("--prompt", action="append", help="a user message (repeatable)")
    sample.add_argument("--prompts-file", help="a text file with one prompt per line")
    sample.add_argument("--num-samples", type=int, default=1)
    sample.add_argument("--max-new-tokens", type=int, default=128)
    sample.add_argument("--temperature", type=float, default=1.0, help="0 = greedy")
    sample.add_argument("--top-k", type=int, default=None)
    sample.add_argument("--top-p", type=float, default=None)
    sample.add_argument("--batch-size", type=int, default=8)
    sample.add_argument("--seed", type=int, default=0)
    sample.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None)
    sample.set_defaults(func=_sample)

    train = sub.add_parser(
        "train", help="co-evolve a policy and a rubric generator",
        description="Extra --config.KEY=VALUE arguments override the config. Without --config: "
                    "the toy world (warm starts, then co-evolving, frozen-generator and "
                    "ground-truth runs, a summary and a plot in the workdir).")
    train.add_argument("--config", help="a config file (configs/NAME.py); none: the toy world")
    train.add_argument("--workdir", help="checkpoints, TensorBoard logs; rerun with the same "
                                         "folder to resume (required with --config; toy world default: toy_world)")
    train.add_argument("--method", choices=sorted(TOY_WORLDS),
                       help="toy world only (default dynamic_rubric): DynamicRubric's (co-evolving vs stale, static and "
                            "oracle evaluators) or GenRubric's (self-evolving vs shuffled-reward "
                            "control, agreement with an expert rubric; default workdir "
                            "toy_genrubric)")
    train.add_argument("--seed", type=int, default=0, help="toy world only")
    train.add_argument("--rounds", type=int, default=0,
                       help="toy world only: rounds of each compared run (0: the default)")
    train.add_argument("--jobs", type=int, default=0,
                       help="toy world only: run its independent stages side by side in this "
                            "many processes (default: 2 where there are 2 cores, else one after "
                            "another in this process). The results are the same")
    train.add_argument("--from-scratch", action="store_true",
                       help="toy world only: train the warm starts (and the stages before the "
                            "compared runs) here instead of using the ones shipped with the "
                            "package for the default seed")
    train.add_argument("--no-fallback", action="store_true",
                       help="stop when the newest checkpoint is damaged (default: report it, "
                            "move it aside and resume from the newest good one)")
    train.add_argument("--skip-bad-rows", action="store_true",
                       help="leave out data rows that fail their schema, and say how many "
                            "(the same as --config.data.skip_bad_rows=true)")
    train.set_defaults(func=_train, takes_overrides=True)

    export = sub.add_parser("export", help="write a trained model as an HF checkpoint")
    export.add_argument("--workdir", required=True)
    export.add_argument("--role", choices=["policy", "generator"], default="policy")
    export.add_argument("--out", required=True)
    export.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None)
    export.add_argument("--adapter", action="store_true",
                        help="a LoRA role: write its PEFT adapter folder (adapter_config.json, "
                             "adapter_model.safetensors) instead of merged weights")
    export.set_defaults(func=_export)

    from jaxrubric import sft_command
    sft_command.add_parser(sub)
    from jaxrubric.eval import evaluate as evaluate_command
    evaluate_command.add_parser(sub)
    from jaxrubric import plan as plan_command
    plan_command.add_parser(sub)
    from jaxrubric.report import command as inspect_command
    inspect_command.add_parser(sub)
    from jaxrubric import rubric_export
    rubric_export.add_parser(sub)

    convert = sub.add_parser("convert", help="convert between HF and orbax checkpoints")
    convert.add_argument("--to", choices=["orbax", "hf"], required=True)
    convert.add_argument("src", help="source folder (HF folder or hub id for --to orbax)")
    convert.add_argument("dst", help="destination folder")
    convert.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None)
    convert.set_defaults(func=_convert)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    from jaxrubric import distributed, fault_log
    fault_log.show_library_output(args.debug)
    try:  # before anything touches a device
        distributed.initialize_from_args(args)
    except distributed.DistributedConfigError as error:
        parser.error(str(error))
    if getattr(args, "takes_overrides", False):
        overrides = []
        for item in extra:
            if not item.startswith("--config."):
                parser.error(f"unrecognized argument {item}")
            overrides.append(item.removeprefix("--config."))
        call = lambda: args.func(args, overrides)  # noqa: E731
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    else:
        call = lambda: args.func(args)  # noqa: E731
    try:
        return call()
    except _known_errors() as error:
        if args.debug:
            raise
        print(f"jaxrubric {args.command}: error: {error}", file=sys.stderr)
        return 2


def _known_errors() -> tuple[type[Exception], ...]:
    """Errors that explain themselves: printed as their message, without a traceback (a
    traceback means a bug, and `--debug` shows the known ones' too)."""
    from jaxrubric.config import ConfigFileError
    from jaxrubric.data import DataError
    from jaxrubric.models.config import ConfigError
    from jaxrubric.models.hf import CheckpointError
    from jaxrubric.train_loop import (ConfigMismatchError, DamagedCheckpointError,
                                      NonFiniteError)
    from jaxrubric.workdir_lock import WorkdirLockedError

    return (ConfigFileError, DataError, ConfigError, CheckpointError, ConfigMismatchError,
            DamagedCheckpointError, NonFiniteError, WorkdirLockedError)


if __name__ == "__main__":
    sys.exit(main())
