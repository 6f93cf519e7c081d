"""Fetch the next shards of a consumer's order into the storage cache in background threads.

Only filesystems with a ``prefetch(path)`` method (the ``wds`` protocol) are prefetched; for
others :class:`ShardPrefetcher` does nothing. At most ``depth`` shards are fetched or queued
at a time. A prefetch failure is kept, not raised, and handed to the reader when it reaches
that shard (:meth:`ShardPrefetcher.wait`), so it goes through the dataset's error handler.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from fsspec_shards.redact import redact_url

logger = logging.getLogger("fsspec_shards.prefetch")

Locate = Callable[[str], tuple[Any, str]]


class ShardPrefetcher:
    """Keeps the ``depth`` shards after the one being read fetched or fetching."""

    def __init__(self, urls: Sequence[str], locate: Locate, depth: int) -> None:
        self.urls = list(urls)
        self.locate = locate
        self.depth = depth
        self._futures: dict[int, Future] = {}
        self._executor: ThreadPoolExecutor | None = None

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
            if self._executor is None:
                self._executor = ThreadPoolExecutor(
                    max_workers=self.depth, thread_name_prefix="fsspec-shards-prefetch"
                )
            logger.debug("prefetching %s", redact_url(self.urls[index]))
            self._futures[index] = self._executor.submit(prefetch, path)

    def wait(self, index: int) -> BaseException | None:
        """Wait for the prefetch of shard ``index``, if any; return its error, if any."""
        future = self._futures.pop(index, None)
        if future is None or future.cancelled():
            return None
        return future.exception()

    def close(self) -> None:
        """Cancel queued prefetches; a fetch already running finishes in its thread.

        Every submitted future not yet waited for is in ``_futures``, so cancelling those
        cancels the queue. Not ``shutdown(cancel_futures=True)``: that drains the queue with
        ``except queue.Empty``, which fails when a generator closes this at interpreter exit,
        after the ``queue`` module's globals are cleared.
        """
        for future in self._futures.values():
            future.cancel()
        self._futures.clear()
        if self._executor is not None:
            self._executor.shutdown(wait=False)
            self._executor = None


def _failed(error: BaseException) -> Future:
    future: Future = Future()
    future.set_exception(error)
    return future
