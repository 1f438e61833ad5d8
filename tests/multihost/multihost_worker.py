"""One process of the multi-process training test (`tests/multihost/test_multihost.py`), not a test itself.

It joins the run through `jaxrubric.distributed` (the CLI flags), trains the tiny DynamicRubric
config in a workdir that every process shares (orbax writes one checkpoint from all of them) and
writes what it saw as JSON: process and device counts, the mesh, the batch rows it loaded and
the final metrics, so the test can check the multi-process view of the run as well as its
result. The test sets `XLA_FLAGS` (fake CPU devices) and `JAX_PLATFORMS` in its environment.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

import jax

from jaxrubric import distributed
from jaxrubric import sharding as shd
from jaxrubric.config import load_config
from jaxrubric.train import train

CONFIG = Path(__file__).parents[2] / "configs" / "tiny_dynamic_rubric.py"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", required=True, help="shared by all processes")
    parser.add_argument("--report", required=True, help="JSON file this process writes")
    parser.add_argument("overrides", nargs="*", help="config overrides KEY=VALUE")
    distributed.add_arguments(parser)
    args = parser.parse_args(argv)
    if not distributed.initialize_from_args(args):
        raise SystemExit("multihost_worker: no multi-process settings given")
    # The same matmul precision as the single-process reference (tests/conftest.py).
    jax.config.update("jax_default_matmul_precision", "highest")
    config = load_config(CONFIG, args.overrides)
    summary = train(config, args.workdir)
    mesh = shd.make_mesh(dict(config.mesh))
    report = {
        "process_index": jax.process_index(),
        "process_count": jax.process_count(),
        "device_count": jax.device_count(),
        "local_device_count": jax.local_device_count(),
        "mesh": dict(mesh.shape),
        "local_rows": shd.local_rows(mesh, config.data.batch_size),
        "summary": summary,
    }
    Path(args.report).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
