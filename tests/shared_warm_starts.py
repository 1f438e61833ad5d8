"""Warm starts the toy-world tests share: the verifier is one for both worlds
(`toy/verifier_sft.py`), so the suite trains it once, in a process of its own as `jaxrubric
train` runs, under a lock that another xdist worker waits on."""

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

from jaxrubric.toy.verifier_sft import VerifierSettings

_TRAIN = """import json, sys
from jaxrubric import sharding as shd
from jaxrubric.toy.verifier_sft import VerifierSettings, warm_start_verifier
from jaxrubric.toy.workdir import prepare_workdir
settings = VerifierSettings(**json.loads(sys.argv[2]))
workdir, tokenizer = prepare_workdir(sys.argv[1], settings)
warm_start_verifier(workdir, tokenizer, shd.make_mesh({"fsdp": -1}), settings)
"""


def give_verifier(root: Path, workdir: Path, settings: VerifierSettings) -> None:
    """Puts in `workdir` (a world's, before it runs) the toy tokenizer and the verifier that
    `settings` train, training it under `root` first unless another test has."""
    settings = dataclasses.asdict(settings)
    key = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:12]
    shared = root / f"toy-verifier-{key}"
    with FileLock(str(shared) + ".lock"):
        if not (shared / "models" / "verifier" / "config.json").exists():
            subprocess.run([sys.executable, "-c", _TRAIN, str(shared), json.dumps(settings)],
                           env=as_a_user_runs(), check=True, timeout=900)
    for part in ("tokenizer", "models/verifier"):
        shutil.copytree(shared / part, workdir / part)
