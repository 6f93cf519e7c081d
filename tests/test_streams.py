"""Pieces streamed on the backend's event loop reach the caller's sink in order; errors on
either side stop both; each backend gets its transport."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import fsspec
import pytest
from fsspec.asyn import get_loop

from fsspec_shards.storage.backends.versions import Version
from fsspec_shards.storage.transfer.streams import (
    PIECE,
    CatFileTransport,
    LoopTransport,
    _pipelined,
    _RangeWindow,
    transport_for,
)


def _producer(pieces: list[bytes], fail_after: int | None = None, state: dict | None = None):
    async def produce(emit):
        try:
            for index, piece in enumerate(pieces):
                if fail_after is not None and index == fail_after:
                    raise ConnectionResetError("cut")
                await emit(piece)
                await asyncio.sleep(0)
        except asyncio.CancelledError:
            if state is not None:
                state["cancelled"] = True
            raise

    return produce


def test_pieces_arrive_in_order_in_the_calling_thread():
    received: list[bytes] = []
    pieces = [bytes([i]) * 1000 for i in range(50)]
    _pipelined(get_loop(), _producer(pieces), received.append)
    assert received == pieces


def test_a_cut_after_some_pieces_raises_after_handing_them_over():
    received: list[bytes] = []
    with pytest.raises(ConnectionResetError):
        _pipelined(get_loop(), _producer([b"a", b"b", b"c"], fail_after=2), received.append)
    assert received == [b"a", b"b"]


def test_a_failing_sink_stops_the_producer_before_it_raises():
    state: dict = {}
    pieces = [bytes(PIECE)] * 100  # more than the bytes held in flight

    def sink(data: bytes) -> None:
        raise OSError(28, "no space left on device")

    with pytest.raises(OSError, match="no space"):
        _pipelined(get_loop(), _producer(pieces, state=state), sink)
    assert state.get("cancelled")  # ended, not only asked to


def _swallowing_producer(state: dict):
    """Swallows a cancellation as ``asyncio.wait_for`` does before Python 3.12 when the read
    it waited for completed at that moment, and goes on emitting."""

    async def produce(emit):
        try:
            for _ in range(100):
                try:
                    await emit(bytes(PIECE))
                except asyncio.CancelledError:
                    state["swallowed"] = state.get("swallowed", 0) + 1
        finally:
            state["ended"] = True

    return produce


def _stalled_producer(state: dict):
    """One piece, then a read that never completes (a stalled server)."""

    async def produce(emit):
        try:
            await emit(b"first")
            await asyncio.Event().wait()
        finally:
            state["ended"] = True

    return produce


def _stop_at_once(data: bytes) -> None:
    raise OSError(28, "no space left on device")


@pytest.mark.parametrize("producer", [_swallowing_producer, _stalled_producer])
def test_a_stopped_consumer_leaves_no_producer_running(producer):
    state: dict = {}
    with pytest.raises(OSError, match="no space"):
        _pipelined(get_loop(), producer(state), _stop_at_once)
    assert state.get("ended")


_NO_TASK_LEFT_PENDING = """
import gc, logging
from fsspec.asyn import get_loop
import tests.test_streams as t
from fsspec_shards.storage.transfer.streams import _pipelined

logging.basicConfig()
for producer in (t._swallowing_producer, t._stalled_producer):
    for _ in range(20):
        try:
            _pipelined(get_loop(), producer({}), t._stop_at_once)
        except OSError:
            pass
gc.collect()
print("done")
"""


def test_a_stopped_consumer_leaves_no_task_pending_for_the_garbage_collector():
    """A task left waiting (on room, on a read) is destroyed pending at the next collection:
    asyncio then writes "Task was destroyed but it is pending!" to the user's stderr."""
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run(
        [sys.executable, "-c", _NO_TASK_LEFT_PENDING],
        capture_output=True,
        text=True,
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "done"
    assert "Task was destroyed" not in done.stderr
    assert "asyncio" not in done.stderr, done.stderr


def test_range_window_slices_a_whole_body_sent_for_a_range():
    window = _RangeWindow(start=5, end=12, offset=0)  # the server ignored the Range
    taken = [window.take(b"0123"), window.take(b"456789"), window.take(b"abcdef")]
    assert b"".join(taken) == b"56789ab" and window.done


def test_backends_without_a_streaming_transport_read_through_cat_file_and_say_nothing():
    memory = fsspec.filesystem("memory")
    memory.pipe_file("/streams/object.bin", bytes(range(100)))
    transport = transport_for(memory)
    assert isinstance(transport, CatFileTransport)
    received: list[bytes] = []
    version = Version(100, '"etag"')
    facts = transport.stream("/streams/object.bin", 90, None, received.append, 5.0, False, version)
    assert b"".join(received) == bytes(range(90, 100))
    assert (facts.etag, facts.total) == (None, None)
    assert version.unconfirmed == 1  # the caller checks the version through info() instead


def test_network_backends_get_their_own_streaming_transport():
    transport = transport_for(fsspec.filesystem("http", skip_instance_cache=True))
    assert isinstance(transport, LoopTransport)
    assert type(transport.backend).__name__ == "HttpBackend"
