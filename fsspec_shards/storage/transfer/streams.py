"""Ranged reads that hand bytes over as they arrive, checked against the version expected.

A *transport* reads one range of one object for the download loop (``target.resume``)::

    facts = transport.stream(path, start, end, sink, timeout, rest_of_body, expect)

- ``start``/``end``: bytes ``[start, end)``; ``end=None`` reads to the object's end.
- ``sink(bytes)`` receives the body in order, in the caller's thread, as it arrives (the
  network read overlaps with the caller's hashing and writing). When the connection breaks,
  what was passed on counts and the caller resumes from there.
- ``timeout``: the longest any wait for the server may take (headers, each body piece); a
  stall raises ``TimeoutError`` while a slow but moving transfer goes on.
- ``rest_of_body``: a server that ignored the Range sends the whole object; pass everything
  from ``start`` on, past ``end`` (a whole-object download then takes one request).
- ``expect``: the ``versions.Version`` the response must be of. Where the backend can, it
  is asked for conditionally (S3 ``VersionId``/``IfMatch``, GCS ``ifGenerationMatch``,
  Azure ``If-Match``, HTTP ``If-Match`` on a strong ETag); a refusal (412) raises
  ``versions.VersionMismatch``. Whatever the backend, before a byte reaches the sink the
  response is checked by ``versions.check_response``: a 206 whose Content-Range does not
  start at ``start`` is a retryable ``TransientError``; a size, ETag, version or (without
  those) Last-Modified differing from ``expect`` is a ``VersionMismatch``. What ``expect``
  lacks, the first response fills in (the identity taken at the download's start).
- returns ``versions.Facts``: status, Content-Range start and total, ETag, version id or
  generation, Last-Modified.
- ``streaming`` (an attribute): whether bytes reach the sink as they arrive, so that a cut
  keeps what arrived. The download loop then asks for the whole rest of an object in one
  request; a transport that hands over nothing until its request completes
  (``CatFileTransport``) is asked for chunks that grow while they succeed.

Invariant: bytes reach the sink only from a response that passed ``check_response``.
:func:`transport_for` picks the transport of a backend: one with a GET of its own
(``Backend.open_range``: http, s3, gcs, az) streams on the backend's event loop, this module
pumping the body; any other backend reads through one ``cat_file`` call, whose result
carries no facts (its version is then checked through ``info()`` by the caller).
"""

from __future__ import annotations

import asyncio
import errno
import math
import queue
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

import fsspec

from fsspec_shards.storage.backends import backend_for
from fsspec_shards.storage.backends.base import Backend, Read, call, protocol_of, within
from fsspec_shards.storage.backends.versions import (
    Facts,
    Version,
    VersionMismatch,
    check_response,
)
from fsspec_shards.storage.core.retry import http_status

PIECE = 1024 * 1024
_BYTES_IN_FLIGHT = 8 * PIECE
"""Received and not yet taken by the consuming thread before the loop waits for room."""
_STOP_AGAIN = 0.1
_STOP_WAIT = 10.0
"""How long a stopped consumer waits for the producer's end (cancelled again every
``_STOP_AGAIN`` s) before it leaves it: only a loop that no longer runs takes that long."""
Sink = Callable[[bytes], None]
Emit = Callable[[bytes], Awaitable[None]]


class Transport(Protocol):
    """Streams ranges of one backend's objects (see the module docstring)."""

    streaming: bool

    def stream(
        self,
        path: str,
        start: int,
        end: int | None,
        sink: Sink,
        timeout: float | None,
        rest_of_body: bool = False,
        expect: Version | None = None,
    ) -> Facts: ...


class _RangeWindow:
    """Keeps only bytes ``[start, end)`` of what arrives from ``offset`` on: slices the whole
    body of a server that ignored the Range, and stops at ``end``."""

    def __init__(self, start: int, end: float, offset: int) -> None:
        self.start = start
        self.end = end
        self.offset = offset

    @property
    def done(self) -> bool:
        return self.offset >= self.end

    def take(self, data: bytes) -> bytes:
        first = max(self.start - self.offset, 0)
        last = min(self.end - self.offset, len(data))
        self.offset += len(data)
        return data[first:last] if first < last else b""


def _window(facts: Facts, start: int, end: int | None, rest_of_body: bool) -> _RangeWindow:
    """The part of a response body to pass on: a 206 body begins at ``start`` and ends where
    its Content-Range says (bytes past the label are no bytes it vouched for; the resume asks
    for them again); a 200 body is the whole object (the server ignored the Range), kept to
    its end with ``rest_of_body``."""
    stop = math.inf if end is None else end
    if facts.status == 206:
        return _RangeWindow(start, min(stop, facts.stop or math.inf), start)
    return _RangeWindow(start, math.inf if rest_of_body else stop, 0)


async def _pump(read: Read, window: _RangeWindow, emit: Emit, timeout: float | None) -> None:
    while not window.done:
        data = await within(read(PIECE), timeout)
        if not data:
            return
        await emit(window.take(data))


class LoopTransport:
    """A transport whose requests run on the backend's event loop (``fs.loop``), each one
    the backend's own GET (``Backend.open_range``)."""

    streaming = True

    def __init__(self, fs: fsspec.AbstractFileSystem, backend: Backend) -> None:
        self.fs = fs
        self.backend = backend

    def stream(self, path, start, end, sink, timeout, rest_of_body=False, expect=None) -> Facts:
        outcome: dict[str, Facts] = {}

        async def produce(emit: Emit) -> None:
            outcome["facts"] = await self._stream(
                path, start, end, emit, timeout, rest_of_body, expect
            )

        refused = False
        try:
            _pipelined(self.fs.loop, produce, sink)
        except VersionMismatch:
            raise
        except Exception as exc:
            refused = http_status(exc) == 412
            if not refused:
                raise
        if refused:  # raised here, outside the except block: nothing chained
            raise VersionMismatch(errno.ESTALE, "the server refused the version asked for (412)")
        return outcome["facts"]

    async def _stream(self, path, start, end, emit, timeout, rest_of_body, expect) -> Facts:
        """Send the request, check the response, emit the body; return its facts."""
        request = self.backend.open_range(self.fs, path, start, end, expect, timeout)
        async with request as (facts, read):
            check_response(facts, start, expect)
            await _pump(read, _window(facts, start, end, rest_of_body), emit, timeout)
        return facts


class CatFileTransport:
    """Any other backend: one ``cat_file`` call; its result says nothing about its version."""

    streaming = False

    def __init__(self, fs: fsspec.AbstractFileSystem) -> None:
        self.fs = fs

    def stream(self, path, start, end, sink, timeout, rest_of_body=False, expect=None) -> Facts:
        data = call(self.fs, "cat_file", path, start=start, end=end, timeout=timeout)
        ignored = end is not None and len(data) > end - start  # the Range was ignored
        facts = Facts(
            status=200 if ignored else 206, start=0 if ignored else start, says_version=False
        )
        check_response(facts, start, expect)
        sink(_window(facts, start, end, rest_of_body).take(data))
        return facts


def transport_for(fs: fsspec.AbstractFileSystem) -> Transport:
    """The streaming transport of backend ``fs``."""
    backend = backend_for(protocol_of(fs))
    has_stream = type(backend).open_range is not Backend.open_range
    if not has_stream or getattr(fs, "asynchronous", False):
        return CatFileTransport(fs)
    return LoopTransport(fs, backend)


def _pipelined(loop: asyncio.AbstractEventLoop, produce: Callable, sink: Sink) -> None:
    """Run ``produce(emit)`` on the backend's event loop while this thread hands what it
    emits to ``sink``: the network read overlaps with hashing and writing, and those stay
    off the loop thread, which every download of the process shares. When this side stops
    first (the sink raised: a range split off, a fill stopped), the producer is cancelled
    and waited for before this returns: its response closed, no task left pending."""
    handoff = _Handoff(loop)
    asyncio.run_coroutine_threadsafe(handoff.run(produce), loop)
    ended = False
    try:
        while True:
            piece = handoff.take()
            if isinstance(piece, _End):
                ended = True
                if piece.failure is not None:
                    raise piece.failure
                return
            sink(piece)
    finally:
        if not ended:
            handoff.stop()


class _End:
    """The producer's last item: how it ended (``failure`` None: the body ended)."""

    __slots__ = ("failure",)

    def __init__(self, failure: BaseException | None) -> None:
        self.failure = failure


class _Handoff:
    """Pieces from the event loop to the consuming thread, through a thread-safe queue: a
    piece costs no wakeup of the loop, and the loop waits for room only when
    ``_BYTES_IN_FLIGHT`` are held (bounding the memory when the sink falls behind), woken
    once half of them were taken (a wakeup per few MiB, not per piece)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.pieces: queue.SimpleQueue = queue.SimpleQueue()
        self.lock = threading.Lock()
        self.held = 0  # bytes put and not taken
        self.room: asyncio.Future | None = None  # what the loop waits on for room
        self.stopped = False
        self.task: asyncio.Task | None = None

    async def run(self, produce: Callable) -> None:
        """``produce(emit)``, then its end (or failure) as the last item."""
        outcome: BaseException | None = None
        self.task = asyncio.current_task()
        try:
            if not self.stopped:
                await produce(self.emit)
        except BaseException as exc:  # handed to the consuming thread, raised there
            outcome = exc
        finally:
            self.pieces.put(_End(outcome))

    async def emit(self, data: bytes) -> None:
        """On the loop: hand ``data`` over; wait while too much is held."""
        if self.stopped:
            raise asyncio.CancelledError
        if not data:
            return
        with self.lock:
            self.held += len(data)
            room = None
            if self.held >= _BYTES_IN_FLIGHT:
                room = self.room = self.loop.create_future()
        self.pieces.put(data)
        if room is not None:
            await room

    def take(self) -> bytes | _End:
        """In the consuming thread: the next piece (waits for it)."""
        piece = self.pieces.get()
        if isinstance(piece, _End):
            return piece
        with self.lock:
            self.held -= len(piece)
            room = self.room if self.held <= _BYTES_IN_FLIGHT // 2 else None
            if room is not None:
                self.room = None
        if room is not None:
            self.loop.call_soon_threadsafe(_resolve, room)
        return piece

    def stop(self) -> None:
        """In the consuming thread, which takes no more: cancel the producer and wait for
        its end (its response closed). A cancellation it swallowed (``asyncio.wait_for``
        before Python 3.12 does, when what it waited for completed at that moment) is
        repeated; its next ``emit`` raises in any case."""
        with self.lock:
            self.stopped = True
        deadline = time.monotonic() + _STOP_WAIT
        while True:
            self.loop.call_soon_threadsafe(self._cancel)
            try:
                while not isinstance(self.pieces.get(timeout=_STOP_AGAIN), _End):
                    pass
                return
            except queue.Empty:
                if time.monotonic() > deadline:  # the loop does not run: nothing to wait for
                    return

    def _cancel(self) -> None:
        """On the loop: cancel the producer and whatever it waits on for room."""
        if self.room is not None:
            self.room.cancel()
        if self.task is not None and not self.task.done():
            self.task.cancel()


def _resolve(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)
