"""One stream: an object read by one request to its end, resumed from the byte reached;
and the writer every fill (one stream, ranges, blocks) writes through.

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

What every fill writes through: hashing off the receiving thread, writes gathered into
large aligned ones, writeback started as the bytes arrive.

:class:`OrderedHasher` hashes on a worker thread what a download hands it, in the order
handed: pieces of bytes, or a stretch of the file being filled (read back with ``os.pread``
as far as a :class:`Frontier` says it is written). The receiving thread never waits for the
hash; hashlib and google-crc32c release the GIL on large buffers, so the two overlap.

:class:`Writeback` asks the kernel to start writing what was written so far to disk
(``sync_file_range(SYNC_FILE_RANGE_WRITE)``, which does not wait), so that making the file
durable later finds little left to write: the disk works while the network does.

- The hasher sees the object's bytes in order, each exactly once, as they lie in the file
  (so what is verified is what was written).
"""

from __future__ import annotations

import ctypes
import errno
import os
import queue
import threading
from collections.abc import Callable
from typing import Any, BinaryIO

import fsspec

from fsspec_shards.checksums import Checksum
from fsspec_shards.redact import redact_url
from fsspec_shards.storage.backends.versions import Version, VersionMismatch
from fsspec_shards.storage.core.retry import TransientError
from fsspec_shards.storage.core.verification import WholeHasher
from fsspec_shards.storage.transfer.obstore_transport import DownloadTransport, HttpStatusError
from fsspec_shards.storage.transfer.target import ChunkSizer, Target, resume

_READ_BACK = 8 * 1024 * 1024
_PIECES_QUEUED = 64
"""Pieces handed over and not hashed yet before :meth:`OrderedHasher.update` waits: bounds
the memory held when hashing falls behind the network."""
WRITEBACK_EVERY = 8 * 1024 * 1024
_WRITE_BYTES = 1024 * 1024
"""Received pieces are gathered into writes of about this many bytes (:class:`Gathered`).
Below 2 MiB on purpose: a write of a whole aligned 2 MiB stretch has the kernel allocate a
huge-page-sized page-cache folio, and such writes cost 6-18x the CPU per byte of 1 MiB ones
here (far store, issue 29: the default at 7 s of CPU per GB and 0.5-0.8x the 8-range tool;
with 1 MiB writes 2.1 s/GB and 1.0x)."""
SYNC_FILE_RANGE_WRITE = 2  # <fcntl.h>: start writeback of dirty pages, do not wait
_STOP = object()


class Frontier:
    """How far a file is written without a gap: ``[begin, value)`` is all there. A waiter
    is woken when the frontier reaches the position it waits for, not at every write."""

    def __init__(self, begin: int) -> None:
        self.value = begin
        self._cond = threading.Condition()
        self._wanted: list[int] = []  # the positions waiters wait for

    def advance(self, value: int) -> None:
        with self._cond:
            if value > self.value:
                self.value = value
                if self._wanted and value >= min(self._wanted):
                    self._cond.notify_all()

    def wait_for(self, position: int, timeout: float) -> int:
        """The frontier once it reaches ``position``, or after ``timeout`` seconds."""
        with self._cond:
            if self.value < position:
                self._wanted.append(position)
                try:
                    self._cond.wait_for(lambda: self.value >= position, timeout)
                finally:
                    self._wanted.remove(position)
            return self.value


class OrderedHasher:
    """The checksums (one per algorithm, ``verification.WholeHasher``) of what
    :meth:`update` and :meth:`update_from_file` hand it, in that order, computed on a worker
    thread (``threaded``; for small objects the thread costs more than it saves, and the
    bytes are hashed as they are handed over)."""

    def __init__(self, algorithms: tuple[str, ...], threaded: bool = True) -> None:
        self._hasher = WholeHasher(algorithms)
        self._work: queue.Queue = queue.Queue(maxsize=_PIECES_QUEUED)
        self._failure: BaseException | None = None
        self._abandoned = False
        self._thread: threading.Thread | None = None
        if threaded:
            self._thread = threading.Thread(
                target=self._run, name="fsspec-shards-hash", daemon=True
            )
            self._thread.start()

    def update(self, data: bytes) -> None:
        """Hash ``data`` after everything handed over before it."""
        if self._thread is None:
            self._hasher.update(data)
        else:
            self._work.put(data)

    def update_from_file(self, descriptor: int, start: int, end: int, written: Frontier) -> None:
        """Hash bytes ``[start, end)`` of the open file ``descriptor`` as ``written`` says
        they are there, after everything handed over before."""
        self._work.put((descriptor, start, end, written))

    def checksums(self) -> list[Checksum]:
        """The checksums of everything handed over (waits for all of it to be hashed)."""
        self._work.put(_STOP)
        if self._thread is None:
            self._run()
        else:
            self._thread.join()
        if self._failure is not None:
            raise self._failure
        return self._hasher.checksums()

    def abandon(self) -> None:
        """Stop hashing (the pass failed): the worker skips what is left and ends."""
        self._abandoned = True
        if self._thread is not None:
            self._work.put(_STOP)

    def _run(self) -> None:
        """Hash the queued work until the stop mark; after a failure, only drain the queue
        (so that nothing handing over work waits on a full queue)."""
        while (item := self._work.get()) is not _STOP:
            if self._abandoned or self._failure is not None:
                continue
            try:
                if isinstance(item, tuple):
                    self._hash_file_range(*item)
                else:
                    self._hasher.update(item)
            except BaseException as exc:  # raised to the caller of checksums()
                self._failure = exc

    def _hash_file_range(self, descriptor: int, start: int, end: int, written: Frontier) -> None:
        """Read back into one reused buffer (a fresh 8 MiB ``bytes`` per read costs page
        faults that cost as much as the hash)."""
        buffer = bytearray(_READ_BACK)
        view = memoryview(buffer)
        position = start
        while position < end and not self._abandoned:
            # a whole buffer at a time (or what is there after a moment), not every write
            there = min(end, written.wait_for(min(end, position + _READ_BACK), 0.1))
            if there <= position:
                continue
            got = os.preadv(descriptor, [view[: min(_READ_BACK, there - position)]], position)
            if not got:
                raise TransientError(f"the file ends at byte {position}, expected {end}")
            self._hasher.update(view[:got])
            position += got


def _sync_file_range() -> Callable[[int, int, int, int], int] | None:
    """libc's ``sync_file_range`` (Linux), or None where there is none."""
    try:
        function = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (AttributeError, OSError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong, ctypes.c_uint]
    function.restype = ctypes.c_int
    return function


start_writeback = _sync_file_range()


class Writeback:
    """Starts the disk's writeback of a file being written front to back, every
    ``WRITEBACK_EVERY`` bytes."""

    def __init__(self, out: BinaryIO, descriptor: int) -> None:
        self.out = out
        self.descriptor = descriptor
        self.started = 0  # bytes from 0 whose writeback was started

    @classmethod
    def of(cls, out: BinaryIO) -> Writeback | None:
        """For the file ``out``; None when it is no file on disk or the system has no
        ``sync_file_range``."""
        if start_writeback is None:
            return None
        try:
            return cls(out, out.fileno())
        except (AttributeError, OSError):  # io.UnsupportedOperation: an in-memory file
            return None

    def written(self, end: int) -> None:
        """Bytes ``[0, end)`` were handed to ``out``."""
        if end - self.started >= WRITEBACK_EVERY:
            self.out.flush()
            start_writeback(
                self.descriptor, self.started, end - self.started, SYNC_FILE_RANGE_WRITE
            )
            self.started = end


class Gathered:
    """Gathers the pieces a download receives (any size, as the socket hands them over,
    at consecutive offsets) into writes that end on multiples of ``_WRITE_BYTES`` in the
    file, through ``write(offset, view)``. The kernel caches a file written in large
    aligned writes in large folios; one written piece by piece at unaligned sizes, in
    single pages, and reading it back (every cache hit) was 0.79-0.82x as fast here. The
    bytes are copied once more into one reused buffer (a piece that covers a whole write is
    written from where it is); the write calls are ~30x fewer."""

    def __init__(self, write: Callable[[int, memoryview], None]) -> None:
        self._write = write
        self._buffer = memoryview(bytearray(_WRITE_BYTES))
        """Reused: a buffer grown and cut for every write faulted in fresh pages each time,
        about as much CPU as the write itself."""
        self._start = 0
        self._filled = 0

    def add(self, offset: int, data: bytes | memoryview) -> None:
        """``data`` belongs at ``offset`` (right after what was added before, if any)."""
        if not self._filled:
            self._start = offset
        left = memoryview(data).cast("B")
        while len(left):
            at = self._start + self._filled
            room = _WRITE_BYTES - at % _WRITE_BYTES
            if not self._filled and len(left) >= room:  # a whole write: not copied
                self._write(at, left[:room])
                self._start, left = at + room, left[room:]
                continue
            taken = min(room, len(left))
            self._buffer[self._filled : self._filled + taken] = left[:taken]
            self._filled += taken
            left = left[taken:]
            if taken == room:
                self.flush()

    def flush(self) -> None:
        """Write what is gathered."""
        if self._filled:
            self._write(self._start, self._buffer[: self._filled])
            self._start += self._filled
            self._filled = 0


def preallocate(descriptor: int, size: int) -> None:
    """Give the file its final size now, so ranges can be written anywhere in it (blocks
    allocated up front where the filesystem can, else a sparse file)."""
    try:
        os.posix_fallocate(descriptor, 0, size)
    except (AttributeError, OSError):
        os.ftruncate(descriptor, size)


def pwrite_all(descriptor: int, data: bytes | memoryview, position: int) -> None:
    """Write all of ``data`` at ``position`` (``os.pwrite`` may write less)."""
    view = memoryview(data)
    while view:
        written = os.pwrite(descriptor, view, position)
        view = view[written:]
        position += written


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
    pieces are written in large aligned writes (:class:`Gathered`) whose writeback
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
