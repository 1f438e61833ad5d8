"""Warm starts the toy-world tests share: the GenRubric world's verifier is the DynamicRubric
world's (`world.VERIFIER_SETTINGS`), so the suite trains it once for both tests, in a process
of its own as `jaxrubric train` runs, under a lock that the other xdist worker waits on."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

from filelock import FileLock
from xla_flags import as_a_user_runs

from jaxrubric.toy import world

_TRAIN = """import json, sys
from jaxrubric import sharding as shd
from jaxrubric.toy import world
cfg = world.ToyWorldConfig(**json.loads(sys.argv[2]))
workdir, tokenizer = world.prepare_workdir(sys.argv[1], cfg)
world.warm_start("verifier", workdir, tokenizer, shd.make_mesh({"fsdp": -1}), cfg)
"""


def give_verifier(root: Path, workdir: Path, cfg: world.ToyWorldConfig) -> None:
    """Puts in `workdir` (a world's, before it runs) the toy tokenizer and the verifier that
    `cfg` trains, training it under `root` first unless another test has."""
    settings = dataclasses.asdict(world.verifier_settings(cfg))
    key = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:12]
    shared = root / f"toy-verifier-{key}"
    with FileLock(str(shared) + ".lock"):
        if not (shared / "models" / "verifier" / "config.json").exists():
            subprocess.run([sys.executable, "-c", _TRAIN, str(shared), json.dumps(settings)],
                           env=as_a_user_runs(), check=True, timeout=900)
    for part in ("tokenizer", "models/verifier"):
        shutil.copytree(shared / part, workdir / part)
