"""Filling a file with an object: hashing off the receiving thread, writeback started as
the bytes arrive, and optionally several ranged GETs at once.

:class:`OrderedHasher` hashes on a worker thread what a download hands it, in the order
handed: pieces of bytes, or ranges of the file being filled (read back with ``os.pread``
once the range is complete). The receiving thread never waits for the hash; hashlib and
google-crc32c release the GIL on large buffers, so the two overlap.

:class:`Writeback` asks the kernel to start writing what was written so far to disk
(``sync_file_range(SYNC_FILE_RANGE_WRITE)``, which does not wait), so that the fsync the
cache makes before publishing finds little left to write: the disk works while the network
does. It changes nothing about durability: the fsync still decides.

:func:`fill_ranges` fills ``[begin, size)`` of a pre-allocated file with ``ranges_in_flight``
ranged GETs at a time, each written where it belongs with ``os.pwrite``.

Invariants:

- Only for an object with a version identity (ETag, generation or version id) that every
  response is checked against: each range is one request of the version ``expect`` names
  (the transport checks it before a byte is written), so ranges of two versions never mix.
  A response of another version stops every range and raises ``VersionMismatch``.
- Each range resumes from the byte it reached after a fault, with its own failure chain
  (``retry.Attempts``); a permanent failure, or a chain spent, stops every range and is
  raised.
- The hasher sees the object's bytes in order, each exactly once, as they lie in the file
  (so what is verified is what was written).
"""

from __future__ import annotations

import ctypes
import os
import queue
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, BinaryIO

from fsspec_shards.storage.integrity import Checksum, StreamingHasher
from fsspec_shards.storage.retry import TransientError
from fsspec_shards.storage.versions import Version, VersionMismatch

if TYPE_CHECKING:
    from fsspec_shards.storage.download import Target

_READ_BACK = 8 * 1024 * 1024
_PIECES_QUEUED = 64
"""Pieces handed over and not hashed yet before :meth:`OrderedHasher.update` waits: bounds
the memory held when hashing falls behind the network."""
_WRITEBACK_EVERY = 8 * 1024 * 1024
_SYNC_FILE_RANGE_WRITE = 2  # <fcntl.h>: start writeback of dirty pages, do not wait
_STOP = object()
FileRange = tuple[int, int, threading.Event]


class OrderedHasher:
    """A checksum of what :meth:`update` and :meth:`update_from_file` hand it, in that
    order, computed on a worker thread (``threaded``; for small objects the thread costs
    more than it saves, and the bytes are hashed as they are handed over)."""

    def __init__(self, algorithm: str, threaded: bool = True) -> None:
        self._hasher = StreamingHasher(algorithm)
        self._work: queue.Queue = queue.Queue(maxsize=_PIECES_QUEUED)
        self._failure: BaseException | None = None
        self._abandoned = False
        self._thread: threading.Thread | None = None
        if threaded:
            self._thread = threading.Thread(
                target=self._run, name="fsspec-shards-hash", daemon=True
            )
            self._thread.start()

    @property
    def algorithm(self) -> str:
        return self._hasher.algorithm

    def update(self, data: bytes) -> None:
        """Hash ``data`` after everything handed over before it."""
        if self._thread is None:
            self._hasher.update(data)
        else:
            self._work.put(data)

    def update_from_file(self, descriptor: int, ranges: Sequence[FileRange]) -> None:
        """Hash each ``(start, end, ready)`` range of the open file ``descriptor`` in turn,
        once its ``ready`` is set (the range is written), after everything handed over
        before."""
        self._work.put((descriptor, tuple(ranges)))

    def checksum(self) -> Checksum:
        """The checksum of everything handed over (waits for all of it to be hashed)."""
        self._work.put(_STOP)
        if self._thread is None:
            self._run()
        else:
            self._thread.join()
        if self._failure is not None:
            raise self._failure
        return self._hasher.checksum()

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
                    descriptor, ranges = item
                    for start, end, ready in ranges:
                        self._hash_file_range(descriptor, start, end, ready)
                else:
                    self._hasher.update(item)
            except BaseException as exc:  # raised to the caller of checksum()
                self._failure = exc

    def _hash_file_range(self, descriptor: int, start: int, end: int, ready) -> None:
        while not ready.wait(0.1):
            if self._abandoned:
                return
        position = start
        while position < end and not self._abandoned:
            data = os.pread(descriptor, min(_READ_BACK, end - position), position)
            if not data:
                raise TransientError(f"the file ends at byte {position}, expected {end}")
            self._hasher.update(data)
            position += len(data)


def _sync_file_range() -> Callable[[int, int, int, int], int] | None:
    """libc's ``sync_file_range`` (Linux), or None where there is none."""
    try:
        function = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (AttributeError, OSError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong, ctypes.c_uint]
    function.restype = ctypes.c_int
    return function


_start_writeback = _sync_file_range()


class Writeback:
    """Starts the disk's writeback of a file being written front to back, every
    ``_WRITEBACK_EVERY`` bytes."""

    def __init__(self, out: BinaryIO, descriptor: int) -> None:
        self.out = out
        self.descriptor = descriptor
        self.started = 0  # bytes from 0 whose writeback was started

    @classmethod
    def of(cls, out: BinaryIO) -> Writeback | None:
        """For the file ``out``; None when it is no file on disk or the system has no
        ``sync_file_range``."""
        if _start_writeback is None:
            return None
        try:
            return cls(out, out.fileno())
        except (AttributeError, OSError):  # io.UnsupportedOperation: an in-memory file
            return None

    def written(self, end: int) -> None:
        """Bytes ``[0, end)`` were handed to ``out``."""
        if end - self.started >= _WRITEBACK_EVERY:
            self.out.flush()
            _start_writeback(
                self.descriptor, self.started, end - self.started, _SYNC_FILE_RANGE_WRITE
            )
            self.started = end


class _Stopped(Exception):
    """Another range failed: this one stops (raised from its sink, so its request ends)."""


def preallocate(descriptor: int, size: int) -> None:
    """Give the file its final size now, so ranges can be written anywhere in it (blocks
    allocated up front where the filesystem can, else a sparse file)."""
    try:
        os.posix_fallocate(descriptor, 0, size)
    except (AttributeError, OSError):
        os.ftruncate(descriptor, size)


def fill_ranges(
    target: Target,
    descriptor: int,
    begin: int,
    expect: Version,
    hasher: OrderedHasher | None,
    on_bytes: Callable[[int], None],
    ranges_in_flight: int,
    range_bytes: int,
) -> None:
    """Write bytes ``[begin, expect.size)`` of the object into the pre-allocated file
    ``descriptor``, ``ranges_in_flight`` ranged GETs of ``range_bytes`` at a time; hand each
    range to ``hasher`` in order. Raises ``VersionMismatch`` when the object changed, or
    the failure that ended a range."""
    size = expect.size
    bounds = [(start, min(size, start + range_bytes)) for start in range(begin, size, range_bytes)]
    done = [threading.Event() for _ in bounds]
    if hasher is not None:
        ranges = [(start, end, ready) for (start, end), ready in zip(bounds, done, strict=True)]
        hasher.update_from_file(descriptor, ranges)
    stop = threading.Event()
    failures: list[BaseException] = []
    counted = threading.Lock()
    next_range = iter(range(len(bounds)))
    taking = threading.Lock()

    def count(amount: int) -> None:
        with counted:
            on_bytes(amount)

    def work() -> None:
        while not stop.is_set():
            with taking:
                index = next(next_range, None)
            if index is None:
                return
            try:
                _fill_range(target, descriptor, *bounds[index], expect, count, stop)
            except _Stopped:
                return
            except BaseException as exc:
                failures.append(exc)
                stop.set()
                return
            done[index].set()

    workers = [
        threading.Thread(target=work, name=f"fsspec-shards-range-{number}", daemon=True)
        for number in range(min(ranges_in_flight, len(bounds)))
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    if failures:
        changed = next((f for f in failures if isinstance(f, VersionMismatch)), None)
        raise changed or failures[0]


def _fill_range(
    target: Target,
    descriptor: int,
    start: int,
    end: int,
    expect: Version,
    count: Callable[[int], None],
    stop: threading.Event,
) -> None:
    """Bytes ``[start, end)`` written at their place, resumed after each fault."""
    position = start
    attempts = target.attempts("download")

    def sink(data: bytes) -> None:
        nonlocal position
        if stop.is_set():
            raise _Stopped
        view = memoryview(data)
        while view:
            written = os.pwrite(descriptor, view, position)
            view = view[written:]
            position += written
        count(len(data))

    while position < end:
        before = position
        error: BaseException | None = None
        try:
            target.transport.stream(
                target.path, position, end, sink, target.policy.timeout, False, expect
            )
        except (VersionMismatch, _Stopped):
            raise
        except Exception as exc:
            error = exc
        if position > before:
            attempts.progressed()
        if error is not None:
            attempts.failed(error)
        elif position < end:
            attempts.failed(TransientError(f"short read at offset {position} of {expect.size}"))
