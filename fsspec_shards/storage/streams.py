"""Ranged reads that hand bytes over as they arrive, so a cut keeps what was received.

``cat_file`` returns a range all at once or raises, losing every byte of a response that was
cut mid-body. For the network backends (http, s3, gcs, az) this module streams the response
body instead, passing each piece to a sink (in the caller's thread, while the next piece
is being received); when the connection breaks, the bytes already passed on count, and the
caller resumes from there. Each wait for the server (headers, every body piece) is bounded
by ``timeout``, so a stalled transfer raises ``TimeoutError`` while a slow but moving one
does not. Other backends fall back to one ``cat_file`` call.
"""

from __future__ import annotations

import asyncio
import errno
import math
import os
from collections.abc import Awaitable, Callable
from typing import Any

import fsspec

from fsspec_shards.storage.backends import (
    AZURE_PROTOCOLS,
    GCS_PROTOCOLS,
    HTTP_PROTOCOLS,
    S3_PROTOCOLS,
    call,
    protocol_of,
)

PIECE = 1024 * 1024
_PIECES_IN_FLIGHT = 8
_DONE = object()
Sink = Callable[[bytes], None]
Emit = Callable[[bytes], Awaitable[None]]


class _RangeWindow:
    """Keeps only bytes ``[start, end)`` of what arrives from ``offset`` on: slices the whole
    body of a server that ignored the Range, and stops at ``end``."""

    def __init__(self, start: int, end: int, offset: int) -> None:
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


async def _within(awaitable: Awaitable, timeout: float | None) -> Any:
    try:
        return await asyncio.wait_for(awaitable, timeout)
    except asyncio.TimeoutError:
        raise TimeoutError(errno.ETIMEDOUT, f"no data from the server for {timeout:g}s") from None


def _range_header(start: int, end: int) -> str:
    return f"bytes={start}-{end - 1}"


async def _pump_aiohttp(response: Any, window: _RangeWindow, emit: Emit, timeout) -> None:
    while not window.done:
        data = await _within(response.content.read(PIECE), timeout)
        if not data:
            return
        await emit(window.take(data))


def _window(status: int, start: int, end: int, rest_of_body: bool) -> _RangeWindow:
    """The part of a response body to pass on: a 206 body begins at ``start``; a 200 body is
    the whole object (the server ignored the Range), kept to its end with ``rest_of_body``."""
    if status == 206:
        return _RangeWindow(start, end, start)
    return _RangeWindow(start, math.inf if rest_of_body else end, 0)


async def _stream_http(fs, path, start, end, emit, timeout, rest_of_body) -> None:
    session = await fs.set_session()
    kwargs = dict(fs.kwargs)
    headers = dict(kwargs.pop("headers", {}) or {})
    headers["Range"] = _range_header(start, end)
    response = await _within(session.get(fs.encode_url(path), headers=headers, **kwargs), timeout)
    async with response:
        fs._raise_not_found_for_status(response, path)
        window = _window(response.status, start, end, rest_of_body)
        await _pump_aiohttp(response, window, emit, timeout)


async def _stream_s3(fs, path, start, end, emit, timeout, rest_of_body) -> None:
    bucket, key, version = fs.split_path(path)
    extra = {"VersionId": version} if version else {}
    response = await _within(
        fs._call_s3("get_object", Bucket=bucket, Key=key, Range=_range_header(start, end), **extra),
        timeout,
    )
    body = response["Body"]
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode", 206)
    window = _window(status, start, end, rest_of_body)
    try:
        while not window.done:
            data = await _within(body.read(PIECE), timeout)
            if not data:
                return
            await emit(window.take(data))
    finally:
        body.close()


async def _stream_gcs(fs, path, start, end, emit, timeout, rest_of_body) -> None:
    from gcsfs.retry import validate_response

    await fs._set_session()
    headers = fs._get_headers({"Range": _range_header(start, end)})
    response = await _within(
        fs.session.get(fs.url(path), headers=headers, params=fs._get_params({})), timeout
    )
    async with response:
        if response.status >= 400:
            validate_response(response.status, await response.read(), path)
        window = _window(response.status, start, end, rest_of_body)
        await _pump_aiohttp(response, window, emit, timeout)


async def _stream_azure(fs, path, start, end, emit, timeout, rest_of_body) -> None:
    from azure.core.exceptions import ResourceNotFoundError

    container, blob, version = fs.split_path(fs._strip_protocol(path))
    async with fs.service_client.get_blob_client(container=container, blob=blob) as client:
        try:
            stream = await _within(
                client.download_blob(
                    offset=start, length=end - start, version_id=version, max_concurrency=1
                ),
                timeout,
            )
        except ResourceNotFoundError as exc:
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path) from exc
        window = _RangeWindow(start, end, start)
        pieces = stream.chunks()
        while not window.done:
            try:
                data = await _within(pieces.__anext__(), timeout)
            except StopAsyncIteration:
                return
            await emit(window.take(data))


_STREAMERS = {
    **dict.fromkeys(HTTP_PROTOCOLS, _stream_http),
    **dict.fromkeys(S3_PROTOCOLS, _stream_s3),
    **dict.fromkeys(GCS_PROTOCOLS, _stream_gcs),
    **dict.fromkeys(AZURE_PROTOCOLS, _stream_azure),
}


def stream_range(
    fs: fsspec.AbstractFileSystem,
    path: str,
    start: int,
    end: int,
    sink: Sink,
    timeout: float | None,
    rest_of_body: bool = False,
) -> None:
    """Pass bytes ``[start, end)`` of ``path`` to ``sink`` in order, as they arrive.

    May pass fewer bytes (the body ended early) or raise after passing some (a cut); either
    way everything passed is correct data from ``start`` on, to resume after. ``end`` must
    not lie past the end of the object. With ``rest_of_body``, a server that ignored the
    Range (and so sends the whole object) has everything from ``start`` on passed, past
    ``end``: a whole-object download then takes one request, not one per chunk.
    """
    streamer = _STREAMERS.get(protocol_of(fs))
    if streamer is None or getattr(fs, "asynchronous", False):
        data = call(fs, "cat_file", path, start=start, end=end, timeout=timeout)
        status = 200 if len(data) > end - start else 206  # 200: the Range was ignored
        sink(_window(status, start, end, rest_of_body).take(data))
        return
    _pipelined(
        fs.loop, lambda emit: streamer(fs, path, start, end, emit, timeout, rest_of_body), sink
    )


def _pipelined(loop: asyncio.AbstractEventLoop, produce: Callable, sink: Sink) -> None:
    """Run ``produce(emit)`` on the backend's event loop while this thread hands what it
    emits to ``sink``: the network read overlaps with hashing and writing, and those stay
    off the loop thread, which every download of the process shares."""
    pieces: asyncio.Queue = asyncio.Queue()
    room = asyncio.Semaphore(_PIECES_IN_FLIGHT)

    async def emit(data: bytes) -> None:
        if data:
            await room.acquire()
            pieces.put_nowait(data)

    async def run() -> None:
        outcome: object = _DONE
        try:
            await produce(emit)
        except BaseException as exc:  # handed to the consuming thread, raised there
            outcome = exc
        finally:
            pieces.put_nowait(outcome)

    producer = asyncio.run_coroutine_threadsafe(run(), loop)
    try:
        while True:
            piece = asyncio.run_coroutine_threadsafe(pieces.get(), loop).result()
            if piece is _DONE:
                return
            if isinstance(piece, BaseException):
                raise piece
            loop.call_soon_threadsafe(room.release)
            sink(piece)
    finally:
        producer.cancel()
