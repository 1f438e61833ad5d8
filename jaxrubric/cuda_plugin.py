"""The CUDA plugin, where it is installed on a host without NVIDIA's driver, loaded without its
driver warning.

`jaxrubric plan --topology 8xH100` compiles with XLA's GPU compiler, which JAX's CUDA plugin
carries (the `gpu-plan` extra); no GPU is needed. But once installed, the plugin is loaded by
every process that starts JAX, and on a host without the driver its extension writes "Could
not find cuda drivers on your machine" through absl, straight to file descriptor 2, three times
(no environment variable turns it off), and once more when JAX initializes it.
`load_quietly()` imports the plugin first and wraps its `initialize`, both with those lines
held back; anything else it writes still reaches stderr. On a host with the driver nothing is held back.
"""

from __future__ import annotations

import ctypes
import functools
import importlib
import importlib.util
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from jaxrubric import fault_log

T = TypeVar("T")

MODULE = "jax_plugins.xla_cuda12"
_DRIVER_LINES = ("Could not find cuda drivers on your machine",
                 "All log messages before absl::InitializeLog() is called")


def installed() -> bool:
    """Whether JAX's CUDA plugin (`jax-cuda12-plugin`) is importable."""
    try:
        return importlib.util.find_spec(MODULE) is not None
    except ModuleNotFoundError:  # no `jax_plugins` namespace at all
        return False


def driver_present() -> bool:
    """Whether NVIDIA's driver library loads (what the plugin's warning is about)."""
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


def without_driver_lines(text: str) -> str:
    """`text` less the plugin's lines about a missing driver."""
    return "".join(line for line in text.splitlines(keepends=True)
                   if not any(said in line for said in _DRIVER_LINES))


def load_quietly() -> None:
    """Imports the CUDA plugin with its missing-driver lines held back, where it is installed
    and the driver is not, and holds them back again when JAX initializes it (it loads the
    plugin's library then); does nothing otherwise. A plugin that fails to import is left for
    JAX to import and report as it does."""
    if MODULE in sys.modules or not installed() or driver_present():
        return
    try:
        module = _holding_back_driver_lines(importlib.import_module, MODULE)
    except Exception:  # noqa: BLE001 - JAX imports it again and says why
        return
    initialize = module.initialize
    module.initialize = functools.wraps(initialize)(
        lambda: _holding_back_driver_lines(initialize))


def _holding_back_driver_lines(call: Callable[..., T], *args: Any) -> T:
    """`call(*args)` with what it writes captured (`fault_log.captured`); that, less the
    missing-driver lines, is written to stderr after (also when it raised)."""
    held = None
    try:
        with fault_log.captured() as held:
            return call(*args)
    finally:
        rest = without_driver_lines(held.text) if held is not None else ""
        if rest:
            sys.stderr.write(rest)
            sys.stderr.flush()
