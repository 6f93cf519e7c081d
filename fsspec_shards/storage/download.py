"""Fetch bytes from a backend: retried ranged reads, resumable whole-object downloads, verify.

A whole-object download reads the object in ranged chunks whose bodies are streamed
(``streams.py``). When a transfer breaks off it continues from the byte it reached, never
from 0; the chunk size adapts (doubling on success, halving after a failure that delivered
nothing). Bytes are hashed as they stream past; at the end size and checksum are checked,
and a mismatch discards what was written and downloads again.
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, BinaryIO

import fsspec

from fsspec_shards.errors import IntegrityError
from fsspec_shards.redact import redact_url
from fsspec_shards.storage.backends import backend_checksums, call, object_identity, protocol_of
from fsspec_shards.storage.integrity import Checksum, StreamingHasher, choose_expected
from fsspec_shards.storage.retry import Attempts, RetryPolicy, TransientError, http_status
from fsspec_shards.storage.streams import stream_range

logger = logging.getLogger("fsspec_shards.storage.download")

MiB = 1024 * 1024
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
    fs: fsspec.AbstractFileSystem,
    path: str,
    start: int,
    end: int,
    size: int | None,
    attempts: Attempts,
    on_bytes: Callable[[int], None] | None = None,
) -> bytes:
    """Bytes ``[start, end)`` with retries; a read that breaks off continues where it stopped.

    ``end`` must not lie past the object's end when ``size`` is known. With an unknown size a
    body that ends early means the end of the object.
    """
    parts: list[bytes] = []
    position = start

    def sink(data: bytes) -> None:
        nonlocal position
        parts.append(data)
        position += len(data)
        if on_bytes is not None:
            on_bytes(len(data))

    while position < end:
        before = position
        try:
            stream_range(fs, path, position, end, sink, attempts.policy.timeout)
        except Exception as exc:
            if position > before:
                attempts.progressed()
            attempts.failed(exc)
            continue
        if position > before:
            attempts.progressed()
        if position < end:
            if size is None:
                break
            attempts.failed(
                TransientError(f"short read: got {position - start} of {end - start} bytes")
            )
    return b"".join(parts)


@dataclass
class Target:
    """What one download is about and how hard it tries."""

    fs: fsspec.AbstractFileSystem
    path: str
    url: str
    policy: RetryPolicy
    verify: str | bool = "auto"
    manifest_checksum: Checksum | None = None
    count: Counter | None = None

    def incr(self, name: str, amount: int = 1) -> None:
        if self.count is not None and amount:
            self.count(name, amount)

    def attempts(self, action: str) -> Attempts:
        return self.policy.attempts_for(self.url, action, lambda: self.incr("retries"))

    def stat(self) -> dict[str, Any]:
        """The backend's ``info()`` of the object, retried. A directory (object stores show a
        prefix as one of size 0) raises ``IsADirectoryError``: its bytes are no file's."""
        info = self.policy.call(
            lambda: call(self.fs, "info", self.path, timeout=self.policy.timeout),
            self.url,
            "info",
            lambda: self.incr("retries"),
        )
        if info.get("type") == "directory":
            raise IsADirectoryError(errno.EISDIR, f"is a directory: {redact_url(self.url)}")
        return info

    def expected_checksum(self, info: dict[str, Any]) -> Checksum | None:
        found = backend_checksums(protocol_of(self.fs), info)
        return choose_expected(self.manifest_checksum, found, self.verify)


class _ObjectChanged(Exception):
    """The object was replaced while it was being read: start over."""


@dataclass
class _Mismatch:
    """A pass delivered bytes that failed verification."""

    expected: str
    actual: str


def download(
    target: Target,
    out: BinaryIO,
    info: dict[str, Any] | None = None,
    chunks: ChunkSizer | None = None,
) -> dict[str, Any]:
    """Write the whole object into ``out`` (a seekable, truncatable binary file), verified.

    Returns ``{"size", "identity", "checksum"}`` (checksum: the verified ``"algo:hex"`` or
    None). A pass whose bytes fail verification is discarded and the object downloaded
    again; ``IntegrityError`` when every attempt failed so. Failures of the transfer itself
    surface as the retry layer raises them (permanent at once, transient when spent).
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
            try:
                result = _download_once(target, out, info, chunks, count_bytes)
            except _ObjectChanged:
                changes += 1
                if changes >= target.policy.attempts:
                    raise OSError(
                        errno.EAGAIN,
                        f"{redact_url(target.url)} changed {changes} times while it was read",
                    ) from None
                info = target.stat()
                continue
            if isinstance(result, dict):
                return result
            failed_passes += 1
            target.incr("integrity_failures")
            out.seek(0)
            out.truncate()
            if failed_passes >= target.policy.attempts:
                raise IntegrityError(
                    target.url, result.expected, result.actual, f"after {failed_passes} downloads"
                )
            logger.warning(
                "integrity check failed for %s: expected %s, got %s; downloading again",
                redact_url(target.url),
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
) -> dict[str, Any] | _Mismatch:
    """One pass over the object, resuming within the pass after each broken-off read."""
    out.seek(0)
    out.truncate()
    size = info.get("size")
    identity = object_identity(info)
    expected = target.expected_checksum(info)
    hasher = StreamingHasher(expected.algorithm) if expected else None
    attempts = target.attempts("download")
    position = 0
    requests = 0

    def sink(data: bytes) -> None:
        nonlocal position
        out.write(data)
        if hasher is not None:
            hasher.update(data)
        position += len(data)
        on_bytes(len(data))

    while size is None or position < size:
        before = position
        end = position + chunks.size if size is None else min(size, position + chunks.size)
        requests += 1
        try:
            stream_range(target.fs, target.path, position, end, sink, target.policy.timeout, True)
        except Exception as exc:
            if size is None and position > 0 and http_status(exc) == 416:
                break  # size unknown and the last chunk ended exactly at the end
            if position > before:
                attempts.progressed()
            else:
                chunks.failed()  # nothing arrived: ask for less next time
            attempts.failed(exc)
            _check_unchanged(target, identity)
            continue
        if position >= end:  # past end: a server that ignored the Range sent it all
            attempts.progressed()
            chunks.succeeded()
        elif size is None:
            break
        else:
            if position > before:
                attempts.progressed()
            attempts.failed(TransientError(f"short read at offset {position} of {size}"))
            _check_unchanged(target, identity)
    out.flush()
    if requests > 1:
        _check_unchanged(target, identity)
    if size is not None and position != size:
        return _Mismatch(f"{size} bytes", f"{position} bytes")
    if hasher is not None:
        actual = hasher.checksum()
        if actual != expected:
            return _Mismatch(str(expected), str(actual))
    return {
        "size": position,
        "identity": identity,
        "checksum": str(hasher.checksum()) if hasher is not None else None,
    }


def _check_unchanged(target: Target, identity: str) -> None:
    current = object_identity(target.stat())
    if current != identity:
        logger.warning(
            "%s changed while it was being read (%s -> %s): starting over",
            redact_url(target.url),
            identity,
            current,
        )
        raise _ObjectChanged()
