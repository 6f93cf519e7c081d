"""Hits almost without write transactions: access times and counters batched in memory.

Invariants:

- A hit records its key's use and counts in this process's memory only; the first use
  that finds the batch :data:`FLUSH_INTERVAL_SECONDS` old writes it to the index in one
  transaction, on its own thread before it returns, and so does process exit (``atexit``,
  and multiprocessing's exit of forked workers, which skips ``atexit``). Least-recently-used
  order is therefore exact up to that one-second window while the process uses the cache
  (what an idle process gathered waits for its next use or its exit); an eviction made by
  this process writes its own first.
- Nothing is written on a thread of its own: once a call of the cache returned, nothing
  of this process creates a file in the cache directory (a caller may remove it).
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

import diskcache

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
        self._pending_since: float | None = None
        """When the batch began (monotonic; None: nothing pending to write)."""

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
            due = self._due()
        if due:
            self.flush()

    def add(self, name: str, amount: int = 1) -> None:
        """Add ``amount`` to counter ``name``."""
        if self._pid != os.getpid():
            self._reset()
        with self._lock:
            self._counts[name] = self._counts.get(name, 0) + amount
            due = self._due()
        if due:
            self.flush()

    def _writable(self) -> bool:
        return self._index is not None and self._index.writable

    def _due(self) -> bool:
        """Called with the lock held, after something became pending: whether the batch
        is a flush interval old (the caller writes it)."""
        if not self._writable():
            return False
        now = time.monotonic()
        if self._pending_since is None:
            _register_exit_hook()
            self._pending_since = now
        return now - self._pending_since >= FLUSH_INTERVAL_SECONDS

    def forget(self) -> None:
        """Drop what is pending (the cache was cleared)."""
        with self._lock:
            self._touches, self._counts = {}, {}
            self._pending_since = None

    def pending_counts(self) -> dict[str, int]:
        """Counter increments not written to the index (yet)."""
        if self._pid != os.getpid():
            self._reset()
        with self._lock:
            return dict(self._counts)

    def flush(self) -> None:
        """Write what is pending now, in one transaction (with it the files this process
        synced: :meth:`.Index.note_durable`); kept for later if that fails (a use, of a
        hit's thread too, never sees the failure)."""
        if self._pid != os.getpid():
            self._reset()
            return
        if not self._writable():
            return
        with self._lock:
            touches, counts = self._touches, self._counts
            self._touches, self._counts = {}, {}
            self._pending_since = None
        if not touches and not counts and not self._index.durable_unrecorded():
            return
        try:
            self._index.record_usage(touches, counts)
        except (OSError, sqlite3.Error, diskcache.Timeout) as error:
            with self._lock:
                if self._pending_since is None:  # tried again a flush interval from now
                    self._pending_since = time.monotonic()
                for key, when in touches.items():
                    self._touches[key] = max(when, self._touches.get(key, when))
                for name, amount in counts.items():
                    self._counts[name] = self._counts.get(name, 0) + amount
            if self._index.writable:
                logger.debug("could not record cache usage in %s: %s", self._index.path, error)
