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
(``filling.fill_ranges``; how many: ``range_plan.py``).

Invariants:

- One download is one version: every response is checked against the version ``info()``
  described when the pass began (``versions.py``); another version starts the pass over
  from byte 0, never splices. A response that proves no version (``versions.Unproven``:
  no ETag, version or Last-Modified while the object has one) to a range or a resume
  starts the pass over as one request from byte 0, the one shape in which its bytes are
  used; a cut in that request starts over again (``Unproven`` after ``retries`` of them).
  Where responses cannot say their version (backends read through ``cat_file``),
  ``info()`` is asked again after a fault and at the end.
- What is verified is ``verification.py``'s one rule: the size and every checksum known
  (manifests' and backend's), hashed on the one pass.
- An object with no identity beyond its size is read in one request; only a fault splits it.
- Ranges in flight at once only for an object with an ETag, generation or version id that
  every range response is checked against, after a first ranged request was answered as
  one (206) by this store (``range_plan.py``); when a response did not say its version,
  ``info()`` is asked at the end.
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

from fsspec_shards.errors import IntegrityError
from fsspec_shards.storage.backends.versions import Unproven, Version, VersionMismatch
from fsspec_shards.storage.core.verification import BACKEND, Mismatch
from fsspec_shards.storage.transfer.range_plan import AUTO_ABOVE, one_request
from fsspec_shards.storage.transfer.ranges import (
    Gathered,
    OrderedHasher,
    Writeback,
    fill_ranges,
    preallocate,
)
from fsspec_shards.storage.transfer.target import ChunkSizer, Target, resume
from fsspec_shards.units import MiB

logger = logging.getLogger("fsspec_shards.storage.transfer.one_stream")

INTEGRITY_PASSES = 2
"""Downloads of one object whose bytes fail verification before ``IntegrityError``: a copy
corrupted in transit is fetched once more; one corrupt at rest costs two downloads, not more."""
HASH_ON_A_THREAD_ABOVE = 8 * MiB
"""Larger objects are hashed on a worker thread while they arrive; smaller ones inline (a
thread per download would cost more than it saves)."""


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
    if expect.unconfirmed > unconfirmed and _changed(target, expect):
        raise VersionMismatch(
            errno.ESTALE, f"{target.shown} changed while it was read: its info() changed"
        )
    return b"".join(parts)


@dataclass
class _Changed:
    """The object was replaced while a pass read it: start over."""

    reason: str


@dataclass
class _OneStream:
    """An answer proved no version (``versions.Unproven``): start over as one request from
    byte 0, the one shape in which such an answer's bytes are used (nothing spliced)."""

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
        unproven = 0
        while True:
            one_stream = unproven > 0
            result = _download_once(target, out, info, chunks, count_bytes, one_stream)
            if isinstance(result, dict):
                return result
            if isinstance(result, _OneStream):
                unproven += 1
                if unproven > target.policy.attempts:
                    raise Unproven(
                        errno.ESTALE,
                        f"{target.shown}: {result.reason}; the one request from byte 0 that "
                        f"may use such answers was cut {unproven - 1} times (no resume: it "
                        "could splice two versions)",
                    )
                logger.warning(
                    "%s: %s; reading it again as one request from byte 0",
                    target.shown,
                    result.reason,
                )
                continue
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
                    target.shown,
                    result.expected,
                    result.actual,
                    f"expected by {result.source}; after {failed_passes} downloads",
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
    one_stream: bool = False,
) -> dict[str, Any] | Mismatch | _Changed | _OneStream:
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
    identity = target.identity(info)
    expected = target.expectation(info)
    hasher = None
    if expected:
        large = expect.size is None or expect.size > HASH_ON_A_THREAD_ABOVE
        hasher = OrderedHasher(expected.algorithms, threaded=large)
    try:
        position = _fill(target, out, expect, chunks, hasher, on_bytes, one_stream)
    except VersionMismatch as exc:
        position = _Changed(exc.strerror or str(exc))
    except Unproven as exc:
        position = _OneStream(exc.strerror or str(exc))
    except BaseException:
        if hasher is not None:
            hasher.abandon()
        raise
    if isinstance(position, _Changed | _OneStream):
        if hasher is not None:
            hasher.abandon()
        return position
    computed = hasher.checksums() if hasher is not None else []
    if expect.size is not None and position != expect.size:
        return Mismatch(f"{expect.size} bytes", f"{position} bytes", BACKEND)
    mismatch = expected.mismatch(computed)
    if mismatch is not None:
        return mismatch
    strongest = expected.strongest()
    return {
        "size": position,
        "identity": identity,
        "checksum": str(strongest) if strongest is not None else None,
    }


def _fill(
    target: Target,
    out: BinaryIO,
    expect: Version,
    chunks: ChunkSizer,
    hasher: OrderedHasher | None,
    on_bytes: Callable[[int], None],
    one_stream: bool,
) -> int | _Changed:
    """Write the object into ``out`` from byte 0; the bytes written (``VersionMismatch``
    or :class:`_Changed` when another version turned up, ``Unproven`` when an answer proved
    none). ``one_stream``: one request to the end, whatever the object."""
    descriptor = None if one_stream else _parallel_planned(target, expect, out)
    if descriptor is not None:
        out.flush()
        preallocate(descriptor, expect.size)
        fill_ranges(target, descriptor, expect, hasher, on_bytes)
        out.seek(expect.size)
        if expect.unconfirmed and _changed(target, expect):  # a range said not its version
            return _Changed("its info() changed")
        return expect.size
    whole = one_stream or expect.size is None or not expect.identified
    position = 0
    writeback = Writeback.of(out)

    def write(at: int, view: memoryview) -> None:
        out.write(view)
        if writeback is not None:
            writeback.written(at + len(view))

    gathered = Gathered(write)  # (large page-aligned writes: hits read faster)

    def sink(data: bytes) -> None:
        nonlocal position
        gathered.add(position, data)
        if hasher is not None:
            hasher.update(data)
        position += len(data)
        on_bytes(len(data))

    changed: list[str] = []

    def after_fault() -> None:
        if expect.unconfirmed and _changed(target, expect):
            changed.append("its info() changed")
            raise _Stop

    try:
        moved = resume(
            target,
            0,
            expect.size,
            sink,
            expect,
            rest_of_body=True,
            chunks=None if whole else chunks,
            after_fault=after_fault,
        )
    except _Stop:
        return _Changed(changed[0])
    finally:
        gathered.flush()
    out.flush()
    if moved.requests > 1 and expect.unconfirmed and _changed(target, expect):
        return _Changed("its info() changed")
    return position


class _Stop(Exception):
    """The object's ``info()`` changed after a fault: the pass ends."""


def _parallel_planned(target: Target, expect: Version, out: BinaryIO) -> int | None:
    """The descriptor of ``out`` when the object is one to fill by several ranges at once
    (module docstring); else None."""
    if (
        expect.size is None
        or expect.size <= AUTO_ABOVE
        or not (expect.etag or expect.version)
        or one_request(target.ranges_in_flight, target.link, target.plan_dir)
    ):
        return None
    try:
        return out.fileno()
    except (AttributeError, io.UnsupportedOperation):  # in memory: no pwrite
        return None


def _changed(target: Target, expect: Version) -> bool:
    """Whether the object's ``info()`` now describes another version than ``expect``: the
    check for backends whose responses do not say which version they carry."""
    return not expect.matches(target.expected_version(target.stat()))
