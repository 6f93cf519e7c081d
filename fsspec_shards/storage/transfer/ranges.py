"""Filling a file with an object: hashing off the receiving thread, writeback started as
the bytes arrive, and several ranged GETs at once.

:class:`OrderedHasher` hashes on a worker thread what a download hands it, in the order
handed: pieces of bytes, or a stretch of the file being filled (read back with ``os.pread``
as far as a :class:`Frontier` says it is written). The receiving thread never waits for the
hash; hashlib and google-crc32c release the GIL on large buffers, so the two overlap.

:class:`Writeback` asks the kernel to start writing what was written so far to disk
(``sync_file_range(SYNC_FILE_RANGE_WRITE)``, which does not wait), so that making the file
durable later finds little left to write: the disk works while the network does.

:func:`fill_ranges` fills a pre-allocated file with ranged GETs, as many in flight as
``range_plan.Ramp`` allows, each written where it belongs with ``os.pwrite``: the object
in equal ranges, one request each, and a stream left without one takes the second half of
the range with the most bytes left (``range_plan.split_point``). The filling thread, which
only waits otherwise, starts the writeback of what each range wrote.

Invariants:

- Only for an object with a version identity (ETag, generation or version id) that every
  response is checked against: each range is requests of the version ``expect`` names
  (the transport checks it before a byte is written), so ranges of two versions never mix.
  A response of another version stops every range and raises ``VersionMismatch``; one that
  says nothing of its version counts in ``expect.unconfirmed``, for the caller to ask
  ``info()`` (``planner.py``).
- More than one range only after the first was answered as a range (206), or on a store
  that answered ranges before in this process (a later 200 is sliced to its range: waste,
  never wrong bytes).
- Each range resumes from the byte it reached after a fault, with its own failure chain
  (``target.resume``); a permanent failure, or a chain spent, stops every range and is
  raised. A stopped range ends at its next byte or fault, never asking again.
- The hasher sees the object's bytes in order, each exactly once, as they lie in the file
  (so what is verified is what was written).
"""

from __future__ import annotations

import ctypes
import os
import queue
import threading
from collections.abc import Callable
from typing import BinaryIO

from fsspec_shards.checksums import Checksum
from fsspec_shards.storage.backends.versions import Unproven, Version, VersionMismatch
from fsspec_shards.storage.core.retry import TransientError
from fsspec_shards.storage.core.verification import WholeHasher
from fsspec_shards.storage.transfer.range_plan import Ramp, Stopped, run_stream, split_point
from fsspec_shards.storage.transfer.target import ChunkSizer, FillRate, Target, resume

_READ_BACK = 8 * 1024 * 1024
_PIECES_QUEUED = 64
"""Pieces handed over and not hashed yet before :meth:`OrderedHasher.update` waits: bounds
the memory held when hashing falls behind the network."""
_WRITEBACK_EVERY = 8 * 1024 * 1024
_WRITE_BYTES = 2 * 1024 * 1024
"""Received pieces are gathered into writes of about this many bytes (:class:`Gathered`)."""
_WRITEBACK_POLL = 0.05
_SYNC_FILE_RANGE_WRITE = 2  # <fcntl.h>: start writeback of dirty pages, do not wait
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


class _Range:
    """One range of a fill: bytes ``[start, end)``, ``claimed`` of them handed to a write
    and ``written`` of them in the file, ``written_back`` of them handed to the disk's
    writeback; ``asked`` is where its request ends (beyond ``end`` once another stream split
    it off). ``open_ended``: the first range of a fill whose answer may be the whole object
    (a 200), written on past ``end``."""

    __slots__ = ("start", "claimed", "written", "written_back", "end", "asked", "open_ended")

    def __init__(self, start: int, end: int, open_ended: bool) -> None:
        self.start = self.claimed = self.written = self.written_back = start
        self.end = self.asked = end
        self.open_ended = open_ended


class _RangeEnds(Exception):
    """A range reached its end before its request did (another stream split it off):
    raised from the sink to end that request."""


class _Layout:
    """The ranges of one fill: handed out front to back (sized by the ramp), then split for
    streams that have none (``range_plan.split_point``); how far each is written, hence the
    :class:`Frontier` of the file. Ranges are kept in the order of their bytes."""

    def __init__(self, size: int, ramp: Ramp) -> None:
        self.size = size
        self.ramp = ramp
        self.cursor = 0
        self.ranges: list[_Range] = []
        self.frontier = Frontier(0)
        self.finished = threading.Event()
        """Set when the whole file is written (or a stream failed: ``run_stream``)."""
        self._whole = 0  # the leading ranges written whole (the frontier is past them)
        self._lock = threading.Lock()

    def take(self) -> _Range | None:
        """The next range to fetch, or None when there is none worth a request."""
        with self._lock:
            if self.cursor < self.size:
                length = self.ramp.span(self.size - self.cursor)
                taken = _Range(self.cursor, self.cursor + length, not self.ramp.answered)
                self.ranges.append(taken)
                self.cursor += length
                return taken
            widest = max(
                (r for r in self.ranges[self._whole :] if not r.open_ended),
                key=lambda r: r.end - r.claimed,
                default=None,
            )
            if widest is None or (point := split_point(widest.claimed, widest.end)) is None:
                return None
            taken = _Range(point, widest.end, False)
            widest.end = point
            self.ranges.insert(self.ranges.index(widest) + 1, taken)
            return taken

    def claim(self, taken: _Range, amount: int) -> tuple[int, int]:
        """Where the next ``amount`` bytes of ``taken``'s request go, and how many of them
        belong to it (fewer: its end came first)."""
        with self._lock:
            at = taken.claimed
            if taken.open_ended:  # a 200 answer runs on to the object's end
                taken.end = self.cursor = max(taken.end, min(self.size, at + amount))
            length = max(0, min(amount, taken.end - at))
            taken.claimed = at + length
            return at, length

    def to_write_back(self, at_least: int) -> list[tuple[int, int]]:
        """The stretches ``(offset, length)`` written since their last writeback, where
        ``at_least`` bytes (or a range's end) are; marked as handed to writeback."""
        stretches = []
        with self._lock:
            for current in self.ranges:
                length = current.written - current.written_back
                if length >= at_least or (length and current.written >= current.end):
                    stretches.append((current.written_back, length))
                    current.written_back = current.written
        return stretches

    def wrote(self, taken: _Range, amount: int) -> None:
        """``amount`` more bytes of ``taken`` (claimed before) are in the file."""
        with self._lock:
            taken.written += amount
            frontier = self.frontier.value
            # from the last whole range on (a 200 answer still grows the first)
            for number in range(max(0, self._whole - 1), len(self.ranges)):
                current = self.ranges[number]
                if current.start > frontier:
                    break
                frontier = max(frontier, current.written)
                if current.written < current.end:
                    break
                self._whole = number + 1
        self.frontier.advance(frontier)
        if frontier >= self.size:
            self.finished.set()


def _write_back_while_filling(descriptor: int, layout: _Layout) -> None:
    """Until the fill ends, start the disk's writeback of what the ranges wrote, every
    ``_WRITEBACK_EVERY`` bytes of a range (the receiving threads never make the call), so
    making the file durable later finds little left to write."""
    if _start_writeback is None:  # no such call here: only wait
        layout.finished.wait()
        return
    while not layout.finished.wait(_WRITEBACK_POLL):
        for offset, length in layout.to_write_back(_WRITEBACK_EVERY):
            _start_writeback(descriptor, offset, length, _SYNC_FILE_RANGE_WRITE)


def fill_ranges(
    target: Target,
    descriptor: int,
    expect: Version,
    hasher: OrderedHasher | None,
    on_bytes: Callable[[int], None],
) -> None:
    """Write the object (``expect.size`` bytes) into the pre-allocated file ``descriptor``
    by ranged GETs, as many at once as ``range_plan.Ramp`` allows for
    ``target.ranges_in_flight``; the hasher reads the file back in order as it fills.
    Raises ``VersionMismatch`` when the object changed, or the failure that ended a range."""
    ramp = Ramp(target.ranges_in_flight, target.link, target.plan_dir, eager=True)
    layout = _Layout(expect.size, ramp)
    if hasher is not None:
        hasher.update_from_file(descriptor, 0, expect.size, layout.frontier)
    streams = _RangeStreams(target, descriptor, expect, layout, on_bytes)
    streams.run()
    if streams.failures:
        failures = streams.failures
        changed = next((f for f in failures if isinstance(f, VersionMismatch | Unproven)), None)
        raise changed or failures[0]
    if layout.frontier.value < expect.size:
        raise TransientError(
            f"{target.shown}: ranges ended at byte {layout.frontier.value} of {expect.size}"
        )


class _RangeStreams:
    """The streams of one fill by ranges: ``ramp.cap`` threads, each taking ranges from the
    layout (``range_plan.run_stream``) and writing what arrives where it belongs, while the
    calling thread starts the writeback of what they wrote."""

    def __init__(
        self,
        target: Target,
        descriptor: int,
        expect: Version,
        layout: _Layout,
        on_bytes: Callable[[int], None],
    ) -> None:
        self.target = target.in_fill(FillRate())  # (min_rate is the fill's: target.py)
        self.descriptor = descriptor
        self.expect = expect
        self.layout = layout
        self.ramp = layout.ramp
        self.on_bytes = on_bytes
        self.stop = threading.Event()
        self.failures: list[BaseException] = []
        self.counted = threading.Lock()
        self.running = self.ramp.cap

    def run(self) -> None:
        """Every stream run to its end (the file whole, or a stream failed)."""
        workers = [
            threading.Thread(
                target=self._work, args=(n,), name=f"fsspec-shards-range-{n}", daemon=True
            )
            for n in range(self.ramp.cap)
        ]
        for worker in workers:
            worker.start()
        try:
            self.ramp.steer(self.layout.finished)
            _write_back_while_filling(self.descriptor, self.layout)
        finally:
            self.ramp.close()
            for worker in workers:
                worker.join()

    def _work(self, worker: int) -> None:
        layout = self.layout
        try:
            run_stream(
                self.ramp,
                worker,
                layout.take,
                self._fetch,
                self.stop,
                self.failures,
                layout.finished,
            )
        finally:
            with self.counted:
                self.running -= 1
                if not self.running:  # (the file is whole by now, unless a stream failed)
                    layout.finished.set()

    def _fetch(self, worker: int, taken: _Range) -> None:
        """One range fetched (resumed after faults) and written; its answer tells the ramp
        whether the store honours ranges."""

        def write(at: int, view: memoryview) -> None:
            pwrite_all(self.descriptor, view, at)
            self.layout.wrote(taken, len(view))

        gathered = Gathered(write)
        first = taken.open_ended
        try:
            moved = resume(
                self.target,
                taken.start,
                taken.asked,
                lambda data: self._received(worker, taken, gathered, data),
                self.expect,
                rest_of_body=first,
                chunks=ChunkSizer(),
                after_fault=lambda: self._after_fault(taken),
                passthrough=(Stopped, _RangeEnds),
            )
        except _RangeEnds:
            return
        finally:
            gathered.flush()  # (also after a failure: what was received is in the file)
        status = getattr(moved.facts, "status", None)
        if first:
            taken.open_ended = False
            self.ramp.ranges_answered(status == 206)
        elif status == 200 and taken.start > 0:  # (an eager fill's added stream)
            self.ramp.ranges_answered(False)

    def _received(self, worker: int, taken: _Range, gathered: Gathered, data: bytes) -> None:
        """The sink of ``taken``'s request: what belongs to it gathered for writing."""
        if self.stop.is_set():
            raise Stopped
        at, length = self.layout.claim(taken, len(data))
        if length:
            gathered.add(at, data if length == len(data) else memoryview(data)[:length])
            self.ramp.moved(worker, length)
            with self.counted:
                self.on_bytes(length)
        if taken.claimed >= taken.end < taken.asked:
            raise _RangeEnds  # split off: the rest is another stream's

    def _after_fault(self, taken: _Range) -> None:
        if self.stop.is_set():  # a request that failed after another range did: no retry
            raise Stopped
        if taken.claimed >= taken.end:  # split off while it failed: nothing left
            raise _RangeEnds
