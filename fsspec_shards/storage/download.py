"""Fetch bytes from a backend: retried ranged reads, resumable whole-object downloads, verify.

A whole-object download reads the object in ranged chunks whose bodies are streamed by the
backend's transport (``streams.py``). When a transfer breaks off it continues from the byte
it reached, never from 0; the chunk size adapts (doubling on success, halving after a
failure that delivered nothing). Bytes are hashed as they stream past; at the end size and
checksum are checked.

Invariants:

- One download is one version: every response is checked against the version ``info()``
  described when the pass began (``versions.py``); another version starts the pass over
  from byte 0, never splices. Where responses say nothing of their version (backends read
  through ``cat_file``), ``info()`` is asked again after a fault and at the end.
- An object with no identity beyond its size is read in one request; only a fault splits it.
- A pass that fails verification is discarded and the object downloaded once more; a
  second failure raises ``IntegrityError`` (one warning logged per object, not per try).
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, BinaryIO

import fsspec

from fsspec_shards.errors import IntegrityError
from fsspec_shards.storage.backends import backend_checksums, call, object_identity, protocol_of
from fsspec_shards.storage.identity import ObjectId
from fsspec_shards.storage.integrity import Checksum, StreamingHasher, choose_expected
from fsspec_shards.storage.retry import Attempts, RetryPolicy, TransientError, http_status
from fsspec_shards.storage.streams import Transport, transport_for
from fsspec_shards.storage.versions import Version, VersionMismatch, expected_version

logger = logging.getLogger("fsspec_shards.storage.download")

MiB = 1024 * 1024
INTEGRITY_PASSES = 2
"""Downloads of one object whose bytes fail verification before ``IntegrityError``: a copy
corrupted in transit is fetched once more; one corrupt at rest costs two downloads, not more."""
Counter = Callable[[str, int], None]


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
            lambda: call(self.fs, "info", self.path, timeout=self.policy.timeout),
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

    Every response is checked against the version ``info`` describes. An object with no
    identity beyond its size (or of unknown size) is read in one request to its end:
    ranges of it could come from two same-size versions, undetectably. After a fault the
    read resumes, and the total size each response states must stay the same.
    """
    out.seek(0)
    out.truncate()
    expect = target.expected_version(info)
    identity = object_identity(info)
    expected = target.expected_checksum(info)
    hasher = StreamingHasher(expected.algorithm) if expected else None
    attempts = target.attempts("download")
    whole = expect.size is None or not expect.identified
    position = 0
    requests = 0

    def sink(data: bytes) -> None:
        nonlocal position
        out.write(data)
        if hasher is not None:
            hasher.update(data)
        position += len(data)
        on_bytes(len(data))

    while expect.size is None or position < expect.size:
        before = position
        if expect.size is None:
            end = None  # to the end of the body
        else:
            end = expect.size if whole else min(expect.size, position + chunks.size)
        requests += 1
        error: Exception | None = None
        try:
            target.transport.stream(
                target.path, position, end, sink, target.policy.timeout, True, expect
            )
        except VersionMismatch as exc:
            return _Changed(exc.strerror or str(exc))
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
            continue
        else:
            attempts.failed(TransientError(f"short read at offset {position} of {expect.size}"))
        if expect.unconfirmed and _changed(target, expect):
            return _Changed("its info() changed")
    out.flush()
    if requests > 1 and expect.unconfirmed and _changed(target, expect):
        return _Changed("its info() changed")
    if expect.size is not None and position != expect.size:
        return _Mismatch(f"{expect.size} bytes", f"{position} bytes")
    if hasher is not None:
        actual = hasher.checksum()
        if actual != expected:
            return _Mismatch(str(expected), str(actual))
    return {
        "size": position,
        "identity": identity,
        "checksum": str(hasher.checksum()) if hasher is not None else None,
    }


def _changed(target: Target, expect: Version) -> bool:
    """Whether the object's ``info()`` now describes another version than ``expect``: the
    check for backends whose responses do not say which version they carry."""
    return not expect.matches(target.expected_version(target.stat()))
