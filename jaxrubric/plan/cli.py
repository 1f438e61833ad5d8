"""`jaxrubric plan`: will a training config fit in device memory, per device, before any run?

The subcommand (`add_parser`, `run`) and its stand-alone entry point (`main`,
`python -m jaxrubric.plan`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from jaxrubric.config import ConfigFileError, load_config
from jaxrubric.models.config import ConfigError
from jaxrubric.models.hf import CheckpointError
from jaxrubric.plan import compile as compile_check
from jaxrubric.plan import topology
from jaxrubric.plan.errors import PlanError
from jaxrubric.plan.memory import plan_memory
from jaxrubric.plan.meshes import parse_mesh
from jaxrubric.plan.report import format_plan, parse_bytes

DESCRIPTION = __doc__.split("\n\n")[0]


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True, help="a training config file (configs/NAME.py)")
    p.add_argument("--mesh", help="data=D,fsdp=F,tensor=T (default: the config's mesh); roles "
                                  "on sub-meshes take --config.submeshes.ROLE=MESH instead")
    p.add_argument("--devices", type=int, help="chips in the slice: fills a -1 mesh axis and "
                                               "is checked against the mesh (or sub-meshes)")
    p.add_argument("--device-memory",
                   help="memory of one chip, e.g. 95GiB (v5p), 16GiB (v5e), 80GiB (H100); "
                        "with a GPU --topology, the GPU's (80GiB H100 and A100, 141GiB H200)")
    p.add_argument("--headroom", type=float, default=0.1,
                   help="fraction of device memory kept free for XLA and fragmentation")
    p.add_argument("--compile", action="store_true",
                   help="also compile the real round (on sub-meshes: each stage) on this "
                        "machine's devices and print XLA's memory analysis beside the plan")
    p.add_argument("--topology",
                   help="compile the round for this TPU slice (v5p:2x2x1, v5e:4x4, v6e:2x4, "
                        "...) with the TPU compiler (libtpu: the tpu extra), or for N GPUs of "
                        "one host (8xH100, 4xA100, 8xH200; N 1-8) with XLA's GPU compiler (the "
                        "CUDA plugin: the gpu-plan extra), no TPU or GPU needed, and print "
                        "XLA's memory analysis and the roofline per stage")


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Registers the `plan` subcommand on an `add_subparsers()` object."""
    p = subparsers.add_parser(
        "plan", help="per-device memory of a training config on a mesh, without loading weights",
        description=DESCRIPTION + " Extra --config.KEY=VALUE arguments override the config.")
    _add_arguments(p)
    p.set_defaults(func=run, takes_overrides=True)
    return p


def _device_memory(args: argparse.Namespace) -> int:
    """--device-memory in bytes; without it, the memory of a GPU --topology's GPU."""
    if args.device_memory is not None:
        return parse_bytes(args.device_memory)
    target = topology.gpu_target(args.topology) if args.topology else None
    if target is None:
        raise PlanError("--device-memory is required (the memory of one chip, e.g. 95GiB for "
                        "v5p) unless --topology names GPUs")
    return target.memory


def run(args: argparse.Namespace, overrides: Sequence[str]) -> int:
    """The `plan` command: prints the plan (and XLA's analysis with --compile or --topology,
    and the roofline with --topology)."""
    try:
        config = load_config(args.config, overrides)
        if args.mesh and any(config.submeshes.values()):
            raise PlanError("--mesh sets the mesh of colocated roles (config.mesh), but the "
                            "config places the roles on sub-meshes (config.submeshes): set "
                            "those instead, e.g. --config.submeshes.policy=fsdp=4")
        if args.mesh:
            for axis, size in parse_mesh(args.mesh).items():
                config.mesh[axis] = size
        if args.compile and args.topology:
            raise PlanError("--compile compiles for this machine's devices, --topology for a "
                            "TPU slice or GPUs: give one")
        slice_devices = topology.devices(args.topology) if args.topology else None
        if slice_devices is not None:
            if args.devices not in (None, len(slice_devices)):
                raise PlanError(f"--devices is {args.devices}, the topology {args.topology} "
                                f"has {len(slice_devices)} chips")
            devices = len(slice_devices)
        elif args.compile:
            devices = compile_check.local_devices_for(config, args.devices)
        else:
            devices = args.devices
        platform = slice_devices[0].platform if slice_devices else None
        result = plan_memory(config, _device_memory(args), headroom=args.headroom,
                             devices=devices, platform=platform)
        print(format_plan(result, args.config))
        if args.compile or slice_devices is not None:
            print(flush=True)
            chip = topology.chip(slice_devices[0]) if slice_devices else None
            if chip is not None:
                print(f"Compiling for {args.topology}: {len(slice_devices)} x {chip.kind} "
                      f"(the {chip.platform.upper()} compiler, nothing runs)...", flush=True)
            print(compile_check.comparison(result, config, slice_devices, chip))
    except (PlanError, ConfigFileError, ConfigError, CheckpointError) as err:
        print(f"jaxrubric plan: error: {err}", file=sys.stderr)
        return 2
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """`jaxrubric plan ARGS` without the rest of the command line (tests, `python -m`)."""
    parser = argparse.ArgumentParser(prog="jaxrubric plan", description=DESCRIPTION)
    _add_arguments(parser)
    args, extra = parser.parse_known_args(argv)
    bad = [item for item in extra if not item.startswith("--config.")]
    if bad:
        parser.error(f"unrecognized arguments: {' '.join(bad)}")
    return run(args, [item.removeprefix("--config.") for item in extra])
