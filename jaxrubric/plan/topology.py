"""The chips of a Cloud TPU slice or a GPU host that need not exist, for compiling ahead of time.

With `libtpu` installed (`pip install -e ".[tpu]"`), `jax.experimental.topologies` describes
the devices of any slice by name (`v5p:2x2x1`, `v5e:4x4`, `v6e:2x4`, multi-host ones too), and
programs lower and compile for them with the TPU compiler on a CPU host; nothing runs.

With the CUDA plugin installed (`pip install -e ".[gpu-plan]"`), it describes N GPUs of one
host (`8xH100`, `4xA100`) from a `stream_executor.GpuTargetConfigProto` in text form: the
GPU's published figures, which XLA's GPU compiler would otherwise read from a GPU. They ship
in `gpu_targets/`, one file per GPU, each naming its sources. No NVIDIA library is needed to
compile the round (its attention is einsums); cuDNN's fused attention would need
`nvidia-cudnn-cu12`.
"""

from __future__ import annotations

import importlib.util
import os
import re
from importlib import resources
from typing import NamedTuple

import jax

from jaxrubric import cuda_plugin, mfu
from jaxrubric.plan.errors import PlanError

GPU_NAME = re.compile(r"\d+\s*x\s*[a-z]*\d+.*", re.IGNORECASE)  # 8xH100, 4xA100-80GB
GPU_TARGETS = {"H100": "h100_sxm.txtpb", "H200": "h200_sxm.txtpb", "A100": "a100_sxm_80gb.txtpb"}
MAX_GPUS = 8  # one host: the GPUs of one NVLink domain (HGX)


class Chip(NamedTuple):
    """One chip of the target: what JAX calls it, its bf16 peak FLOP/s and HBM bytes/s
    (`jaxrubric.mfu`; None when unknown), and its platform (`tpu`, `gpu`)."""

    kind: str
    peak_flops: float | None
    hbm_bandwidth: float | None
    platform: str = "tpu"


class GpuTarget(NamedTuple):
    """`count` GPUs of one model on one host, and the model's target config (text proto)."""

    model: str
    count: int
    config: str

    @property
    def memory(self) -> int:
        """The GPU's memory in bytes, as its target config gives it."""
        return int(re.search(r"device_memory_size:\s*(\d+)", self.config).group(1))


def gpu_target(name: str) -> GpuTarget | None:
    """The GPUs `name` (`8xH100`) stands for; None for a name that is not a GPU's (a TPU
    slice); a PlanError for a GPU name `plan` has no target config for, or too many GPUs."""
    name = name.strip()
    if not GPU_NAME.fullmatch(name):
        return None
    known = ", ".join(GPU_TARGETS)
    match = re.fullmatch(r"(\d+)\s*x\s*([a-z]\d+)", name, re.IGNORECASE)
    model = match.group(2).upper() if match else ""
    if model not in GPU_TARGETS:
        raise PlanError(f"--topology {name}: no GPU target config for this name; give "
                        f"NxMODEL with MODEL one of {known} (e.g. 8xH100)")
    count = int(match.group(1))
    if not 1 <= count <= MAX_GPUS:
        raise PlanError(f"--topology {name}: {count} GPUs; a GPU topology is one host of 1 to "
                        f"{MAX_GPUS}")
    config = resources.files("jaxrubric.plan").joinpath("gpu_targets", GPU_TARGETS[model])
    return GpuTarget(model, count, config.read_text())


def devices(name: str) -> list[jax.Device]:
    """The compile-only devices of TPU slice or GPU host `name`, or a PlanError saying why
    not."""
    target = gpu_target(name)
    return tpu_devices(name) if target is None else gpu_devices(target)


def gpu_devices(target: GpuTarget) -> list[jax.Device]:
    """`target`'s GPUs as compile-only devices (the CUDA plugin's topology)."""
    if not cuda_plugin.installed():
        raise PlanError(f"--topology {target.count}x{target.model} compiles with XLA's GPU "
                        "compiler, which the CUDA plugin provides: pip install -e '.[gpu-plan]'")
    # The plugin checks the CUDA libraries when JAX loads it, unless told not to; compiling
    # needs none of them.
    os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")
    from jax.experimental import topologies
    try:
        found = topologies.get_topology_desc(platform="cuda", topology=f"1x1x{target.count}",
                                             target_config=target.config).devices
    except NotImplementedError as err:  # JAX loaded its plugins before, and not this one
        raise PlanError("the CUDA plugin is installed but JAX did not load it (it checks "
                        "CUDA's libraries unless JAX_SKIP_CUDA_CONSTRAINTS_CHECK=1 is set "
                        "before JAX starts)") from err
    except Exception as err:  # the plugin's errors are JaxRuntimeErrors
        raise PlanError(f"the CUDA plugin refuses the {target.model} target "
                        f"({str(err).splitlines()[0]})") from err
    return list(found)


def tpu_devices(name: str) -> list[jax.Device]:
    """The devices of TPU slice `name` (`get_topology_desc`), or a PlanError saying why not."""
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
                        "v6e:2x4, or 8xH100 for GPUs") from err


def chip(device: jax.Device) -> Chip:
    """The peaks of one chip of the target."""
    kind = device.device_kind
    return Chip(kind, mfu.peak_flops(kind), mfu.hbm_bandwidth(kind), device.platform)
