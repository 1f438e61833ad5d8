"""Starts shipped with the package: the default seed's warm starts (and, for the DynamicRubric
world, the generators' own rounds and the stale evaluator), so that `jaxrubric train` trains
only the compared runs.

Every stage before a world's compared runs is determined by the code and the settings it
reads (`<Config>.start_settings()`). `make` runs those stages for a seed's defaults and copies
what they wrote in the workdir, with those settings and what identifies the code that made
them, into `assets/<method>-seed<seed>/`:

    python -m jaxrubric.toy.warm_starts --method dynamic_rubric --seed 0 \
        --out jaxrubric/toy/assets/dynamic_rubric-seed0

`provide` copies them into a new workdir when the world's settings are the ones they were made
with; the stages then find them as their own cache and skip. Otherwise (another seed or
setting, `from_scratch`) the stages train them, and one line says why.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import platform
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from jaxrubric.toy.config_tree import differences
from jaxrubric.toy.workdir import prepare_workdir, run_world
from jaxrubric.train_loop import ConfigMismatchError

ASSETS = Path(__file__).parent / "assets"
MANIFEST = "warm_starts.json"  # in an asset folder; a copy in a workdir says it was installed
# A text every role's inputs are made of: how the tokenizer splits it is part of a start.
PROBE = "<|im_start|>big 381729<|im_end|><|im_start|>[3] has 8\n[2] omits x\nyes no"


def asset_dir(method: str, seed: int) -> Path:
    """Where the package keeps `method`'s shipped starts for `seed`."""
    return ASSETS / f"{method}-seed{seed}"


def provide(workdir: Path, tokenizer: Any, method: str, cfg: Any, outputs: Sequence[str],
            from_scratch: bool = False) -> bool:
    """Installs the shipped starts of `cfg.seed` in `workdir` (a prepared world workdir, its
    `tokenizer`) when they were made with `cfg.start_settings()` and the same tokenizer; says
    in one line which starts the world uses.
    `outputs`: the workdir paths the start stages write. A workdir that trained its own starts
    keeps them; one that holds the shipped ones cannot train `from_scratch`. Returns whether
    the shipped starts are in use."""
    installed = workdir / MANIFEST
    if from_scratch:
        if installed.exists():
            raise ConfigMismatchError(
                f"{workdir} holds the shipped warm starts: training them from scratch needs a "
                "new workdir")
        print("warm starts: trained here (from scratch)", flush=True)
        return False
    if not installed.exists() and any((workdir / p).exists() for p in outputs):
        print("warm starts: this workdir's own", flush=True)
        return False
    source = asset_dir(method, cfg.seed)
    if not (source / MANIFEST).exists():
        print(f"warm starts: none shipped for seed {cfg.seed}; training them", flush=True)
        return False
    manifest = json.loads((source / MANIFEST).read_text())
    differ = differences(manifest["settings"], json.loads(json.dumps(cfg.start_settings())))
    if tokenizer_fingerprint(tokenizer) != manifest["tokenizer"]:
        differ.append("the toy tokenizer")
    if differ:
        print(f"warm starts: the shipped ones were made with another config ({'; '.join(differ)}):"
              " training them from scratch", flush=True)
        return False
    for name in manifest["files"]:
        if not (workdir / name).exists():
            (workdir / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source / name, workdir / name)
    installed.write_text(json.dumps({k: v for k, v in manifest.items() if k != "files"},
                                    indent=1))
    print(f"warm starts: shipped with the package ({source.name}, made by "
          f"`{manifest['made_by']['command']}`); --from-scratch trains them", flush=True)
    return True


def file_hash(path: Path) -> str:
    """The sha256 of a file's bytes."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """A sha256 of what the roles' token ids depend on: the vocabulary, the chat template and
    how `PROBE` is split (not the files' bytes, which vary with the `tokenizers` version)."""
    spec = {"vocab": sorted(tokenizer.get_vocab().items()),
            "chat_template": tokenizer.chat_template,
            "probe": tokenizer.encode(PROBE, add_special_tokens=False)}
    return hashlib.sha256(json.dumps(spec).encode()).hexdigest()


def make(method: str, seed: int, out: Path, workdir: Path | None = None, jobs: int = 1
         ) -> dict[str, Any]:
    """Runs `method`'s start stages for `seed`'s defaults in `workdir` (a temporary one by
    default; a world workdir of the same config reuses its cache) and writes what they wrote,
    with the manifest, to `out` (replaced). Returns the manifest."""
    from jaxrubric.cli import TOY_WORLDS

    module, config_class, *_ = TOY_WORLDS[method]
    world = importlib.import_module(module)
    cfg = getattr(world, config_class)(seed=seed)
    with tempfile.TemporaryDirectory(prefix="jaxrubric-starts-") as tmp:
        workdir, tokenizer = prepare_workdir(workdir or tmp, cfg)
        world.write_data(workdir, cfg)
        run_world(workdir, world.start_stages(workdir, cfg), jobs)
        files = sorted(str(f.relative_to(workdir)) for p in world.START_OUTPUTS
                       for f in ([workdir / p] if (workdir / p).is_file()
                                 else (workdir / p).rglob("*")) if f.is_file())
        if out.exists():
            shutil.rmtree(out)
        for name in files:
            (out / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(workdir / name, out / name)
        manifest = {"method": method, "seed": seed, "settings": cfg.start_settings(),
                    "tokenizer": tokenizer_fingerprint(tokenizer),
                    "made_by": made_by(method, seed, out),
                    "files": {name: file_hash(out / name) for name in files}}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def made_by(method: str, seed: int, out: Path) -> dict[str, Any]:
    """What identifies the code that made a set of starts: the command, the package's version
    and git commit (marked when the checkout had uncommitted changes), and JAX's versions."""
    import jax
    import jaxlib

    import jaxrubric

    root = Path(__file__).resolve().parents[2]

    def git(*args: str) -> str | None:
        try:
            return subprocess.run(["git", "-C", str(root), *args], capture_output=True,
                                  text=True, check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return None

    dirty = git("status", "--porcelain", "--untracked-files=no")
    return {"command": f"python -m jaxrubric.toy.warm_starts --method {method} --seed {seed} "
                       f"--out {out}",
            "jaxrubric": jaxrubric.__version__, "commit": git("rev-parse", "HEAD"),
            "uncommitted_changes": bool(dirty), "jax": jax.__version__,
            "jaxlib": jaxlib.__version__, "python": platform.python_version()}


def main(argv: Sequence[str] | None = None) -> int:
    from jaxrubric.cli import TOY_WORLDS

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--method", choices=sorted(TOY_WORLDS), required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True, help="the asset folder to write")
    parser.add_argument("--workdir", type=Path, help="a world workdir of the same config whose "
                                                     "cached starts to reuse (default: fresh)")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes")
    args = parser.parse_args(argv)
    manifest = make(args.method, args.seed, args.out, args.workdir, args.jobs)
    size = sum((args.out / name).stat().st_size for name in manifest["files"])
    print(f"wrote {len(manifest['files'])} files, {size / 1e6:.1f} MB, to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
