"""Fetch bytes from a backend: retried ranged reads, resumable whole-object downloads, verify.

A whole-object download asks the backend's transport (``streams.py``, or obstore:
``obstore_transport.py``) for the rest of the object; when a transfer breaks off it
continues from the byte it reached, never from 0. A transport that streams hands over every
byte that arrived before a cut, so one request to the end suffices (each extra request costs
a round trip, and some servers copy the whole object for each); with one that does not, the
object is read in ranged chunks whose size adapts (doubling on success, halving after a
failure that delivered nothing). Bytes are hashed as they stream past (large objects on a
worker thread: ``filling.OrderedHasher``); at the end size and checksum are checked. A
large object written into a file may be filled by several ranged GETs at once
(``filling.fill_ranges``, see :class:`Target`).

Invariants:

- One download is one version: every response is checked against the version ``info()``
  described when the pass began (``versions.py``); another version starts the pass over
  from byte 0, never splices. Where responses say nothing of their version (backends read
  through ``cat_file``), ``info()`` is asked again after a fault and at the end.
- An object with no identity beyond its size is read in one request; only a fault splits it.
- Ranges in flight at once only for an object with an ETag, generation or version id that
  every range response is checked against, after a first ranged request was answered as
  one (206).
- A pass that fails verification is discarded and the object downloaded once more; a
  second failure raises ``IntegrityError`` (one warning logged per object, not per try).
"""

from __future__ import annotations

import errno
import io
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, BinaryIO

import fsspec

from fsspec_shards.errors import IntegrityError
from fsspec_shards.storage.backends import (
    backend_checksums,
    file_info,
    object_identity,
    protocol_of,
)
from fsspec_shards.storage.filling import OrderedHasher, Writeback, fill_ranges, preallocate
from fsspec_shards.storage.identity import ObjectId
from fsspec_shards.storage.integrity import Checksum, choose_expected
from fsspec_shards.storage.retry import Attempts, RetryPolicy, TransientError, http_status
from fsspec_shards.storage.streams import Transport, transport_for
from fsspec_shards.storage.versions import Version, VersionMismatch, expected_version

logger = logging.getLogger("fsspec_shards.storage.download")

MiB = 1024 * 1024
INTEGRITY_PASSES = 2
"""Downloads of one object whose bytes fail verification before ``IntegrityError``: a copy
corrupted in transit is fetched once more; one corrupt at rest costs two downloads, not more."""
Counter = Callable[[str, int], None]
PARALLEL_ABOVE = 32 * MiB
"""Objects larger than this may be filled by several ranges in flight (``Target``)."""
RANGE_BYTES = 16 * MiB
HASH_ON_A_THREAD_ABOVE = 8 * MiB
"""Larger objects are hashed on a worker thread while they arrive; smaller ones inline (a
thread per download would cost more than it saves)."""


@dataclass
class ChunkSizer:
    """Chunk size for ranged reads: doubles after a success up to a ceiling; after a failure
    that delivered nothing it halves and lowers the ceiling to the new size, so a link that
    keeps failing long requests settles on chunks that complete. (A streamed read that is
    cut keeps what arrived, so such failures do not shrink the chunks.)"""

    size: int = 4 * MiB
    minimum: int = 256 * 1024
    maximum: int = 32 * MiB

    def __post_init__(self) -> None:
        self.ceiling = self.maximum

    def succeeded(self) -> None:
        self.size = min(self.ceiling, self.size * 2)

    def failed(self) -> None:
        self.size = max(self.minimum, self.size // 2)
        self.ceiling = self.size


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
    position = start
    attempts = target.attempts("read")
    unconfirmed = expect.unconfirmed

    def sink(data: bytes) -> None:
        nonlocal position
        parts.append(data)
        position += len(data)
        if on_bytes is not None:
            on_bytes(len(data))

    while position < end:
        before = position
        error: Exception | None = None
        changed: VersionMismatch | None = None
        try:
            target.transport.stream(
                target.path, position, end, sink, target.policy.timeout, False, expect
            )
        except VersionMismatch as exc:
            changed = exc
        except Exception as exc:
            error = exc
        if changed is not None:
            raise VersionMismatch(
                errno.ESTALE, f"{target.shown} changed while it was read: {changed.strerror}"
            )
        if position > before:
            attempts.progressed()
        if error is not None:
            attempts.failed(error)
        elif position < end:
            if expect.size is None:
                break
            attempts.failed(
                TransientError(f"short read: got {position - start} of {end - start} bytes")
            )
    if expect.unconfirmed > unconfirmed and _changed(target, expect):
        raise VersionMismatch(
            errno.ESTALE, f"{target.shown} changed while it was read: its info() changed"
        )
    return b"".join(parts)


@dataclass
class Target:
    """What one download is about and how hard it tries."""

    fs: fsspec.AbstractFileSystem
    path: str
    obj: ObjectId
    policy: RetryPolicy
    verify: str | bool = "auto"
    manifest_checksum: Checksum | None = None
    count: Counter | None = None
    transport: Transport | None = None
    ranges_in_flight: int = 1
    """Ranged GETs at once when filling a file with an object over :data:`PARALLEL_ABOVE`
    that has a version identity (1: one after the other)."""
    range_bytes: int = RANGE_BYTES

    def __post_init__(self) -> None:
        if self.transport is None:
            self.transport = transport_for(self.fs)

    @property
    def shown(self) -> str:
        """The object's name for messages and logs (redacted)."""
        return self.obj.shown

    def incr(self, name: str, amount: int = 1) -> None:
        if self.count is not None and amount:
            self.count(name, amount)

    def attempts(self, action: str) -> Attempts:
        return self.policy.attempts_for(
            self.shown, action, lambda: self.incr("retries"), hide=(self.path,)
        )

    def stat(self) -> dict[str, Any]:
        """The backend's ``info()`` of the object, fresh (never from a listing cache) and
        retried. A directory (object stores show a prefix as one of size 0) raises
        ``IsADirectoryError``: its bytes are no file's."""
        self.fs.invalidate_cache(self.path)
        info = self.policy.call(
            lambda: file_info(self.fs, self.path, self.policy.timeout),
            self.shown,
            "info",
            lambda: self.incr("retries"),
            hide=(self.path,),
        )
        if info.get("type") == "directory":
            raise IsADirectoryError(errno.EISDIR, f"is a directory: {self.shown}")
        return info

    def expected_checksum(self, info: dict[str, Any]) -> Checksum | None:
        found = backend_checksums(protocol_of(self.fs), info)
        return choose_expected(self.manifest_checksum, found, self.verify)

    def expected_version(self, info: dict[str, Any]) -> Version:
        """The version ``info`` describes: what every response must be of."""
        return expected_version(protocol_of(self.fs), info)


@dataclass
class _Mismatch:
    """A pass delivered bytes that failed verification."""

    expected: str
    actual: str


@dataclass
class _Changed:
    """The object was replaced while a pass read it: start over."""

    reason: str


def download(
    target: Target,
    out: BinaryIO,
    info: dict[str, Any] | None = None,
    chunks: ChunkSizer | None = None,
) -> dict[str, Any]:
    """Write the whole object into ``out`` (a seekable, truncatable binary file), verified.

    Returns ``{"size", "identity", "checksum"}`` (checksum: the verified ``"algo:hex"`` or
    None). A pass whose bytes fail verification is discarded and the object downloaded once
    more (:data:`INTEGRITY_PASSES`); ``IntegrityError`` when that fails too. A pass that sees
    another version of the object starts over from byte 0 with a fresh ``info()``. Failures
    of the transfer itself surface as the retry layer raises them (permanent at once,
    transient when spent).
    """
    info = info if info is not None else target.stat()
    chunks = chunks or ChunkSizer()
    received = 0

    def count_bytes(amount: int) -> None:
        nonlocal received
        received += amount

    try:
        failed_passes = 0
        changes = 0
        while True:
            result = _download_once(target, out, info, chunks, count_bytes)
            if isinstance(result, dict):
                return result
            if isinstance(result, _Changed):
                changes += 1
                logger.warning(
                    "%s changed while it was being read (%s): starting over",
                    target.shown,
                    result.reason,
                )
                if changes >= target.policy.attempts:
                    raise OSError(
                        errno.ESTALE, f"{target.shown} changed {changes} times while it was read"
                    )
                info = target.stat()
                continue
            failed_passes += 1
            target.incr("integrity_failures")
            out.seek(0)
            out.truncate()
            if failed_passes >= INTEGRITY_PASSES:
                raise IntegrityError(
                    target.shown, result.expected, result.actual, f"after {failed_passes} downloads"
                )
            logger.warning(
                "integrity check failed for %s: expected %s, got %s; downloading once more",
                target.shown,
                result.expected,
                result.actual,
            )
            info = target.stat()
    finally:
        target.incr("bytes_downloaded", received)


def _download_once(
    target: Target,
    out: BinaryIO,
    info: dict[str, Any],
    chunks: ChunkSizer,
    on_bytes: Callable[[int], None],
) -> dict[str, Any] | _Mismatch | _Changed:
    """One pass over one version of the object, resuming after each broken-off read.

    Every response is checked against the version ``info`` describes. The object is read
    in one request to its end when the transport streams (a cut keeps what arrived), and
    when it has no identity beyond its size (or its size is unknown): ranges of it could
    come from two same-size versions, undetectably. After a fault the read resumes, and the
    total size each response states must stay the same. A large object with a version
    identity, written into a file, may be read by several ranges at once
    (``Target.ranges_in_flight``).
    """
    out.seek(0)
    out.truncate()
    expect = target.expected_version(info)
    identity = object_identity(info)
    expected = target.expected_checksum(info)
    hasher = None
    if expected is not None:
        large = expect.size is None or expect.size > HASH_ON_A_THREAD_ABOVE
        hasher = OrderedHasher(expected.algorithm, threaded=large)
    try:
        position = _fill(target, out, expect, chunks, hasher, on_bytes)
    except VersionMismatch as exc:
        position = _Changed(exc.strerror or str(exc))
    except BaseException:
        if hasher is not None:
            hasher.abandon()
        raise
    if isinstance(position, _Changed):
        if hasher is not None:
            hasher.abandon()
        return position
    actual = hasher.checksum() if hasher is not None else None
    if expect.size is not None and position != expect.size:
        return _Mismatch(f"{expect.size} bytes", f"{position} bytes")
    if actual is not None and actual != expected:
        return _Mismatch(str(expected), str(actual))
    return {
        "size": position,
        "identity": identity,
        "checksum": str(actual) if actual is not None else None,
    }


def _fill(
    target: Target,
    out: BinaryIO,
    expect: Version,
    chunks: ChunkSizer,
    hasher: OrderedHasher | None,
    on_bytes: Callable[[int], None],
) -> int | _Changed:
    """Write the object into ``out`` from byte 0; the bytes written (``VersionMismatch``
    or :class:`_Changed` when another version turned up)."""
    attempts = target.attempts("download")
    whole = expect.size is None or not expect.identified or target.transport.streaming
    position = 0
    requests = 0
    writeback = Writeback.of(out)

    def sink(data: bytes) -> None:
        nonlocal position
        out.write(data)
        if hasher is not None:
            hasher.update(data)
        position += len(data)
        on_bytes(len(data))
        if writeback is not None:
            writeback.written(position)

    while expect.size is None or position < expect.size:
        before = position
        if expect.size is None:
            end = None  # to the end of the body
        elif requests == 0 and _parallel_planned(target, expect, out) is not None:
            end = target.range_bytes  # then, if answered as a range, the rest in ranges
        else:
            end = expect.size if whole else min(expect.size, position + chunks.size)
        requests += 1
        error: Exception | None = None
        facts = None
        try:
            facts = target.transport.stream(
                target.path, position, end, sink, target.policy.timeout, True, expect
            )
        except VersionMismatch:
            raise
        except Exception as exc:
            error = exc
        if position > before:
            attempts.progressed()
        if error is not None:
            if expect.size is None and position > 0 and http_status(error) == 416:
                break  # size unknown and the last read ended exactly at the end
            if position == before:
                chunks.failed()  # nothing arrived: ask for less next time
            attempts.failed(error)
        elif end is None and (expect.size is None or position >= expect.size):
            break  # read to the end of the body
        elif end is not None and position >= end:  # (past it: a Range ignored, all sent)
            chunks.succeeded()
            descriptor = _parallel_file(target, out, expect, position, facts)
            if descriptor is not None:
                out.flush()
                preallocate(descriptor, expect.size)
                fill_ranges(
                    target,
                    descriptor,
                    position,
                    expect,
                    hasher,
                    on_bytes,
                    target.ranges_in_flight,
                    target.range_bytes,
                )
                requests += 1  # (at least)
                position = expect.size
                out.seek(position)
            continue
        else:
            attempts.failed(TransientError(f"short read at offset {position} of {expect.size}"))
        if expect.unconfirmed and _changed(target, expect):
            return _Changed("its info() changed")
    out.flush()
    if requests > 1 and expect.unconfirmed and _changed(target, expect):
        return _Changed("its info() changed")
    return position


def _parallel_planned(target: Target, expect: Version, out: BinaryIO) -> int | None:
    """The descriptor of ``out`` when the object is one to fill by several ranges at once
    (module docstring); else None."""
    if (
        target.ranges_in_flight < 2
        or expect.size is None
        or expect.size <= max(PARALLEL_ABOVE, target.range_bytes)
        or not (expect.etag or expect.version)
    ):
        return None
    try:
        return out.fileno()
    except (AttributeError, io.UnsupportedOperation):  # in memory: no pwrite
        return None


def _parallel_file(
    target: Target, out: BinaryIO, expect: Version, position: int, facts: Any
) -> int | None:
    """The descriptor of ``out`` when the rest of the object, from ``position``, is to be
    filled by several ranges at once: planned, more than one range left, and the first
    request was answered as a range; else None."""
    if expect.size - position <= target.range_bytes or getattr(facts, "status", None) != 206:
        return None
    return _parallel_planned(target, expect, out)


def _changed(target: Target, expect: Version) -> bool:
    """Whether the object's ``info()`` now describes another version than ``expect``: the
    check for backends whose responses do not say which version they carry."""
    return not expect.matches(target.expected_version(target.stat()))
