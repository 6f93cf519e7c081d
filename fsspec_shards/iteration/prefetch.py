"""Fetch the next shards of a consumer's order into the storage cache in background threads.

Only filesystems with a ``prefetch(path)`` method (the ``wds`` protocol) are prefetched; for
others :class:`ShardPrefetcher` does nothing. At most ``depth`` shards are fetched or queued
at a time. A prefetch failure is kept, not raised, and handed to the reader when it reaches
that shard (:meth:`ShardPrefetcher.wait`), so it goes through the dataset's error handler.

``depth="auto"`` (``ShardDataset``'s default) steps through :data:`AUTO_DEPTHS` (2, 4, 8
shards ahead). It starts at two and takes the next step the first time the reader waits
:data:`AUTO_DEEPEN_AFTER` or more for a shard still being fetched whose fetch took at least
:data:`AUTO_BEHIND` times what reading the shard before it did: where one connection is
slow (an object store far away carries tens of MB/s per connection), fetching a shard takes
several times what reading it does, and only that many fills in flight keep the reader fed;
where fills keep up or nearly (a local disk, a warm cache), it stays at two. A reader only
a little behind could not take what a deeper step must bring to be kept even on a link
paced per connection, while on a link capped as a whole the probe would cost it: there the
wait at a stream's start is mostly the first two fetches splitting the link, and the
reader, which fetched its first shard alone, is behind only by that (``docs/benchmarks.md``,
issue 36). A deeper step is kept only if its first fetch that ran beside more fetches than
the step below allows brings enough more fetches per second (:data:`AUTO_GROWTH`) than the
step below did (for the first step: the fetch whose wait took the second, not its fastest,
which may have run beside another only for a moment); then the next step is taken at once
(no wait for another late shard), else the depth goes back one step for the rest of the
stream. On a link capped per connection more fetches at once add rate in proportion, and 4
then 8 follow within a fetch; on a link capped as a whole they only share it and every
shard in flight arrives later, which the probe of 4 costs once per stream where the reader
is far enough behind to take the step (less than trying 8 at once did; a probe of 3 cost
less still, but gave back the gain on a link paced per connection).

The threads are daemon threads, started when there is work and ending when the prefetcher
is closed or has had none for ``LINGER_SECONDS``: a stream over cached shards, whose
prefetches take a millisecond, hands each shard to a waiting thread instead of starting one
(a start cost the reading thread 5-10 ms on a loaded machine, a few times what reading a
cached 3 MiB shard takes). A process that exits (or a DataLoader worker that is shut down)
with an iterator alive does not wait for its prefetches, which only warm a cache that
survives a fill cut short.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

from fsspec_shards.redact import redact_url

logger = logging.getLogger("fsspec_shards.prefetch")

Locate = Callable[[str], tuple[Any, str]]
LINGER_SECONDS = 1.0
"""How long a prefetch thread with nothing to do waits for more before it ends."""
AUTO_DEPTHS = (2, 4, 8)
"""The steps of ``depth="auto"``, shards fetched ahead (and threads run). The last is
enough for a 3 MiB shard at 25 MB/s per connection plus a HEAD's round trip to keep up
with a reader of two cores, and a bound on the cache space held ahead of the reader."""
AUTO_GROWTH = 0.5
"""The share of the proportional gain that a step must bring to be kept: from ``d`` to
``e`` fetches at once, at least ``1 + AUTO_GROWTH * (e / d - 1)`` times the fetches per
second of the step below (1.5x from 2 to 4, and from 4 to 8). On a link capped per
connection more fetches at once add rate in proportion; on a link capped as a whole they
only share it, and the next shard, which the reader waits for, arrives later."""
AUTO_DEEPEN_AFTER = 0.1
"""Seconds the reader waits for a prefetch that make ``depth="auto"`` take its second step.
A local disk fills a shard in tens of milliseconds, and its waits are the fills' own work
(copying, hashing, the cache's index and locks), which more fills at once only slow down (a
cold pass over 18 local 3 MiB shards took 1.3x as long at depth 8); a 3 MiB shard at
25 MB/s per connection makes the reader wait about 0.2 s."""
AUTO_BEHIND = AUTO_DEPTHS[0] * (1 + AUTO_GROWTH * (AUTO_DEPTHS[1] / AUTO_DEPTHS[0] - 1))
"""How many times the reader's time on a shard the fetch it waited for must have taken for
``depth="auto"`` to take its second step (3): a reader that reads a shard in a third of a
fetch's time could take the 1.5x fetches per second (:data:`AUTO_GROWTH`) the step must
bring to be kept; one less behind could not, whatever the link."""


class ShardPrefetcher:
    """Keeps the ``depth`` shards after the one being read fetched or fetching (an int, or
    ``"auto"``: module docstring)."""

    def __init__(self, urls: Sequence[str], locate: Locate, depth: int | str) -> None:
        self.urls = list(urls)
        self.locate = locate
        self.auto = depth == "auto"
        self.depth = AUTO_DEPTHS[0] if self.auto else int(depth)
        self._futures: dict[int, Future] = {}
        self._queue: deque[tuple[Future, Callable[[str], Any], str]] = deque()
        self._lock = threading.Lock()
        self._more = threading.Condition(self._lock)
        self._threads = 0
        self._idle = 0
        self._max_threads = self.depth
        self._closed = False
        self._peaks: list[list[int]] = []  # per fetch running: [most running beside it, step]
        self._step = 0  # auto: the index of the depth in AUTO_DEPTHS
        self._rates = [0.0] * len(AUTO_DEPTHS)  # auto: fetches per second at each step
        self._settled = False  # auto: a step was given up, or the last one kept
        self._took: dict[Future, tuple[float, int]] = {}  # auto: a finished fetch's seconds,
        # and the most fetches that ran beside it
        self._reading_since: float | None = None  # auto: the current shard's first sample
        self._reading = -1  # auto: the index of the shard being read

    def advance(self, current: int) -> None:
        """The reader is at shard ``current``: start fetching the next ``depth`` shards."""
        if self.auto and current != self._reading:
            self._reading, self._reading_since = current, time.perf_counter()
        for index in range(current + 1, min(current + 1 + self.depth, len(self.urls))):
            if index in self._futures:
                continue
            try:
                fs, path = self.locate(self.urls[index])
            except (OSError, ValueError) as exc:
                self._futures[index] = _failed(exc)
                continue
            prefetch = getattr(fs, "prefetch", None)
            if prefetch is None:
                continue
            logger.debug("prefetching %s", redact_url(self.urls[index]))
            future: Future = Future()
            self._futures[index] = future
            self._submit(future, prefetch, path)

    def _submit(self, future: Future, prefetch: Callable[[str], Any], path: str) -> None:
        with self._lock:
            self._queue.append((future, prefetch, path))
            if self._idle >= len(self._queue):
                self._more.notify()
                return
            if self._threads >= self._max_threads:
                return
            self._threads += 1
        thread = threading.Thread(
            target=self._work, name=f"fsspec-shards-prefetch-{self._threads}", daemon=True
        )
        thread.start()

    def _work(self) -> None:
        """Run queued prefetches until the prefetcher closes or none comes for
        ``LINGER_SECONDS``; each outcome goes to its future."""
        while True:
            with self._lock:
                while not self._queue:
                    if self._closed:
                        self._threads -= 1
                        return
                    self._idle += 1
                    woken = self._more.wait(LINGER_SECONDS)
                    self._idle -= 1
                    if not woken and not self._queue:
                        self._threads -= 1
                        return
                future, prefetch, path = self._queue.popleft()
            if not future.set_running_or_notify_cancel():
                continue
            peak, started = self._started(), time.perf_counter()
            try:
                result = prefetch(path)
            except BaseException as exc:  # handed to wait(), as an executor does
                self._ended(peak, started, future)
                future.set_exception(exc)
            else:
                self._ended(peak, started, future)
                future.set_result(result)

    def _started(self) -> list[int]:
        """A fetch starts: its record of the most fetches running beside it (itself too)."""
        with self._lock:
            peak = [len(self._peaks) + 1, self._step]
            self._peaks.append(peak)
            for other in self._peaks:
                other[0] = max(other[0], len(self._peaks))
            return peak

    def _ended(self, peak: list[int], started: float, future: Future | None = None) -> None:
        """A fetch ended: under ``"auto"``, the time it took is kept for :meth:`wait` (the
        first step's rate is that of the fetch whose wait takes the second), and its rate
        (fetches running beside it over that time) says whether the step it started at pays
        (:data:`AUTO_GROWTH`): then the next step is taken, else the depth goes back one."""
        took = max(time.perf_counter() - started, 1e-6)
        with self._lock:
            self._peaks.remove(peak)
            if not self.auto or self._settled:
                return
            running, step = peak
            if future is not None:
                self._took[future] = (took, running)
            rate = running / took
            if step == 0 or step != self._step or running <= AUTO_DEPTHS[step - 1]:
                return  # the first step's, or no deeper than the step below: decides nothing
            below = self._rates[step - 1]
            self._rates[step] = rate
            gain = AUTO_DEPTHS[step] / AUTO_DEPTHS[step - 1] - 1
            if rate < (1 + AUTO_GROWTH * gain) * below:
                self._step = step - 1
                self._settled = True
            elif step + 1 < len(AUTO_DEPTHS):
                self._step = step + 1
            else:
                self._settled = True
            self.depth = self._max_threads = AUTO_DEPTHS[self._step]
            logger.debug(
                "%.1f fetches/s at depth %d, %.1f at %d: %d shards ahead",
                below,
                AUTO_DEPTHS[step - 1],
                rate,
                running,
                self.depth,
            )

    def wait(self, index: int) -> BaseException | None:
        """Wait for the prefetch of shard ``index``, if any; return its error, if any. Under
        ``"auto"``, the first wait that :func:`behind` says the reader could take more
        fetches for makes the next :meth:`advance` take the second step of
        :data:`AUTO_DEPTHS`."""
        future = self._futures.pop(index, None)
        if future is None or future.cancelled():
            return None
        if self.auto and self._step == 0 and not self._settled and not future.done():
            started = time.perf_counter()
            error = future.exception()
            waited = time.perf_counter() - started
            read = None if self._reading_since is None else started - self._reading_since
            with self._lock:
                took, running = self._took.pop(future, (None, 0))
                if self._step == 0 and not self._settled and behind(waited, took, read):
                    self._rates[0] = running / took if took else 0.0
                    self._step = 1
                    self.depth = self._max_threads = AUTO_DEPTHS[1]
            logger.debug(
                "waited %.3f s for a prefetch of %.3f s after %.3f s of reading: %d shards ahead",
                waited,
                took or 0.0,
                read or 0.0,
                self.depth,
            )
            return error
        self._took.pop(future, None)
        return future.exception()

    def close(self) -> None:
        """Cancel queued prefetches; a fetch already running finishes in its thread (or ends
        with the process). A generator's ``finally`` may call this at interpreter exit, so it
        only cancels: no executor shutdown, whose queue drain fails once modules are cleared."""
        with self._lock:
            self._closed = True
            self._queue.clear()
            self._more.notify_all()
        for future in self._futures.values():
            future.cancel()
        self._futures.clear()


def behind(waited: float, took: float | None, read: float | None) -> bool:
    """Whether a reader that ``waited`` seconds for a fetch that ``took`` seconds, after
    ``read`` seconds on the shard before it, is behind enough for ``depth="auto"``'s second
    step: a wait of :data:`AUTO_DEEPEN_AFTER` or more for a fetch of :data:`AUTO_BEHIND`
    times the read or more (either unknown: the wait alone)."""
    if waited < AUTO_DEEPEN_AFTER:
        return False
    return took is None or read is None or took >= AUTO_BEHIND * read


def _failed(error: BaseException) -> Future:
    future: Future = Future()
    future.set_exception(error)
    return future
