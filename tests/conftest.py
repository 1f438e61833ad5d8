"""Every test sees 8 fake CPU devices, so sharding is exercised without accelerators.

The flag must be set before jax is imported anywhere, hence at the top of conftest.
"""

import os
import tempfile

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# XLA:CPU sizes its thread pool from NPROC; on 2 cores, a round on a tensor-parallel mesh can
# run out of threads when two collectives wait on each other (seen with mesh (1, 2, 4)).
os.environ.setdefault("NPROC", "16")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# `datasets` caches what it reads; keep test runs from filling the user's cache.
os.environ.setdefault("HF_DATASETS_CACHE", os.path.join(tempfile.gettempdir(), "jaxrubric-test-datasets"))

import jax  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")
# Tests that train through the CLI compile the same round in every `main()` call (a resumed run
# is a new process in real use): a persistent cache, one per xdist worker, compiles it once.
_CACHE = os.path.join(tempfile.gettempdir(), "jaxrubric-test-jit-cache",
                      os.environ.get("PYTEST_XDIST_WORKER", "main"))
jax.config.update("jax_compilation_cache_dir", _CACHE)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
