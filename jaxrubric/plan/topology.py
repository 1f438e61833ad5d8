"""The chips of a Cloud TPU slice that need not exist, for compiling ahead of time.

With `libtpu` installed (`pip install -e ".[tpu]"`), `jax.experimental.topologies` describes
the devices of any slice by name (`v5p:2x2x1`, `v5e:4x4`, `v6e:2x4`, multi-host ones too), and
programs lower and compile for them with the TPU compiler on a CPU host; nothing runs.

GPU names (`8xH100`) are refused for now: XLA can compile for a GPU without one (the CUDA
plugin's compile-only topology, given a `GpuTargetConfigProto`), but `plan` does not build
those configs yet; see the README ("Will it fit?").
"""

from __future__ import annotations

import importlib.util
import os
import re
from typing import NamedTuple

import jax

from jaxrubric import mfu
from jaxrubric.plan.errors import PlanError

GPU_NAME = re.compile(r"\d+\s*x\s*[a-z]*\d+.*", re.IGNORECASE)  # 8xH100, 4xA100-80GB


class Chip(NamedTuple):
    """One chip of the slice: what JAX calls it, its bf16 peak FLOP/s and HBM bytes/s
    (`jaxrubric.mfu`; None when unknown)."""

    kind: str
    peak_flops: float | None
    hbm_bandwidth: float | None


def tpu_devices(name: str) -> list[jax.Device]:
    """The devices of TPU slice `name` (`get_topology_desc`), or a PlanError saying why not."""
    if GPU_NAME.fullmatch(name.strip()):
        raise PlanError(f"--topology {name}: GPU targets are not supported yet (see the README, "
                        "'Will it fit?'); give a TPU topology such as v5p:2x2x1, or run "
                        "--compile on the GPU machine")
    if importlib.util.find_spec("libtpu") is None:
        raise PlanError("--topology compiles with the TPU compiler, which libtpu provides: "
                        "pip install -e '.[tpu]'")
    # Compiling opens no TPU, so several processes (a test run's workers) may load libtpu.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    from jax.experimental import topologies
    try:
        return list(topologies.get_topology_desc(topology_name=name, platform="tpu").devices)
    except Exception as err:  # libtpu's errors are RuntimeErrors and XlaRuntimeErrors
        raise PlanError(f"--topology {name!r}: libtpu does not know this slice "
                        f"({str(err).splitlines()[0]}); names look like v5p:2x2x1, v5e:4x4, "
                        "v6e:2x4") from err


def chip(device: jax.Device) -> Chip:
    """The peaks of one chip of the slice."""
    kind = device.device_kind
    return Chip(kind, mfu.peak_flops(kind), mfu.hbm_bandwidth(kind))
