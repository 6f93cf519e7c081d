"""Byte ranges of an object, ``[start, end)`` with Python's slice rules (negative from the
end, clamped): cut from a local copy, or read straight from the backend, all of one
version of the object (``backends/versions.py``)."""

from __future__ import annotations

import io
import logging
import tempfile
from typing import Any, BinaryIO

from fsspec_shards.storage.backends.versions import Unproven, Version, VersionMismatch
from fsspec_shards.storage.transfer import planner
from fsspec_shards.storage.transfer.one_stream import read_range
from fsspec_shards.storage.transfer.target import Target

logger = logging.getLogger("fsspec_shards.storage.byte_ranges")

Range = tuple[int | None, int | None]


def resolve_range(start: int | None, end: int | None, size: int | None) -> tuple[int, int]:
    """``[start, end)`` as absolute offsets, with Python's negative-index and clamping rules."""
    if size is None:
        if (start or 0) < 0 or end is None or end < 0:
            raise ValueError("a negative or open-ended range needs the object's size")
        return start or 0, end
    first = 0 if start is None else (max(0, size + start) if start < 0 else min(start, size))
    last = size if end is None else (max(0, size + end) if end < 0 else min(end, size))
    return first, max(first, last)


def read_local_range(handle: BinaryIO, start: int | None, end: int | None) -> bytes:
    """``[start, end)`` of the local file ``handle``."""
    size = handle.seek(0, io.SEEK_END)  # (a file still filling has its final size too)
    first, last = resolve_range(start, end, size)
    handle.seek(first)
    return handle.read(last - first)


def read_backend_ranges(target: Target, ranges: list[Range], info: dict[str, Any]) -> list[bytes]:
    """Byte ranges straight from the backend, retried and resumed, all of one version of
    the object: identity- and size-checked on every response (no checksum: a range
    cannot be verified alone). A change of version reads them again from the new one;
    answers that prove no version (``versions.Unproven``) get the object read whole, the
    one shape in which they are used, and the ranges cut from it."""
    changed: VersionMismatch | None = None
    for _ in range(target.policy.attempts):
        expect = target.expect(info).version
        try:
            return [_read_backend_range(target, *bounds, expect) for bounds in ranges]
        except VersionMismatch as exc:
            changed = exc
        except Unproven:  # answers prove no version: the object whole, then the ranges
            with tempfile.TemporaryFile() as spool:  # on disk: the object may be large
                planner.fill(target, spool, info)
                return [read_local_range(spool, *bounds) for bounds in ranges]
        logger.info("%s changed while its ranges were read: reading again", target.shown)
        info = target.stat()
    raise changed


def _read_backend_range(
    target: Target, start: int | None, end: int | None, expect: Version
) -> bytes:
    """``[start, end)`` of the version ``expect`` straight from the backend."""
    first, last = resolve_range(start, end, expect.size)
    if first >= last:
        return b""
    return read_range(target, first, last, expect, lambda n: target.incr("bytes_downloaded", n))
