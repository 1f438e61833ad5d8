"""Per-host batch assembly: which rows a process loads, and the global arrays built from them."""

import numpy as np

from jaxrubric import sharding as shd


def test_one_process_loads_every_row_and_builds_the_global_batch():
    mesh = shd.make_mesh({"data": 2, "fsdp": 4})
    assert shd.local_rows(mesh, 16) == list(range(16))
    host = {"tokens": np.arange(16 * 3).reshape(16, 3), "lengths": np.arange(16)}
    rows = shd.local_rows(mesh, 16)
    batch = shd.global_batch(mesh, {k: v[rows] for k, v in host.items()}, rows, 16)
    for name, value in host.items():
        np.testing.assert_array_equal(np.asarray(batch[name]), value)
        assert batch[name].sharding == shd.batch_sharding(mesh, value.ndim)
    # each device holds its own 2 rows of the 8-way split batch
    shard = batch["tokens"].addressable_shards[3]
    np.testing.assert_array_equal(np.asarray(shard.data), host["tokens"][shard.index])
    assert shard.data.shape == (2, 3)


def test_rows_of_a_mesh_without_batch_axes_are_replicated():
    mesh = shd.make_mesh({"tensor": 8})
    rows = shd.local_rows(mesh, 4)
    batch = shd.global_batch(mesh, {"x": np.arange(4)}, rows, 4)
    assert rows == [0, 1, 2, 3] and batch["x"].sharding.is_fully_replicated
