"""The platform a traced program is compiled for, which picks (and configures) its kernels."""

from __future__ import annotations

import jax

from jaxrubric import sharding as shd


def compile_platform() -> str:
    """`tpu`, `gpu` or `cpu`: the devices of the current activation layout's mesh when one is
    set (an ahead-of-time TPU compile traced on a CPU host is for `tpu`), else JAX's default
    backend."""
    layout = shd.current_layout()
    if layout is None:
        return jax.default_backend()
    return layout.mesh.devices.flat[0].platform
