"""Ranges in flight (storage/transfer/ranges.py): the threads a fill starts, the layout of
its ranges and how one is split for a stream without one.

Ranges in flight against real servers and faults are in tests/integration/test_faults.py
and test_versions.py.
"""

from __future__ import annotations

import os
import random
import threading
import uuid

from fsspec_shards.storage.backends import object_id
from fsspec_shards.storage.core.retry import RetryPolicy
from fsspec_shards.storage.transfer import range_plan, ranges
from fsspec_shards.storage.transfer.one_stream import preallocate
from fsspec_shards.storage.transfer.ranges import fill_ranges
from fsspec_shards.storage.transfer.target import Target
from tests.planned_faults import PlannedFaultFileSystem

DATA = random.Random(5).randbytes(3 * 1024 * 1024 + 17)


def test_a_huge_fixed_number_of_ranges_starts_no_more_threads_than_can_run(tmp_path, monkeypatch):
    # beyond the process's bound no range can get a slot: a thread each is only a cost
    # (ranges_in_flight=10**6 started a million threads)
    monkeypatch.setattr(range_plan, "_slots_taken", 0)
    started: list[str] = []

    class Counted(threading.Thread):
        def start(self) -> None:
            started.append(self.name)
            super().start()

    monkeypatch.setattr(ranges.threading, "Thread", Counted)
    fs = PlannedFaultFileSystem()
    path = f"/fill-{uuid.uuid4().hex}/shard.tar"
    data = DATA[: 256 * 1024]
    fs.pipe_file(path, data)
    policy = RetryPolicy(attempts=2, backoff=0.001, max_backoff=0.002, deadline=300.0, timeout=30.0)
    target = Target(fs, path, object_id(fs, path), policy, ranges_in_flight=2000)
    expect = target.expect(target.stat()).version
    with open(tmp_path / "filled", "w+b") as out:
        preallocate(out.fileno(), len(data))
        fill_ranges(target, out.fileno(), expect, None, lambda amount: None)
        assert os.pread(out.fileno(), len(data), 0) == data
    range_threads = [name for name in started if name.startswith("fsspec-shards-range-")]
    assert len(range_threads) <= range_plan.PROCESS_MAX + 1, len(range_threads)


def test_the_frontier_of_many_ranges_costs_the_same_at_any_point_of_the_fill():
    # each write walked every range already whole: 0.56 s of CPU per GB under the layout's
    # lock with 2 MiB ranges of 64 KiB pieces, growing with the square of the range count
    import time

    from fsspec_shards.storage.transfer.range_plan import Ramp
    from fsspec_shards.storage.transfer.ranges import _Layout, _Range

    spans, pieces, piece = 4096, 4, 1024
    span = pieces * piece
    layout = _Layout(spans * span, Ramp(8, "test:frontier"))
    layout.ranges = [_Range(n * span, (n + 1) * span, False) for n in range(spans)]
    layout.cursor = spans * span
    started = time.process_time()
    for taken in layout.ranges:
        for _ in range(pieces):
            at, length = layout.claim(taken, piece)
            layout.wrote(taken, length)
    took = time.process_time() - started
    assert layout.frontier.value == spans * pieces * piece
    assert layout.finished.is_set()
    assert took < 1.5, f"{took:.2f}s of CPU for {spans * pieces} writes"


def test_a_stream_without_a_range_takes_the_second_half_of_the_widest_one(monkeypatch):
    from fsspec_shards.storage.transfer.range_plan import Ramp
    from fsspec_shards.storage.transfer.ranges import _Layout

    MiB = 2**20
    monkeypatch.setattr(range_plan, "_learned", {"test:split": (2, 0)})
    layout = _Layout(64 * MiB, Ramp("auto", "test:split"))  # settled at 2: no first range
    first, second = layout.take(), layout.take()
    assert (first.start, first.end, second.start, second.end) == (0, 32 * MiB, 32 * MiB, 64 * MiB)
    at, length = layout.claim(first, 8 * MiB)
    layout.wrote(first, length)
    third = layout.take()  # all handed out: the range with the most bytes left is split
    assert (second.end, third.start, third.end) == (48 * MiB, 48 * MiB, 64 * MiB)
    fourth = layout.take()
    assert (first.end, fourth.start, fourth.end) == (20 * MiB, 20 * MiB, 32 * MiB)
    at, length = layout.claim(first, 16 * MiB)  # its request runs on: cut at the new end
    assert (at, length) == (8 * MiB, 12 * MiB)
    assert [r.start for r in layout.ranges] == [0, 20 * MiB, 32 * MiB, 48 * MiB]
