"""The one loop that moves a byte range (storage/transfer/target.py): after a cut it asks again from
the byte reached; chunked reads through a transport that does not stream grow and shrink
(ChunkSizer); the stall rule ends a request slower than ``min_rate`` over ``rate_window``
and lets only a request at that rate start a new failure chain.

The source is a real local file: read by fsspec's ``file`` backend through the cat_file
transport, or handed over piece by piece by :class:`_Pieces` (a streaming transport that
follows a plan of cuts and pauses, as a server would). Against real HTTP servers:
tests/integration/test_trickling.py, test_ranges_in_flight.py.
"""

from __future__ import annotations

import dataclasses
import os
import random
import threading
import time

import fsspec
import pytest

from fsspec_shards.storage.backends import object_id
from fsspec_shards.storage.backends.versions import Facts, Version, VersionMismatch
from fsspec_shards.storage.core.retry import RetriesExhaustedError, RetryPolicy
from fsspec_shards.storage.transfer.streams import CatFileTransport
from fsspec_shards.storage.transfer.target import ChunkSizer, FillRate, Target, TooSlow, resume
from tests.faults import Cut, Short
from tests.planned_faults import PlannedFaultFileSystem

KiB = 1024
DATA = random.Random(5).randbytes(400 * KiB)
FAST = RetryPolicy(attempts=3, backoff=0.001, max_backoff=0.002, deadline=300.0, timeout=30.0)


@dataclasses.dataclass(frozen=True)
class Paced:
    """Hand over ``piece`` bytes at a time, ``pause`` seconds apart."""

    piece: int
    pause: float


@dataclasses.dataclass(frozen=True)
class Late:
    """Wait ``seconds`` before the first byte, then hand everything over at once."""

    seconds: float


class _Pieces:
    """A streaming transport over a local file: each request takes the next action of
    ``plan`` (then serves normally) and hands its bytes over in pieces."""

    streaming = True

    def __init__(self, plan: list) -> None:
        self.plan = list(plan)
        self.requests: list[tuple[int, int | None, int]] = []  # (start, end, bytes offered)

    def stream(self, path, start, end, sink, timeout, rest_of_body=False, expect=None) -> Facts:
        action = self.plan.pop(0) if self.plan else None
        with open(path, "rb") as file:
            body = os.pread(file.fileno(), (end or len(DATA)) - start, start)
        limit = len(body)
        if isinstance(action, Cut | Short):
            limit = action.after_bytes if isinstance(action, Cut) else action.length
        piece = action.piece if isinstance(action, Paced) else 64 * KiB
        handed = 0
        if isinstance(action, Late):
            time.sleep(action.seconds)
        try:
            while handed < limit:
                if handed and isinstance(action, Paced):
                    time.sleep(action.pause)
                data = body[handed : min(limit, handed + piece)]
                handed += len(data)
                sink(data)
        finally:
            self.requests.append((start, end, handed))
        if isinstance(action, Cut):
            raise ConnectionResetError("connection reset by peer")
        return Facts(status=206, start=start)


@pytest.fixture
def path(tmp_path) -> str:
    file = tmp_path / "shard.bin"
    file.write_bytes(DATA)
    return str(file)


def _target(path: str, transport, policy: RetryPolicy = FAST, **rates) -> Target:
    fs = fsspec.filesystem("file")
    return Target(fs, path, object_id(fs, path), policy, transport=transport, **rates)


def _moved(target: Target, start: int = 0, end: int | None = len(DATA), **options):
    received: list[bytes] = []
    moved = resume(target, start, end, received.append, Version(size=len(DATA)), **options)
    return moved, received


def test_after_a_cut_the_range_is_asked_again_from_the_byte_reached(path):
    transport = _Pieces([Cut(100 * KiB), Short(30 * KiB), Cut(1)])
    moved, received = _moved(_target(path, transport), 10, 300 * KiB)
    assert b"".join(received) == DATA[10 : 300 * KiB]
    starts = [start for start, _, _ in transport.requests]
    assert starts == [10, 10 + 100 * KiB, 10 + 130 * KiB, 10 + 130 * KiB + 1]
    assert (moved.position, moved.requests) == (300 * KiB, 4)


def test_a_request_that_moved_before_its_cut_starts_a_new_failure_chain(path):
    transport = _Pieces([Cut(20 * KiB)] * 6)  # twice the attempts, each moving forward
    moved, received = _moved(_target(path, transport, min_rate=0))
    assert b"".join(received) == DATA and moved.requests == 7


def test_a_request_moving_below_min_rate_before_its_cut_spends_the_chain(path):
    transport = _Pieces([Cut(20 * KiB)] * 6)  # the same, held to a floor none reaches
    with pytest.raises(RetriesExhaustedError, match="after 3 attempts"):
        _moved(_target(path, transport, min_rate=1e15))
    assert len(transport.requests) == 3


def test_a_request_slower_than_min_rate_over_the_window_is_ended_as_stalled(path):
    transport = _Pieces([Paced(1000, 0.02)] * 3)
    target = _target(path, transport, min_rate=1e12, rate_window=0.01)
    with pytest.raises(RetriesExhaustedError, match="below the minimum rate") as raised:
        _moved(target)
    assert isinstance(raised.value.__cause__, TooSlow)
    offered = [handed for _, _, handed in transport.requests]
    assert len(offered) == 3 and max(offered) <= 2000  # each ended a window in, mid-body


class _OtherStream:
    """Another running request of the same fill, moving ``rate`` bytes per second."""

    def __init__(self, fill: FillRate, rate: float) -> None:
        self.fill, self.rate = fill, rate
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        self.fill.started()
        last = time.monotonic()
        try:
            while not self.done.wait(0.005):  # bytes by elapsed time: load does not matter
                now = time.monotonic()
                self.fill.passed(int(self.rate * (now - last)))
                last = now
        finally:
            self.fill.ended()

    def __enter__(self) -> _OtherStream:
        self.thread.start()
        time.sleep(0.02)
        return self

    def __exit__(self, *exc_info) -> None:
        self.done.set()
        self.thread.join()


def test_a_slow_stream_is_not_ended_while_its_fill_as_a_whole_moves_min_rate(path):
    fill = FillRate()
    transport = _Pieces([Paced(20 * KiB, 0.02)])  # 1 MB/s, below its share of 100 MB/s
    target = _target(path, transport, min_rate=100e6, rate_window=0.3, fill=fill)
    with _OtherStream(fill, 1e9):  # the fill carries the floor
        moved, received = _moved(target)
    assert b"".join(received) == DATA and moved.requests == 1


def test_a_stream_below_its_share_while_the_fill_is_below_min_rate_is_ended(path):
    fill = FillRate()
    transport = _Pieces([Paced(1000, 0.02)] * 3)  # 50 kB/s, below its share of 1 MB/s
    target = _target(path, transport, min_rate=2e6, rate_window=0.05, fill=fill)
    with _OtherStream(fill, 0), pytest.raises(RetriesExhaustedError, match="floor"):
        _moved(target)


def test_a_stream_left_alone_must_move_min_rate_itself(path):
    # issue 28 (4): the others ended, so the slow one's floor is min_rate, not its share
    fill = FillRate()
    with _OtherStream(fill, 1e9):
        pass  # it ran and ended: this stream is alone
    transport = _Pieces([Paced(1000, 0.02)] * 3)
    target = _target(path, transport, min_rate=100e3, rate_window=0.05, fill=fill)
    with pytest.raises(RetriesExhaustedError, match="below the minimum rate"):
        _moved(target)
    assert fill.streams == 0


def test_the_wait_for_the_first_byte_is_the_time_outs_not_the_rate_rules(path):
    """A server slow to start (within ``timeout``) and fast after is not ended as slow."""
    transport = _Pieces([Late(0.2)])
    moved, received = _moved(_target(path, transport, min_rate=1e6, rate_window=0.05))
    assert b"".join(received) == DATA and moved.requests == 1


def test_a_request_at_min_rate_or_better_goes_on_however_long_it_takes(path):
    transport = _Pieces([Paced(80 * KiB, 0.02)])  # 5 pieces, 4 MB/s
    moved, received = _moved(_target(path, transport, min_rate=1000, rate_window=0.01))
    assert b"".join(received) == DATA and moved.requests == 1


def test_a_transport_that_does_not_stream_is_asked_for_chunks_that_grow(path):
    chunks = ChunkSizer(size=64 * KiB, minimum=16 * KiB, maximum=128 * KiB)
    target = _target(path, CatFileTransport(fsspec.filesystem("file")))
    moved, received = _moved(target, chunks=chunks)
    assert [len(piece) for piece in received] == [64 * KiB, 128 * KiB, 128 * KiB, 80 * KiB]
    assert b"".join(received) == DATA and moved.requests == 4


def test_a_chunk_that_failed_with_nothing_delivered_is_asked_for_at_half_the_size():
    fs = PlannedFaultFileSystem([None, ConnectionResetError("cut")])
    fs.pipe_file("/chunks/shard.bin", DATA)
    target = Target(fs, "/chunks/shard.bin", object_id(fs, "/chunks/shard.bin"), FAST)
    chunks = ChunkSizer(size=64 * KiB, minimum=16 * KiB, maximum=256 * KiB)
    moved, received = _moved(target, chunks=chunks)
    assert b"".join(received) == DATA
    asked = [end - start for start, end, _ in fs.reads]
    assert asked[:4] == [64 * KiB, 128 * KiB, 64 * KiB, 64 * KiB]  # the ceiling came down
    assert chunks.size == 64 * KiB


def test_a_streaming_transport_is_asked_for_the_whole_rest_in_one_request(path):
    transport = _Pieces([])
    moved, _ = _moved(_target(path, transport), chunks=ChunkSizer(size=16 * KiB, minimum=1))
    assert transport.requests == [(0, len(DATA), len(DATA))] and moved.requests == 1


def test_another_version_and_the_sinks_own_errors_are_raised_as_they_come(path):
    class Replaced(_Pieces):
        def stream(self, path, start, *args, **kwargs) -> Facts:
            self.requests.append((start, None, 0))
            raise VersionMismatch("the ETag changed")

    transport = Replaced([])
    with pytest.raises(VersionMismatch):
        _moved(_target(path, transport))
    assert len(transport.requests) == 1  # not retried

    class Full(Exception):
        pass

    def full(data: bytes) -> None:
        raise Full

    transport = _Pieces([])
    with pytest.raises(Full):
        resume(_target(path, transport), 0, None, full, Version(), passthrough=(Full,))
    assert len(transport.requests) == 1


def test_a_stat_on_a_thread_gives_the_info_or_raises_what_the_stat_raises(path, tmp_path):
    target = _target(path, CatFileTransport(fsspec.filesystem("file")))
    info = target.stat_on_a_thread()
    assert info.result(30)["size"] == len(DATA)
    missing = _target(str(tmp_path / "missing.bin"), target.transport).stat_on_a_thread()
    assert isinstance(missing.exception(30), FileNotFoundError)
    directory = _target(str(tmp_path), target.transport).stat_on_a_thread()
    assert isinstance(directory.exception(30), IsADirectoryError)
