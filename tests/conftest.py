"""Every test sees 8 fake CPU devices, so sharding is exercised without accelerators, and
XLA:CPU's cheapest compile (`xla_flags.py`).

The flags must be set before jax is imported anywhere, hence at the top of conftest.
"""

import os
import tempfile

from xla_flags import COLLECTIVE_TIMEOUT, FAKE_DEVICES, FAST_COMPILE, THREADS  # jax-free

os.environ["XLA_FLAGS"] = " ".join(
    [os.environ.get("XLA_FLAGS", ""), FAKE_DEVICES, COLLECTIVE_TIMEOUT, FAST_COMPILE]).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("NPROC", THREADS)  # xla_flags.THREADS: why
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# `datasets` caches what it reads; keep test runs from filling the user's cache.
os.environ.setdefault("HF_DATASETS_CACHE", os.path.join(tempfile.gettempdir(), "jaxrubric-test-datasets"))

import jax  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")
# No persistent compilation cache here: with one per xdist worker, a worker crashed with a fatal
# signal on CI inside a jitted call; XLA:CPU executable (de)serialisation is the one thing
# that run added, and it saved only ~30 s of the suite.

import pytest  # noqa: E402

from jaxrubric import sharding as shd  # noqa: E402


# The two longest tests (the toy worlds).
WORLD_TESTS = ("tests/toy/test_genrubric_toy.py::test_the_world",
               "tests/toy/test_toy_world.py::test_toy_world")


def pytest_configure(config):
    """`-n N` runs under xdist's work-stealing scheduler (`--dist load`, its default, is taken
    for it), for which `pytest_collection_modifyitems` orders the tests."""
    if getattr(config.option, "dist", None) == "load":
        config.option.dist = "worksteal"


def pytest_collection_modifyitems(config, items):
    """Orders the run for `-n 2` under work stealing (`pytest_configure`): each worker is handed
    half of the list and idle workers steal from the tail of the other's queue. So each half
    starts with its share of the slow tests, a toy world at or near the head of each, and ends
    with fast tests that can be stolen. (xdist's default scheduler hands out consecutive chunks:
    with the slow tests simply put first, one worker ran both worlds and most slow tests in
    series, 2311 s for 3515 s of tests.)"""
    slow = sorted((i for i in items if i.get_closest_marker("slow")),
                  key=lambda item: not item.nodeid.startswith(WORLD_TESTS))
    fast = [i for i in items if not i.get_closest_marker("slow")]
    first, second = slow[0::2], slow[1::2]
    cut = max(0, len(items) // 2 - len(first))
    items[:] = first + fast[:cut] + second + fast[cut:]


@pytest.fixture(scope="session")
def round_mesh():
    """The mesh of the round tests (tests/helpers.py, `round_case`): 2-way data parallel and
    4-way tensor parallel over the 8 fake devices."""
    return shd.make_mesh({"data": 2, "fsdp": 1, "tensor": 4})


@pytest.fixture(scope="module")
def datasets_cache(tmp_path_factory):
    """Keeps the Arrow caches `datasets` writes for a module's temporary files out of
    ~/.cache (use with `pytestmark = pytest.mark.usefixtures("datasets_cache")`)."""
    import datasets

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path_factory.mktemp("hf_cache"))
        yield


# A DynamicRubric workdir written before the round's per-role settings became records (one
# tiny LoRA round, tests/data/README.md), its repository paths saved as `@ROOT@`.
SAVED_V1_WORKDIR = "dynamic_rubric_workdir_v1"


@pytest.fixture
def saved_v1_workdir(tmp_path):
    """A copy of that workdir with its paths pointing into this repository."""
    import shutil
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    workdir = tmp_path / "v1_workdir"
    shutil.copytree(root / "tests" / "data" / SAVED_V1_WORKDIR, workdir)
    for path in (workdir / "config.json", workdir / "checkpoints" / "1" / "meta" / "metadata"):
        path.write_text(path.read_text().replace("@ROOT@", str(root)))
    return workdir
