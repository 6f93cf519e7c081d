"""Several ranged GETs at once: a pre-allocated file filled by ranges in flight.

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
- The hasher (:class:`~.one_stream.OrderedHasher`) reads the file back in order as the
  ranges fill it (:class:`~.one_stream.Frontier`), so what is verified is what was written.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from fsspec_shards.storage.backends.versions import Unproven, Version, VersionMismatch
from fsspec_shards.storage.core.retry import TransientError
from fsspec_shards.storage.transfer.one_stream import (
    SYNC_FILE_RANGE_WRITE,
    WRITEBACK_EVERY,
    Frontier,
    Gathered,
    OrderedHasher,
    pwrite_all,
    start_writeback,
)
from fsspec_shards.storage.transfer.range_plan import Ramp, Stopped, run_stream, split_point
from fsspec_shards.storage.transfer.target import ChunkSizer, FillRate, Target, resume

_WRITEBACK_POLL = 0.05


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
    ``WRITEBACK_EVERY`` bytes of a range (the receiving threads never make the call), so
    making the file durable later finds little left to write."""
    if start_writeback is None:  # no such call here: only wait
        layout.finished.wait()
        return
    while not layout.finished.wait(_WRITEBACK_POLL):
        for offset, length in layout.to_write_back(WRITEBACK_EVERY):
            start_writeback(descriptor, offset, length, SYNC_FILE_RANGE_WRITE)


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
