"""A toy-world run whose generator is forced to write one constant rubric, for the watch's test
(`test_watch_in_the_toy_world.py`): `python forced_rubric_run.py WORKDIR ROUNDS`.

The rubric pays for keeping the small digits (`has 0` ... `has 3`), the opposite of the task's
ground truth, so a policy that learns what it pays for gets a rising training reward and a
falling held-out quality. Everything else is the default world's frozen run from the shipped
starts: the policy trains, the generator is frozen, the held-out evaluation is the ground
truth. The run is `WORKDIR/runs/forced`.
"""

import dataclasses
import sys
from pathlib import Path

import jax.numpy as jnp

from jaxrubric.methods import dynamic_rubric
from jaxrubric.rubric import grammar as grammar_lib
from jaxrubric.toy import digits_task as task
from jaxrubric.toy import warm_starts
from jaxrubric.toy.runs import train_toy_run
from jaxrubric.toy.workdir import prepare_workdir, use_workdir
from jaxrubric.toy.world import METHOD, START_OUTPUTS
from jaxrubric.toy.world_config import ToyWorldConfig
from jaxrubric.toy.world_runs import run_config, write_data

RUBRIC = "".join(f"[5] has {digit}\n" for digit in "0123")


def forced_write(tokens: list[int]):
    """The write stage, its rubrics replaced by `tokens` for every prompt and group."""
    written = dynamic_rubric.write

    def write(setup, *args, **kwargs):
        rubrics = written(setup, *args, **kwargs)
        samples = rubrics.samples
        b, g, length = samples.tokens.shape
        row = jnp.full((length,), setup.pad_id, jnp.int32).at[:len(tokens)].set(
            jnp.asarray(tokens, jnp.int32))
        forced = jnp.broadcast_to(row, (b, g, length))
        samples = dataclasses.replace(
            samples, tokens=forced, finished=jnp.ones((b, g), bool),
            lengths=jnp.full((b, g), len(tokens), samples.lengths.dtype))
        parsed = grammar_lib.parse_rubric_tokens(forced, setup.grammar, setup.pad_id)
        return rubrics._replace(samples=samples, parsed=parsed)

    return write


def main(workdir: Path, rounds: int) -> None:
    cfg = ToyWorldConfig()
    workdir, tokenizer = prepare_workdir(workdir, cfg)
    warm_starts.provide(workdir, tokenizer, METHOD, cfg, START_OUTPUTS)
    use_workdir(workdir)
    tokens = tokenizer.encode(RUBRIC, add_special_tokens=False) + [tokenizer.eos_token_id]
    dynamic_rubric.write = forced_write(tokens)
    config = run_config("frozen", workdir, write_data(workdir, cfg), cfg,
                        workdir / "models" / "generator")
    config.rounds, config.eval_every, config.checkpoint_every = rounds, 10, 10
    config.data.eval_batch_size = 64  # the held-out gold metric on 64 questions
    config.round.eval_micro_batches = 1
    train_toy_run("forced", workdir, config, oracle=task.oracle_reward)


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
