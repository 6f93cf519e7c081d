"""The dask executor: per-shard work in batches on the workers of a cluster."""

from __future__ import annotations

import pytest

from fsspec_shards.fleet.dask_executor import DaskExecutor, _local_workers, dask_executor
from fsspec_shards.fleet.errors import InputError

distributed = pytest.importorskip("distributed")


def square(n: int) -> int:
    return n * n


def test_scheduler_text_that_names_no_cluster_is_an_input_error():
    assert _local_workers("local:3") == 3
    for text in ("local:0", "local:x", "local:"):
        with pytest.raises(InputError, match="local:N"):
            _local_workers(text)


def test_an_unreachable_scheduler_is_an_input_error_naming_it():
    with pytest.raises(InputError, match="cannot reach dask scheduler 'nowhere://x'"):
        with dask_executor("nowhere://x"):
            pass


def test_every_item_yields_one_result_in_batches_on_an_in_process_cluster():
    with distributed.LocalCluster(
        n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None
    ) as cluster, distributed.Client(cluster) as client:  # fmt: skip
        executor = DaskExecutor(client, batch_size=3)
        assert sorted(executor.map(square, list(range(10)))) == [n * n for n in range(10)]
        assert executor.on_each_host(lambda: "here") == ["here"]
        assert DaskExecutor(client)._batch_size(1000) == 64, "at most MAX_BATCH per task"
