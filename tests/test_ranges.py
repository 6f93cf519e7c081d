"""Hashing off the receiving thread and early writeback (storage/transfer/ranges.py).

Ranges in flight against real servers and faults are in tests/integration/test_faults.py
and test_versions.py.
"""

from __future__ import annotations

import hashlib
import io
import itertools
import os
import random
import threading
import uuid

import pytest

from fsspec_shards.storage.backends import object_id
from fsspec_shards.storage.core.retry import RetryPolicy
from fsspec_shards.storage.transfer import range_plan, ranges
from fsspec_shards.storage.transfer.ranges import (
    Frontier,
    Gathered,
    OrderedHasher,
    Writeback,
    fill_ranges,
    preallocate,
)
from fsspec_shards.storage.transfer.target import Target
from tests.planned_faults import PlannedFaultFileSystem

DATA = random.Random(5).randbytes(3 * 1024 * 1024 + 17)


@pytest.mark.parametrize("threaded", [True, False])
def test_the_hash_covers_pieces_and_file_ranges_in_the_order_handed_over(tmp_path, threaded):
    path = tmp_path / "object"
    path.write_bytes(DATA)
    descriptor = os.open(path, os.O_RDONLY)
    try:
        hasher = OrderedHasher(("sha256", "md5"), threaded=threaded)
        hasher.update(DATA[:1000])
        hasher.update(DATA[1000:5000])
        written = Frontier(5000)
        hasher.update_from_file(descriptor, 5000, len(DATA), written)
        for step in (10_000, 2_000_000, len(DATA)):  # the file fills: hashed as far as written
            written.advance(step)
        sha, md5 = hasher.checksums()  # every algorithm on the one pass
        assert sha.hexdigest == hashlib.sha256(DATA).hexdigest()
        assert md5.hexdigest == hashlib.md5(DATA).hexdigest()
    finally:
        os.close(descriptor)


def test_a_range_that_never_arrives_does_not_keep_an_abandoned_hasher_waiting(tmp_path):
    hasher = OrderedHasher(("sha256",))
    hasher.update(b"x" * 100)
    hasher.update_from_file(0, 0, 10, Frontier(0))  # its range fails: never written
    hasher.abandon()
    hasher._thread.join(timeout=5)
    assert not hasher._thread.is_alive()


def test_a_failed_read_back_is_raised_by_checksum_and_later_pieces_do_not_block(tmp_path):
    path = tmp_path / "short"
    path.write_bytes(b"only ten b")
    descriptor = os.open(path, os.O_RDONLY)
    try:
        hasher = OrderedHasher(("md5",))
        written = Frontier(0)
        written.advance(100)
        hasher.update_from_file(descriptor, 0, 100, written)
        for _ in range(200):
            hasher.update(b"y" * 100)
        with pytest.raises(OSError, match="ends at byte 10, expected 100"):
            hasher.checksums()
    finally:
        os.close(descriptor)


def test_writeback_is_started_behind_the_writer_and_only_for_files_on_disk(tmp_path):
    assert Writeback.of(io.BytesIO()) is None
    with open(tmp_path / "filled", "wb") as out:
        writeback = Writeback.of(out)
        if writeback is None:
            pytest.skip("no sync_file_range on this system")
        for written in range(1, 21):
            out.write(DATA[: 1024 * 1024])
            writeback.written(written * 1024 * 1024)
        assert writeback.started == 16 * 1024 * 1024  # every 8 MiB
    assert (tmp_path / "filled").stat().st_size == 20 * 1024 * 1024


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


def test_a_frontier_wakes_its_waiter_when_the_position_it_waits_for_is_reached():
    written = Frontier(0)
    woken: list[int] = []
    waiter = threading.Thread(target=lambda: woken.append(written.wait_for(1000, 30)))
    waiter.start()
    written.advance(10)  # short of it: still waiting
    waiter.join(0.2)
    assert waiter.is_alive() and not woken
    written.advance(1000)
    waiter.join(10)
    assert woken == [1000]
    assert written.wait_for(5, 30) == 1000  # already there: at once


def test_received_pieces_are_written_in_large_writes_that_end_on_aligned_boundaries():
    # pieces of any size, as a socket hands them over, become writes ending on multiples
    # of _WRITE_BYTES in the file (a file written piece by piece at unaligned
    # sizes reads back ~20% slower on every cache hit); every byte lands where it belongs
    writes: list[tuple[int, bytes]] = []
    gathered = Gathered(lambda at, view: writes.append((at, bytes(view))))
    rng = random.Random(31)
    data = rng.randbytes(3 * ranges._WRITE_BYTES + 12345)
    start = position = 777
    while position - start < len(data):
        size = rng.randint(1, 200_000)
        gathered.add(position, data[position - start : position - start + size])
        position += min(size, len(data) - (position - start))
    gathered.flush()
    assert b"".join(piece for _, piece in writes) == data
    assert [at for at, _ in writes] == list(
        itertools.accumulate([start] + [len(piece) for _, piece in writes[:-1]])
    )
    assert len(writes) <= 5
    assert all((at + len(piece)) % ranges._WRITE_BYTES == 0 for at, piece in writes[:-1])
    assert all(len(piece) == ranges._WRITE_BYTES for _, piece in writes[1:-1])
