"""One stream (``transfer/one_stream.py``): ranged reads and one-request fills resumed from
the byte reached; the writer every fill writes through (hashing off the receiving thread,
gathered writes, early writeback). The passes around them: tests/test_planner.py."""

from __future__ import annotations

import hashlib
import io
import itertools
import os
import random
import threading

import pytest

from fsspec_shards.storage.transfer import one_stream
from fsspec_shards.storage.transfer.one_stream import (
    Frontier,
    Gathered,
    OrderedHasher,
    Writeback,
    fill_one_stream,
    read_range,
)
from tests.faults import Short
from tests.test_planner import _setup, _target


def test_ranged_read_continues_after_a_short_read():
    fs, path, data, _, count = _setup(plan=[Short(10), ConnectionResetError("cut")])
    target = _target(fs, path, count)
    got = read_range(target, 100, 5000, target.expect(fs.info(path)).version)
    assert got == data[100:5000]
    assert [start for start, _, _ in fs.reads] == [100, 110, 110]


def test_one_stream_asks_once_to_the_end_and_after_a_cut_from_the_byte_reached():
    fs, path, data, _, count = _setup(plan=[Short(1000)])
    target = _target(fs, path, count)
    out = io.BytesIO()
    received = []
    written = fill_one_stream(
        target, out, target.expect(fs.info(path)).version, None, None, received.append
    )
    assert written == len(data) and out.getvalue() == data and sum(received) == len(data)
    assert [(start, end) for start, end, _ in fs.reads] == [(0, len(data)), (1000, len(data))]


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
    data = rng.randbytes(3 * one_stream._WRITE_BYTES + 12345)
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
    assert all((at + len(piece)) % one_stream._WRITE_BYTES == 0 for at, piece in writes[:-1])
    assert all(len(piece) == one_stream._WRITE_BYTES for _, piece in writes[1:-1])


def test_no_gathered_write_is_as_large_as_a_huge_page():
    # a write of a whole aligned 2 MiB stretch makes the kernel allocate a huge-page-sized
    # page-cache folio, at 6-18x the CPU per byte of 1 MiB writes (issue 29, far store):
    # pieces of any size, even one that covers several aligned stretches, are written in
    # pieces below 2 MiB, each ending on a 1 MiB boundary (but the last)
    huge_page = 2 * 1024 * 1024
    writes: list[tuple[int, int]] = []
    gathered = Gathered(lambda at, view: writes.append((at, len(view))))
    start = 4096 + 17
    sizes = [3 * huge_page + 5, 100_000, 2 * huge_page, 70_000, huge_page + 1]
    position = start
    for size in sizes:
        gathered.add(position, bytes(size))
        position += size
    gathered.flush()
    assert sum(length for _, length in writes) == position - start
    assert max(length for _, length in writes) < huge_page
    assert all((at + length) % (huge_page // 2) == 0 for at, length in writes[:-1])
    assert len(writes) <= -(-(position - start) // (huge_page // 2)) + 1
