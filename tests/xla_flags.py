"""The XLA flags of the test session, in one place. Free of jax: conftest.py reads it before
jax is imported, and tests that start processes build those processes' flags from it."""

from __future__ import annotations

import os


def fake_devices(count: int) -> str:
    """`count` fake CPU devices: sharding exercised without accelerators."""
    return f"--xla_force_host_platform_device_count={count}"


FAKE_DEVICES = fake_devices(8)  # the test session's
# A collective whose participants have not all arrived after 40 s makes XLA:CPU end the
# process (a crashed xdist worker); on a loaded 2-core CI machine the 8 fake devices' threads
# can be that late without anything being wrong, so the tests wait up to 10 minutes.
COLLECTIVE_TIMEOUT = "--xla_cpu_collective_call_terminate_timeout_seconds=600"
# XLA:CPU's cheapest code generation: LLVM's optimisation passes off, and fusions emitted by
# the older direct-to-LLVM emitter instead of the MLIR fusion emitters. Most tests compile far
# more than they run: the optimisation level cut the GenRubric and DynamicRubric round tests'
# user time by a quarter (184 s -> 138 s), the emitter the DynamicRubric round test's time by a
# third again (35.9 s -> 24.0 s). Every comparison inside a test is between programs compiled
# alike; the toy worlds, whose results are draws of the user's default compile, run without it
# (`as_a_user_runs`).
FAST_COMPILE = ("--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true "
                "--xla_cpu_use_fusion_emitters=false")


# XLA's CPU client sizes its thread pool by NPROC, else by the cores. On 2 cores a round on a
# tensor-parallel mesh of fake devices can deadlock: two collectives run concurrently (an
# all-reduce over fsdp pairs inside a loop and an all-device collective-permute, mesh
# (1, 2, 4)), their blocked device threads starve the pool, and XLA aborts the process after
# the collective timeout. 16 threads let every device of both collectives arrive.
THREADS = "16"


def with_devices(count: int) -> str:
    """The flags of a process a test starts with `count` fake CPU devices."""
    return f"{fake_devices(count)} {FAST_COMPILE}"


def as_a_user_runs() -> dict[str, str]:
    """This process's environment without the session's fake devices, compile settings and
    thread count: one CPU device, the default compile and a thread per core, as `jaxrubric
    train` runs for a user (the toy worlds' processes). (16 threads on 2 cores made a toy
    world's supervised step 25% slower, and its rounding another draw.)"""
    flags = os.environ.get("XLA_FLAGS", "")
    for flag in (FAKE_DEVICES, *FAST_COMPILE.split()):
        flags = flags.replace(flag, "")
    env = {**os.environ, "XLA_FLAGS": " ".join(flags.split())}
    if env.get("NPROC") == THREADS:
        del env["NPROC"]
    return env
