"""One stream: an object read by one request to its end, resumed from the byte reached.

A transport that streams hands over every byte that arrived before a cut, so one request to
the end suffices (each extra request costs a round trip, and some servers copy the whole
object for each); with one that does not, the object is read in ranged chunks whose size
adapts (doubling on success, halving after a failure that delivered nothing). When a
transfer breaks off it continues from the byte it reached, never from 0 (``target.resume``).
Which fill runs, and what is verified at the end: ``planner.py``.

- Every response is checked against the version the pass expects (``versions.py``); where
  responses cannot say their version (backends read through ``cat_file``), ``info()`` is
  asked again after a fault and at the end, and another version raises
  ``VersionMismatch``.
- An object with no identity beyond its size is read in one request (no chunks); only a
  fault splits it.
"""

from __future__ import annotations

import errno
from collections.abc import Callable
from typing import Any, BinaryIO

import fsspec

from fsspec_shards.redact import redact_url
from fsspec_shards.storage.backends.versions import Version, VersionMismatch
from fsspec_shards.storage.core.retry import TransientError
from fsspec_shards.storage.transfer.obstore_transport import DownloadTransport, HttpStatusError
from fsspec_shards.storage.transfer.ranges import Gathered, OrderedHasher, Writeback
from fsspec_shards.storage.transfer.target import ChunkSizer, Target, resume


def read_range(
    target: Target,
    start: int,
    end: int,
    expect: Version,
    on_bytes: Callable[[int], None] | None = None,
) -> bytes:
    """Bytes ``[start, end)`` of the version ``expect`` with retries; a read that breaks off
    continues where it stopped, every response checked against ``expect``.

    ``end`` must not lie past the object's end when its size is known; with an unknown size
    a body that ends early means the end of the object. Raises :class:`VersionMismatch`
    (an ``OSError`` naming the object) when the object is no longer that version.
    """
    parts: list[bytes] = []
    unconfirmed = expect.unconfirmed

    def sink(data: bytes) -> None:
        parts.append(data)
        if on_bytes is not None:
            on_bytes(len(data))

    try:
        resume(target, start, end, sink, expect, action="read")
    except VersionMismatch as exc:
        changed = exc
    else:
        changed = None
    if changed is not None:
        raise VersionMismatch(
            errno.ESTALE, f"{target.shown} changed while it was read: {changed.strerror}"
        )
    if expect.unconfirmed > unconfirmed and target.changed_since(expect):
        raise VersionMismatch(
            errno.ESTALE, f"{target.shown} changed while it was read: its info() changed"
        )
    return b"".join(parts)


def fill_one_stream(
    target: Target,
    out: BinaryIO,
    expect: Version,
    chunks: ChunkSizer | None,
    hasher: OrderedHasher | None,
    on_bytes: Callable[[int], None],
) -> int:
    """Write the object into ``out`` from byte 0, by one request to its end (``chunks``:
    by ranged chunks where the transport does not stream); the bytes written. Received
    pieces are written in large aligned writes (:class:`~.ranges.Gathered`) whose writeback
    starts as they go. Raises ``VersionMismatch`` when another version turned up,
    ``Unproven`` when an answer proved none."""
    writeback = Writeback.of(out)

    def write(at: int, view: memoryview) -> None:
        out.write(view)
        if writeback is not None:
            writeback.written(at + len(view))

    gathered = Gathered(write)  # (large page-aligned writes: hits read faster)
    position = 0

    def sink(data: bytes) -> None:
        nonlocal position
        gathered.add(position, data)
        if hasher is not None:
            hasher.update(data)
        position += len(data)
        on_bytes(len(data))

    def after_fault() -> None:
        if expect.unconfirmed and target.changed_since(expect):
            raise VersionMismatch(errno.ESTALE, "its info() changed")

    try:
        moved = resume(
            target,
            0,
            expect.size,
            sink,
            expect,
            rest_of_body=True,
            chunks=chunks,
            after_fault=after_fault,
        )
    finally:
        gathered.flush()
    out.flush()
    if moved.requests > 1 and expect.unconfirmed and target.changed_since(expect):
        raise VersionMismatch(errno.ESTALE, "its info() changed")
    return position


def read_whole(
    transport: Any, fs: fsspec.AbstractFileSystem, path: str, timeout: float | None
) -> bytes:
    """A small object (a manifest) read whole through the download ``transport``: where that
    is obstore, a DataLoader worker reads it without starting the fsspec backend's
    (botocore's) session; else, and for an empty object (no byte 0 to ask a range from),
    through ``fs.cat_file``."""
    if not isinstance(transport, DownloadTransport):
        return fs.cat_file(path)
    pieces: list[bytes] = []
    try:
        facts = transport.stream(path, 0, None, lambda piece: pieces.append(bytes(piece)), timeout)
    except HttpStatusError as exc:
        if exc.status != 416:
            raise
        return fs.cat_file(path)
    data = b"".join(pieces)
    if facts.total is not None and len(data) != facts.total:
        raise TransientError(f"{redact_url(path)}: read {len(data)} of {facts.total} bytes")
    return data
