"""Hits without write transactions: access times and counters batched in memory.

Invariants:

- A hit records its key's use and counts in this process's memory only; a background
  timer writes what gathered to the index in one transaction, at most once a second, and
  so does process exit (``atexit``, and multiprocessing's exit of forked workers, which
  skips ``atexit``). Least-recently-used order is therefore exact up to that one-second
  window; an eviction made by this process writes its own first.
- Writing a use re-stores the entry (:meth:`.Index.record_usage`): its place only moves
  forward, so a late batch never makes a file look older.
- A forked child starts with nothing pending: what the parent gathered, the parent writes.
- When the index cannot be written (read-only), counts stay in memory, and
  :meth:`Usage.pending_counts` lets the cache report them.
"""

from __future__ import annotations

import atexit
import logging
import os
import sqlite3
import threading
import time
import weakref
from multiprocessing import util as multiprocessing_util

from fsspec_shards.storage.cache.index import Index

logger = logging.getLogger("fsspec_shards.storage.cache")

FLUSH_INTERVAL_SECONDS = 1.0
_LIVE: weakref.WeakSet[Usage] = weakref.WeakSet()
_EXIT_HOOK_PID = [-1]


def flush_all() -> None:
    """Write what every cache of this process gathered (at exit)."""
    for usage in list(_LIVE):
        usage.flush()


def _register_exit_hook() -> None:
    if _EXIT_HOOK_PID[0] == os.getpid():
        return
    _EXIT_HOOK_PID[0] = os.getpid()
    atexit.register(flush_all)
    multiprocessing_util.Finalize(None, flush_all, exitpriority=10)


class Usage:
    """Access times and counter increments of one index, pending in this process."""

    def __init__(self, index: Index | None) -> None:
        self._index = index
        self._reset()
        _LIVE.add(self)

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._touches: dict[str, float] = {}
        self._counts: dict[str, int] = {}
        self._timer: threading.Timer | None = None

    def touch(self, key: str, count: bool = True) -> None:
        """A hit of ``key``: its access time is now; with ``count``, one more hit."""
        if self._pid != os.getpid():
            self._reset()
        now = time.time()
        with self._lock:
            if self._writable():
                self._touches[key] = now
            if count:
                self._counts["hits"] = self._counts.get("hits", 0) + 1
            if self._timer is None and self._writable():
                self._start_timer()

    def add(self, name: str, amount: int = 1) -> None:
        """Add ``amount`` to counter ``name``."""
        if self._pid != os.getpid():
            self._reset()
        with self._lock:
            self._counts[name] = self._counts.get(name, 0) + amount
            if self._timer is None and self._writable():
                self._start_timer()

    def _writable(self) -> bool:
        return self._index is not None and self._index.writable

    def _start_timer(self) -> None:
        """Called with the lock held, when something became pending."""
        _register_exit_hook()
        timer = threading.Timer(FLUSH_INTERVAL_SECONDS, self._on_timer)
        timer.daemon = True
        self._timer = timer
        timer.start()

    def _on_timer(self) -> None:
        with self._lock:
            self._timer = None
        self.flush()

    def forget(self) -> None:
        """Drop what is pending (the cache was cleared)."""
        with self._lock:
            self._touches, self._counts = {}, {}

    def pending_counts(self) -> dict[str, int]:
        """Counter increments not written to the index (yet)."""
        if self._pid != os.getpid():
            self._reset()
        with self._lock:
            return dict(self._counts)

    def flush(self) -> None:
        """Write what is pending now, in one transaction (with it the files this process
        synced: :meth:`.Index.note_durable`); kept for later if that fails."""
        if self._pid != os.getpid():
            self._reset()
            return
        if not self._writable():
            return
        with self._lock:
            touches, counts = self._touches, self._counts
            self._touches, self._counts = {}, {}
        if not touches and not counts and not self._index.durable_unrecorded():
            return
        try:
            self._index.record_usage(touches, counts)
        except (OSError, sqlite3.Error) as error:
            with self._lock:
                for key, when in touches.items():
                    self._touches[key] = max(when, self._touches.get(key, when))
                for name, amount in counts.items():
                    self._counts[name] = self._counts.get(name, 0) + amount
            if self._index.writable:
                logger.debug("could not record cache usage in %s: %s", self._index.path, error)
