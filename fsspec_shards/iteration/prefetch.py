"""Fetch the next shards of a consumer's order into the storage cache in background threads.

Only filesystems with a ``prefetch(path)`` method (the ``wds`` protocol) are prefetched; for
others :class:`ShardPrefetcher` does nothing. At most ``depth`` shards are fetched or queued
at a time. A prefetch failure is kept, not raised, and handed to the reader when it reaches
that shard (:meth:`ShardPrefetcher.wait`), so it goes through the dataset's error handler.

``depth="auto"`` (``ShardDataset``'s default) starts at :data:`AUTO_DEPTH` and goes to
:data:`AUTO_MAX_DEPTH` the first time the reader waits :data:`AUTO_DEEPEN_AFTER` or more for
a shard still being fetched: where one connection is slow (an object store far away carries
tens of MB/s per connection), fetching a shard takes several times what reading it does,
and only that many fills in flight keep the reader fed; where fills keep up or nearly (a
local disk, a warm cache), it stays at two. Doubling instead (2, 4, 8) cost a wait per step:
slower in the 9 shards per worker of ``benchmarks/bench_peers.py``. The first fetch that
ran at the deep level says whether it pays (:data:`AUTO_GROWTH`): on a link capped as a
whole it does not (the fetches only share the link, and the next shard arrives later), and
the depth goes back to two for the rest of the stream.

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
AUTO_DEPTH = 2
"""Shards fetched ahead at the start of a stream under ``depth="auto"``."""
AUTO_MAX_DEPTH = 8
"""The most shards ``depth="auto"`` fetches ahead (and threads it runs): enough for a
3 MiB shard at 25 MB/s per connection plus a HEAD's round trip to keep up with a reader
of two cores, and a bound on the cache space held ahead of the reader."""
AUTO_GROWTH = 1.5
"""Fetches per second that the deep level must bring over the shallow one's to be kept: on
a link capped per connection more fetches at once add rate; on a link capped as a whole
they only share it, and the next shard, which the reader waits for, arrives later."""
AUTO_DEEPEN_AFTER = 0.1
"""Seconds the reader waits for a prefetch that make ``depth="auto"`` fetch
:data:`AUTO_MAX_DEPTH` ahead. A local disk fills a shard in tens of milliseconds, and its
waits are the fills' own work (copying, hashing, the cache's index and locks), which more
fills at once only slow down (a cold pass over 18 local 3 MiB shards took 1.3x as long at
depth 8); a 3 MiB shard at 25 MB/s per connection makes the reader wait about 0.2 s."""


class ShardPrefetcher:
    """Keeps the ``depth`` shards after the one being read fetched or fetching (an int, or
    ``"auto"``: module docstring)."""

    def __init__(self, urls: Sequence[str], locate: Locate, depth: int | str) -> None:
        self.urls = list(urls)
        self.locate = locate
        self.auto = depth == "auto"
        self.depth = AUTO_DEPTH if self.auto else int(depth)
        self._futures: dict[int, Future] = {}
        self._queue: deque[tuple[Future, Callable[[str], Any], str]] = deque()
        self._lock = threading.Lock()
        self._more = threading.Condition(self._lock)
        self._threads = 0
        self._idle = 0
        self._max_threads = self.depth
        self._closed = False
        self._peaks: list[list[int]] = []  # per fetch running: the most running beside it
        self._shallow_rate = 0.0  # fetches per second at AUTO_DEPTH (auto)
        self._deepened = False
        self._settled = False  # auto: the deep level was measured, kept or given up

    def advance(self, current: int) -> None:
        """The reader is at shard ``current``: start fetching the next ``depth`` shards."""
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
                self._ended(peak, started)
                future.set_exception(exc)
            else:
                self._ended(peak, started)
                future.set_result(result)

    def _started(self) -> list[int]:
        """A fetch starts: its record of the most fetches running beside it (itself too)."""
        with self._lock:
            peak = [len(self._peaks) + 1, self._deepened]
            self._peaks.append(peak)
            for other in self._peaks:
                other[0] = max(other[0], len(self._peaks))
            return peak

    def _ended(self, peak: list[int], started: float) -> None:
        """A fetch ended: under ``"auto"``, its rate (fetches running beside it over the time
        it took) is the shallow level's, or says whether the deep level pays
        (:data:`AUTO_GROWTH`); a deep level that does not goes back to :data:`AUTO_DEPTH`."""
        took = max(time.perf_counter() - started, 1e-6)
        with self._lock:
            self._peaks.remove(peak)
            if not self.auto or self._settled:
                return
            running, deep = peak
            rate = running / took
            if not deep:
                if took >= AUTO_DEEPEN_AFTER:  # a shard already cached says nothing of the link
                    self._shallow_rate = max(self._shallow_rate, rate)
            elif running > AUTO_DEPTH:
                self._settled = True
                if rate < AUTO_GROWTH * self._shallow_rate:
                    self.depth = self._max_threads = AUTO_DEPTH
                logger.debug(
                    "%.1f fetches/s at depth %d, %.1f at %d: %d shards ahead",
                    self._shallow_rate,
                    AUTO_DEPTH,
                    rate,
                    running,
                    self.depth,
                )

    def wait(self, index: int) -> BaseException | None:
        """Wait for the prefetch of shard ``index``, if any; return its error, if any. Under
        ``"auto"``, a wait of :data:`AUTO_DEEPEN_AFTER` or more deepens the next
        :meth:`advance` to :data:`AUTO_MAX_DEPTH`."""
        future = self._futures.pop(index, None)
        if future is None or future.cancelled():
            return None
        if self.auto and self.depth < AUTO_MAX_DEPTH and not future.done():
            started = time.perf_counter()
            error = future.exception()
            waited = time.perf_counter() - started
            with self._lock:
                if waited >= AUTO_DEEPEN_AFTER and not self._settled:
                    self.depth = self._max_threads = AUTO_MAX_DEPTH
                    self._deepened = True
            logger.debug("waited %.3f s for a prefetch: %d shards ahead", waited, self.depth)
            return error
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


def _failed(error: BaseException) -> Future:
    future: Future = Future()
    future.set_exception(error)
    return future
