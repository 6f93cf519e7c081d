"""The one entry that fills a file with an object: :func:`fill` chooses how, and checks it.

Three strategies move the bytes:

- verified blocks (``blocks.py``) when a block manifest lists the object: each block is
  checked as it lands and may be handed out at once;
- ranges in flight (``ranges.py``): a large object with an ETag, generation or version id
  that every range response is checked against, written into a file, when
  ``range_plan.py`` does not say one request (a first ranged request must be answered as
  one, 206, by this store);
- else one stream (``one_stream.py``): one request to the end, resumed from the byte
  reached.

Each pass reads the object's ``info()`` in one place (``Target.expect``: the version rule of
``versions.py``, the verification rule of ``verification.py``, the identity the cache
records; a block fill may start before ``info()`` is in and take it when it comes:
``blocks.py``) and ends with the one check: the size and every checksum known (manifests'
and backend's), hashed on the one pass (large objects on a worker thread:
``one_stream.OrderedHasher``).

Invariants:

- One pass is one version: every response is checked against the version ``info()``
  described when the pass began; another version starts the pass over from byte 0, never
  splices. A response that proves no version (``versions.Unproven``: no ETag, version or
  Last-Modified while the object has one) to a range or a resume starts the pass over as
  one request from byte 0, the one shape in which its bytes are used; a cut in that
  request starts over again (``Unproven`` after ``retries`` of them).
- A pass that fails verification is discarded and the object downloaded once more; a
  second failure raises ``IntegrityError`` (one warning logged per object, not per try).
"""

from __future__ import annotations

import errno
import io
import logging
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, BinaryIO

from fsspec_shards.checksums import BlockList
from fsspec_shards.errors import IntegrityError
from fsspec_shards.storage.backends.versions import Unproven, Version, VersionMismatch
from fsspec_shards.storage.core.verification import BACKEND, Mismatch
from fsspec_shards.storage.transfer.block_progress import BlockProgress
from fsspec_shards.storage.transfer.blocks import fill_blocks
from fsspec_shards.storage.transfer.one_stream import OrderedHasher, fill_one_stream, preallocate
from fsspec_shards.storage.transfer.range_plan import AUTO_ABOVE, one_request
from fsspec_shards.storage.transfer.ranges import fill_ranges
from fsspec_shards.storage.transfer.target import (
    INTEGRITY_PASSES,
    ChunkSizer,
    Expected,
    Target,
)
from fsspec_shards.units import MiB

logger = logging.getLogger("fsspec_shards.storage.transfer.planner")

HASH_ON_A_THREAD_ABOVE = 8 * MiB
"""Larger objects are hashed on a worker thread while they arrive; smaller ones inline (a
thread per download would cost more than it saves)."""


def fill(
    target: Target,
    out: BinaryIO,
    info: dict[str, Any] | Future[dict[str, Any]] | None = None,
    *,
    blocks: BlockList | None = None,
    progress: BlockProgress | None = None,
    chunks: ChunkSizer | None = None,
) -> dict[str, Any]:
    """Write the whole object into ``out`` (a seekable, truncatable binary file), verified.

    ``blocks``: the object's block manifest entry (verified blocks, marked in ``progress``
    as they land); with it, ``info`` may be still to come (``Target.stat_on_a_thread``):
    the fill starts at once, beside it (``blocks.fill_blocks``). Returns ``{"size",
    "identity", "checksum"}`` (checksum: the verified ``"algo:hex"`` or None). A pass
    whose bytes fail verification is discarded and the object downloaded once more
    (:data:`~.target.INTEGRITY_PASSES`); ``IntegrityError`` when that fails too. A pass
    that sees another version of the object starts over from byte 0 with a fresh
    ``info()``. Failures of the transfer itself surface as the retry layer raises them
    (permanent at once, transient when spent).
    """
    info = info if info is not None else target.stat()
    if blocks is not None:
        progress = progress if progress is not None else BlockProgress(blocks)
        expected = info if isinstance(info, Future) else target.expect(info, blocks)
        return fill_blocks(target, out, expected, blocks, progress, target.ranges_in_flight)
    if isinstance(info, Future):
        raise TypeError("an info() still to come needs a block manifest entry")
    return _Passes(target, out, chunks or ChunkSizer()).run(info)


@dataclass
class _Changed:
    """The object was replaced while a pass read it: start over."""

    reason: str


@dataclass
class _OneStream:
    """An answer proved no version (``versions.Unproven``): start over as one request from
    byte 0, the one shape in which such an answer's bytes are used (nothing spliced)."""

    reason: str


class _Passes:
    """The passes of one whole-object fill, and what ends them: too many versions seen,
    too many cut one-stream passes, or verification failed too often."""

    def __init__(self, target: Target, out: BinaryIO, chunks: ChunkSizer) -> None:
        self.target = target
        self.out = out
        self.chunks = chunks
        self.received = 0
        self.failed_passes = 0
        self.changes = 0
        self.unproven = 0

    def run(self, info: dict[str, Any]) -> dict[str, Any]:
        """Passes until one is verified (its metadata) or a limit is spent (raised)."""
        try:
            while True:
                result = _one_pass(
                    self.target,
                    self.out,
                    self.target.expect(info),
                    self.chunks,
                    self._count,
                    one_stream=self.unproven > 0,
                )
                if isinstance(result, dict):
                    return result
                if isinstance(result, _OneStream):
                    self._one_stream_next(result)
                    continue
                if isinstance(result, _Changed):
                    self._changed(result)
                else:
                    self._failed_verification(result)
                info = self.target.stat()
        finally:
            self.target.incr("bytes_downloaded", self.received)

    def _count(self, amount: int) -> None:
        self.received += amount

    def _one_stream_next(self, result: _OneStream) -> None:
        self.unproven += 1
        shown = self.target.shown
        if self.unproven > self.target.policy.attempts:
            raise Unproven(
                errno.ESTALE,
                f"{shown}: {result.reason}; the one request from byte 0 that may use such "
                f"answers was cut {self.unproven - 1} times (no resume: it could splice two "
                "versions)",
            )
        logger.warning("%s: %s; reading it again as one request from byte 0", shown, result.reason)

    def _changed(self, result: _Changed) -> None:
        self.changes += 1
        shown = self.target.shown
        logger.warning(
            "%s changed while it was being read (%s): starting over", shown, result.reason
        )
        if self.changes >= self.target.policy.attempts:
            raise OSError(errno.ESTALE, f"{shown} changed {self.changes} times while it was read")

    def _failed_verification(self, result: Mismatch) -> None:
        self.failed_passes += 1
        self.target.incr("integrity_failures")
        self.out.seek(0)
        self.out.truncate()
        if self.failed_passes >= INTEGRITY_PASSES:
            raise IntegrityError(
                self.target.shown,
                result.expected,
                result.actual,
                f"expected by {result.source}; after {self.failed_passes} downloads",
            )
        logger.warning(
            "integrity check failed for %s: expected %s, got %s; downloading once more",
            self.target.shown,
            result.expected,
            result.actual,
        )


def _one_pass(
    target: Target,
    out: BinaryIO,
    expected: Expected,
    chunks: ChunkSizer,
    on_bytes: Callable[[int], None],
    one_stream: bool = False,
) -> dict[str, Any] | Mismatch | _Changed | _OneStream:
    """One pass over the version ``expected`` names, hashed as it lands and verified at the
    end: its metadata, the mismatch, or why another pass must follow."""
    out.seek(0)
    out.truncate()
    version = expected.version
    hasher = None
    if expected.checksums:
        large = version.size is None or version.size > HASH_ON_A_THREAD_ABOVE
        hasher = OrderedHasher(expected.checksums.algorithms, threaded=large)
    try:
        position = _write(target, out, version, chunks, hasher, on_bytes, one_stream)
    except (VersionMismatch, Unproven) as exc:
        if hasher is not None:
            hasher.abandon()
        again = _Changed if isinstance(exc, VersionMismatch) else _OneStream
        return again(exc.strerror or str(exc))
    except BaseException:
        if hasher is not None:
            hasher.abandon()
        raise
    computed = hasher.checksums() if hasher is not None else []
    if version.size is not None and position != version.size:
        return Mismatch(f"{version.size} bytes", f"{position} bytes", BACKEND)
    mismatch = expected.checksums.mismatch(computed)
    return mismatch if mismatch is not None else expected.metadata(position)


def _write(
    target: Target,
    out: BinaryIO,
    version: Version,
    chunks: ChunkSizer,
    hasher: OrderedHasher | None,
    on_bytes: Callable[[int], None],
    one_stream: bool,
) -> int:
    """Write the object into ``out`` from byte 0 by the strategy that fits (module
    docstring); the bytes written. ``one_stream``: one request to the end, whatever the
    object. An object with no identity beyond its size (or of unknown size) is read in one
    request: ranges of it could come from two same-size versions, undetectably."""
    descriptor = None if one_stream else _ranges_descriptor(target, version, out)
    if descriptor is not None:
        out.flush()
        preallocate(descriptor, version.size)
        fill_ranges(target, descriptor, version, hasher, on_bytes)
        out.seek(version.size)
        if version.unconfirmed and target.changed_since(version):  # a range said not its own
            raise VersionMismatch(errno.ESTALE, "its info() changed")
        return version.size
    whole = one_stream or version.size is None or not version.identified
    return fill_one_stream(target, out, version, None if whole else chunks, hasher, on_bytes)


def _ranges_descriptor(target: Target, version: Version, out: BinaryIO) -> int | None:
    """The descriptor of ``out`` when the object is one to fill by several ranges at once
    (module docstring); else None."""
    if (
        version.size is None
        or version.size <= AUTO_ABOVE
        or not (version.etag or version.version)
        or one_request(target.ranges_in_flight, target.link, target.plan_dir)
    ):
        return None
    try:
        return out.fileno()
    except (AttributeError, io.UnsupportedOperation):  # in memory: no pwrite
        return None
