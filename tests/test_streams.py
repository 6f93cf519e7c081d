"""Pieces streamed on the backend's event loop reach the caller's sink in order; errors on
either side stop both; each backend gets its transport."""

from __future__ import annotations

import asyncio
import time

import fsspec
import pytest
from fsspec.asyn import get_loop

from fsspec_shards.storage.backends.versions import Version
from fsspec_shards.storage.transfer.streams import (
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


def test_a_failing_sink_stops_the_producer():
    state: dict = {}
    pieces = [b"x"] * 100

    def sink(data: bytes) -> None:
        raise OSError(28, "no space left on device")

    with pytest.raises(OSError, match="no space"):
        _pipelined(get_loop(), _producer(pieces, state=state), sink)
    deadline = time.monotonic() + 10
    while "cancelled" not in state and time.monotonic() < deadline:
        time.sleep(0.01)
    assert state.get("cancelled")


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
