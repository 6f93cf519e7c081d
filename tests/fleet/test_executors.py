"""The thread executor that runs per-shard work."""

from __future__ import annotations

import pytest

from fsspec_shards.fleet.executors import ThreadExecutor


def test_thread_executor_yields_every_result_and_raises_what_the_work_raises():
    executor = ThreadExecutor(3)
    assert sorted(executor.map(lambda n: n * n, list(range(10)))) == [n * n for n in range(10)]
    assert executor.on_each_host(lambda: "here") == ["here"]

    def work(n: int) -> int:
        if n == 4:
            raise TypeError("unexpected")
        return n

    with pytest.raises(TypeError, match="unexpected"):
        list(executor.map(work, list(range(8))))
