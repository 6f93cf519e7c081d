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
:func:`transport_for` picks the transport of a backend: http, s3, gcs and az stream on the
backend's event loop; any other backend reads through one ``cat_file`` call, whose result
carries no facts (its version is then checked through ``info()`` by the caller).
"""

from __future__ import annotations

import abc
import asyncio
import errno
import math
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import fsspec

from fsspec_shards.storage.backends import azure, call, gcs, http, protocol_of, s3
from fsspec_shards.storage.backends.versions import (
    Facts,
    Version,
    VersionMismatch,
    check_response,
    facts_from_headers,
    parse_content_range,
    timestamp,
)
from fsspec_shards.storage.core.retry import http_status
from fsspec_shards.storage.deps import adlfs as adlfs_deps
from fsspec_shards.storage.deps import azure as azure_deps
from fsspec_shards.storage.deps import fsspec as fsspec_deps
from fsspec_shards.storage.deps import gcsfs as gcsfs_deps
from fsspec_shards.storage.deps import s3fs as s3fs_deps

PIECE = 1024 * 1024
_PIECES_IN_FLIGHT = 8
_DONE = object()
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


async def _within(awaitable: Awaitable, timeout: float | None) -> Any:
    try:
        return await asyncio.wait_for(awaitable, timeout)
    except asyncio.TimeoutError:
        raise TimeoutError(errno.ETIMEDOUT, f"no data from the server for {timeout:g}s") from None


def _range_header(start: int, end: int | None) -> str:
    return f"bytes={start}-" if end is None else f"bytes={start}-{end - 1}"


async def _pump(read: Callable[[], Awaitable[bytes]], window: _RangeWindow, emit, timeout) -> None:
    while not window.done:
        data = await _within(read(), timeout)
        if not data:
            return
        await emit(window.take(data))


async def _deliver(
    facts: Facts, read: Callable[[], Awaitable[bytes]], emit: Emit, request: tuple
) -> Facts:
    """The tail of every streaming transport: check the response against what was asked
    (``request``: start, end, timeout, rest_of_body, expect), then emit its body's window."""
    start, end, timeout, rest_of_body, expect = request
    check_response(facts, start, expect)
    await _pump(read, _window(facts, start, end, rest_of_body), emit, timeout)
    return facts


class _LoopTransport(abc.ABC):
    """A transport whose requests run on the backend's event loop (``fs.loop``)."""

    streaming = True

    def __init__(self, fs: fsspec.AbstractFileSystem) -> None:
        self.fs = fs

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

    @abc.abstractmethod
    async def _stream(self, path, start, end, emit, timeout, rest_of_body, expect) -> Facts:
        """Send the request, check the response, emit the body; return its facts."""


class HttpTransport(_LoopTransport):
    """fsspec's http backend: its aiohttp session, its headers and options."""

    async def _stream(self, path, start, end, emit, timeout, rest_of_body, expect) -> Facts:
        fs = self.fs
        session = await fs.set_session()
        kwargs = dict(fs.kwargs)
        headers = dict(kwargs.pop("headers", {}) or {})
        headers["Range"] = _range_header(start, end)
        if expect is not None and expect.strong_etag:
            headers["If-Match"] = expect.strong_etag
        response = await _within(
            session.get(fs.encode_url(path), headers=headers, **kwargs), timeout
        )
        async with response:
            fsspec_deps.raise_for_http_status(fs, response, path)
            facts = facts_from_headers(response.status, response.headers)
            request = (start, end, timeout, rest_of_body, expect)
            return await _deliver(facts, lambda: response.content.read(PIECE), emit, request)


class S3Transport(_LoopTransport):
    """s3fs: ``get_object`` through its aiobotocore client, pinned to the version expected."""

    async def _stream(self, path, start, end, emit, timeout, rest_of_body, expect) -> Facts:
        fs = self.fs
        bucket, key, version = fs.split_path(path)
        extra: dict[str, str] = {}
        if version:
            extra["VersionId"] = version
        elif expect is not None and expect.version and expect.version != "null":
            extra["VersionId"] = str(expect.version)
        if expect is not None and expect.strong_etag:
            extra["IfMatch"] = expect.strong_etag
        response = await _within(
            s3fs_deps.call_s3(
                fs, "get_object", Bucket=bucket, Key=key, Range=_range_header(start, end), **extra
            ),
            timeout,
        )
        body = response["Body"]
        try:
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode", 206)
            first, stop, total = parse_content_range(response.get("ContentRange"))
            if status == 200 and not response.get("ContentEncoding"):
                total = response.get("ContentLength")
            facts = Facts(
                status=status,
                start=first,
                stop=stop,
                total=total,
                etag=response.get("ETag"),
                version=response.get("VersionId"),
                modified=timestamp(response.get("LastModified")),
            )
            request = (start, end, timeout, rest_of_body, expect)
            return await _deliver(facts, lambda: body.read(PIECE), emit, request)
        finally:
            body.close()


class GcsTransport(_LoopTransport):
    """gcsfs: the JSON API's media download, conditional on the generation expected."""

    async def _stream(self, path, start, end, emit, timeout, rest_of_body, expect) -> Facts:
        from gcsfs.retry import validate_response

        fs = self.fs
        session, headers, params = await gcsfs_deps.media_request(
            fs, {"Range": _range_header(start, end)}
        )
        if expect is not None and expect.version and "generation=" not in fs.url(path):
            params["ifGenerationMatch"] = str(expect.version)
        response = await _within(
            session.get(fs.url(path), headers=headers, params=params, timeout=fs.requests_timeout),
            timeout,
        )
        async with response:
            if response.status >= 400:
                validate_response(response.status, await response.read(), path)
            facts = facts_from_headers(response.status, response.headers, "x-goog-generation")
            request = (start, end, timeout, rest_of_body, expect)
            return await _deliver(facts, lambda: response.content.read(PIECE), emit, request)


class AzureTransport(_LoopTransport):
    """adlfs: one raw Get Blob request through the SDK's pipeline (whose retries are off),
    conditional on the ETag expected. The SDK's downloader is not used: it buffers pieces
    whole and retries a cut piece inside itself, out of sight of the retry counters."""

    async def _stream(self, path, start, end, emit, timeout, rest_of_body, expect) -> Facts:
        from azure.core.exceptions import ResourceNotFoundError

        fs = self.fs
        container, blob, version = fs.split_path(fsspec_deps.strip_protocol(fs, path))
        if not version and expect is not None and expect.version:
            version = str(expect.version)
        conditions = azure_deps.if_match(expect.etag if expect is not None else None)
        async with fs.service_client.get_blob_client(container=container, blob=blob) as client:
            try:
                pipeline_response, body, _ = await _within(
                    azure_deps.raw_download(
                        client,
                        range=_range_header(start, end),
                        version_id=version,
                        modified_access_conditions=conditions,
                        **adlfs_deps.timeout_kwargs(fs),
                    ),
                    timeout,
                )
            except ResourceNotFoundError:
                missing = True
            else:
                missing = False
            if missing:
                raise FileNotFoundError(errno.ENOENT, "no such blob", path)
            response = pipeline_response.http_response
            request = (start, end, timeout, rest_of_body, expect)
            try:
                status, headers = response.status_code, response.headers
                facts = facts_from_headers(status, headers, "x-ms-version-id")
                await _deliver(facts, body.__anext__, emit, request)
            except StopAsyncIteration:
                pass
            finally:
                await response.close()
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


_TRANSPORTS = {
    **dict.fromkeys(http.PROTOCOLS, HttpTransport),
    **dict.fromkeys(s3.PROTOCOLS, S3Transport),
    **dict.fromkeys(gcs.PROTOCOLS, GcsTransport),
    **dict.fromkeys(azure.PROTOCOLS, AzureTransport),
}


def transport_for(fs: fsspec.AbstractFileSystem) -> Transport:
    """The streaming transport of backend ``fs``."""
    kind = _TRANSPORTS.get(protocol_of(fs))
    if kind is None or getattr(fs, "asynchronous", False):
        return CatFileTransport(fs)
    return kind(fs)


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
