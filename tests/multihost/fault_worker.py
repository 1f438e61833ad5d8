"""One process of the multi-process fault tests (`tests/multihost/test_multihost_faults.py`), not a test.

It joins the run through `jaxrubric.distributed` (the CLI flags, as `multihost_worker.py` does)
and trains `Walk` with `train_loop.run_training`: a state sharded over the devices of every
process, whose round sums over all of them, so every round is a cross-process collective that a
lost process leaves unfinished. At the end it writes its summary as JSON. (The real round runs
on the same set-up in `test_multihost.py`; the tiny config's round takes minutes to compile on
two cores, this one a second: the fault tests are about the loop, not the round.)

- `--round-seconds S`: a pause before each round, so the test can act mid-run;
- `--hold-save ROUND`: process 1 writes `<workdir>/holding` while it writes its part of that
  round's checkpoint, and never finishes it, so the test can kill it mid-write.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxrubric import distributed
from jaxrubric.train_loop import run_training

SIZE = 4096


class Walk:
    """`helpers.WalkTask` with its vector split over every device of every process, and a
    round that adds the vector's mean (an all-reduce across processes)."""

    def __init__(self, round_seconds: float):
        mesh = Mesh(np.array(jax.devices()), ("x",))
        self.split = NamedSharding(mesh, PartitionSpec("x"))
        self.whole = NamedSharding(mesh, PartitionSpec())
        self.round_seconds = round_seconds
        shardings = {"w": self.split, "round": self.whole}
        self._init = jax.jit(lambda: {"w": jax.random.normal(jax.random.key(0), (SIZE,)),
                                      "round": jnp.zeros((), jnp.int32)}, out_shardings=shardings)
        self._round = jax.jit(_round, out_shardings=(shardings, self.whole), donate_argnums=0)

    def init_state(self, rng):
        return self._init()

    def abstract_state(self):
        return {"w": jax.ShapeDtypeStruct((SIZE,), jnp.float32, sharding=self.split),
                "round": jax.ShapeDtypeStruct((), jnp.int32, sharding=self.whole)}

    def round_step(self, state, batch, rng):
        time.sleep(self.round_seconds)
        return self._round(state, rng)

    def batch(self, position):
        return None


def _round(state, rng):
    w = state["w"]
    w = w * 0.9 + jax.random.normal(rng, w.shape) + jnp.mean(w)
    return {"w": w, "round": state["round"] + 1}, {"mean": jnp.mean(w), "max": jnp.max(w)}


def _hold_save(round_: int, marker: Path) -> None:
    """Process 1 never finishes its part of `round_`'s checkpoint (its JSON item, written in
    orbax's background commit, after the arrays), and says so in `marker`."""
    save = ocp.handlers.JsonCheckpointHandler._save_fn

    async def held(self, item, directory):
        if directory.parent.name.startswith(f"{round_}."):
            marker.write_text(str(round_))
            time.sleep(3600)
        await save(self, item, directory)

    ocp.handlers.JsonCheckpointHandler._save_fn = held


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", required=True, help="shared by all processes")
    parser.add_argument("--report", required=True, help="JSON file this process writes")
    parser.add_argument("--rounds", type=int, required=True)
    parser.add_argument("--checkpoint-every", type=int, default=1)
    parser.add_argument("--round-seconds", type=float, default=0.0)
    parser.add_argument("--hold-save", type=int, default=0, metavar="ROUND")
    distributed.add_arguments(parser)
    args = parser.parse_args(argv)
    if not distributed.initialize_from_args(args):
        raise SystemExit("fault_worker: no multi-process settings given")
    if args.hold_save and jax.process_index() == 1:
        _hold_save(args.hold_save, Path(args.workdir) / "holding")
    summary = run_training(Walk(args.round_seconds), workdir=args.workdir, rounds=args.rounds,
                           checkpoint_every=args.checkpoint_every)
    Path(args.report).write_text(json.dumps(summary))


if __name__ == "__main__":
    main()
