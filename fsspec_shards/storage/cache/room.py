"""Making room in a cache: the files it made (:class:`OwnFiles`: found, reserved, removed),
the size limit, the space lock, eviction in least-recently-used order (the hits that make
that order, batched), and a full disk.

Invariants of the room:

- The bytes of published files plus the bytes reserved by downloads in flight (their temp
  files' names say how many) stay within ``size_limit``: a reservation and a publication
  are made with the space lock held, after evicting least-recently-used entries.
- One eviction pass drops at most :data:`EVICTION_BATCH` entries in one index transaction,
  the space lock held for it; between passes the lock is free a moment, so others' misses
  wait at most one batch.
- A full disk is handled in one place (:meth:`Room.with_room`): the index's reserve is
  released, entries are evicted until the bytes needed are free, the reserve is made
  again, and the operation runs once more.

Hits almost without write transactions (:class:`Usage`): access times and counters batched
in memory. Invariants:

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

The files a cache made in its directory (:class:`OwnFiles`): finding them and removing them.
Invariants:

- Only names :mod:`.layout` makes are removed, each in the subdirectory its pattern belongs
  to; a file named otherwise is reported (:func:`foreign_names`), never deleted.
- An entry's file is served or deleted only inside ``files/<ab>`` that is a real directory
  owned by the user and writable by no one else (:meth:`OwnFiles.shard_is_safe`).
- A temp file is removed only when no download holds its key's lock (stale), or with that
  lock held by the caller (leftovers of a killed process).
"""

from __future__ import annotations

import atexit
import errno
import logging
import os
import sqlite3
import stat
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from multiprocessing import util as multiprocessing_util
from typing import Any

import diskcache

from fsspec_shards.redact import redact_url
from fsspec_shards.storage.cache import deletion, layout, locks, space
from fsspec_shards.storage.cache.index import Index
from fsspec_shards.storage.cache.index_database import Row
from fsspec_shards.storage.cache.notices import warn_once

logger = logging.getLogger("fsspec_shards.storage.cache")

READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
"""How a cached file is opened for reading: never through a symlink, never blocking on a
FIFO planted in its place."""


class OwnFiles:
    """The files of the cache in ``directory``, for a process of user ``uid``; what it
    removes is logged at ``log_level``."""

    def __init__(self, directory: str, uid: int, log_level: int) -> None:
        self.directory = directory
        self._uid = uid
        self._log_level = log_level
        self._checked_shards: set[str] = set()

    def shard_is_safe(self, shard: str) -> bool:
        """``files/<shard>`` is a real directory owned by the user, writable by no one else."""
        if shard in self._checked_shards:
            return True
        try:
            info = os.lstat(layout.shard_directory_path(self.directory, shard))
        except FileNotFoundError:
            return True  # nothing there to open; made 0700 by the cache when needed
        safe = stat.S_ISDIR(info.st_mode) and info.st_uid == self._uid and not info.st_mode & 0o022
        if safe:
            self._checked_shards.add(shard)
        return safe

    def data_path(self, key: str, file: str) -> str | None:
        """The path of an index row's ``file`` if it is the cache's own name for ``key`` in a
        safe ``files/`` subdirectory, else None."""
        path = layout.data_file_path(self.directory, key, file)
        return path if path is not None and self.shard_is_safe(key[:2]) else None

    def warn_not_ours(self, key: str, file: str, subject: str) -> None:
        """Warn once that ``subject`` (the index's ``file`` of ``key``) is not a file the
        cache made."""
        warn_once(
            self.directory,
            f"outside:{key}:{file}",
            f"cache {self.directory}: {subject} is not a file this cache made in "
            f"{layout.files_directory(self.directory)}",
        )

    def remove_data_file(self, key: str, file: str) -> None:
        """Delete an entry's file, if it is a name the cache made for ``key``."""
        path = self.data_path(key, file)
        if path is None:
            self.warn_not_ours(key, file, f"not deleting {file!r} named by the index: it")
            return
        layout.remove_file(path)

    def temp_files(self) -> list[str]:
        """Temp files the cache made (names it makes), in ``tmp/``."""
        return [
            name
            for name in layout.list_directory(layout.temp_directory(self.directory))
            if layout.parse_temp_name(name) is not None
        ]

    def reserved_bytes(self, excluding: str | None = None) -> int:
        """Bytes reserved by the downloads in flight (their temp files' names say), the
        temp file ``excluding`` left out; stale temp files are removed, not counted."""
        return sum(
            layout.parse_temp_name(name)[1]
            for name in self.temp_files()
            if layout.temp_path(self.directory, name) != excluding
            and not self.remove_if_stale(name)
        )

    def remove_if_stale(self, name: str) -> bool:
        """Remove a temp file whose download is not in progress (its key lock is free)."""
        key = layout.parse_temp_name(name)[0]
        if not locks.is_free(layout.key_lock_path(self.directory, key)):
            return False
        logger.log(self._log_level, "removing stale temp file %s", name)
        layout.remove_file(layout.temp_path(self.directory, name))
        return True

    def remove_leftovers(self, key: str) -> None:
        """Remove what killed processes left for ``key``: temp files, and published files that
        never made it into the index. Called on a miss with the key's lock held, so no one else
        is writing these files and none of them is referenced."""
        for name in layout.list_directory(layout.temp_directory(self.directory)):
            parsed = layout.parse_temp_name(name)
            if (parsed is not None and parsed[0] == key) or layout.parse_progress_name(name) == key:
                logger.log(self._log_level, "removing leftover file %s", name)
                layout.remove_file(layout.temp_path(self.directory, name))
        if not self.shard_is_safe(key[:2]):
            return
        shard = layout.shard_directory_path(self.directory, key[:2])
        for name in layout.list_directory(shard):
            if name.startswith(key + ".") and layout.is_data_name(name, key[:2]):
                logger.log(self._log_level, "removing leftover file %s", name)
                layout.remove_file(os.path.join(shard, name))


def remove_data_files(directory: str) -> None:
    """Delete every data file the cache made in ``files/`` (the index no longer knows them)."""
    for _, path in list(layout.data_files(directory)):
        layout.remove_file(path)


def foreign_names(directory: str) -> list[str]:
    """Files in ``files/`` and ``tmp/`` with names the cache does not make."""
    found = []
    files = layout.files_directory(directory)
    for shard in layout.list_directory(files):
        if not layout.is_shard_directory(shard):
            found.append(os.path.join(files, shard))
            continue
        shard_path = layout.shard_directory_path(directory, shard)
        for name in layout.list_directory(shard_path):
            if not layout.is_data_name(name, shard):
                found.append(os.path.join(shard_path, name))
    found.extend(
        layout.temp_path(directory, name)
        for name in layout.list_directory(layout.temp_directory(directory))
        if layout.parse_temp_name(name) is None
        and layout.parse_progress_name(name) is None
        and not deletion.is_list_name(name)
    )
    return found


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


logger = logging.getLogger("fsspec_shards.storage.cache")

EVICTION_BATCH = 8192
"""Entries one eviction pass drops (one index transaction, the space lock held for it)."""
_DEFERRED_DELETES = 64  # a batch of this many evictions leaves its files to .deletion
_WAIT_FOR_ROOM_SECONDS = 0.05
_BETWEEN_BATCHES_SECONDS = 0.001  # the space lock is free this long between eviction batches
_HOLDING_SPACE = threading.local()


class CacheFullError(OSError):
    """There is no room for a file even after evicting everything that may be evicted."""

    def __init__(self, shown: str, detail: str) -> None:
        self.url = redact_url(shown)
        self.detail = detail
        super().__init__(errno.ENOSPC, f"no room in the cache for {self.url}: {detail}")

    def __reduce__(self):
        return (type(self), (self.url, self.detail))


def check_fits(shown: str, needed: int, size_limit: int) -> None:
    """:class:`CacheFullError` when ``needed`` bytes exceed the size limit itself."""
    if needed > size_limit:
        raise CacheFullError(shown, f"{needed} bytes exceed the cache size limit of {size_limit}")


@contextmanager
def holding_space(directory: str) -> Iterator[None]:
    """The space lock of ``directory``. A thread holding it already goes on: the index
    replaces a corrupt file under it, also when the operation that found it holds it."""
    held = _HOLDING_SPACE.__dict__.setdefault("directories", set())
    if directory in held:
        yield
        return
    with locks.hold(layout.space_lock_path(directory)):
        held.add(directory)
        try:
            yield
        finally:
            held.discard(directory)


class Room:
    """Room for files in the cache of ``files.directory`` under ``size_limit``, kept with
    its writable ``index`` and this process's ``usage``."""

    def __init__(
        self, size_limit: int, index: Index, usage: Usage, files: OwnFiles, log_level: int
    ) -> None:
        self.directory = files.directory
        self.size_limit = size_limit
        self.index = index
        self.usage = usage
        self.files = files
        self.log_level = log_level

    def space_lock(self) -> AbstractContextManager[None]:
        return holding_space(self.directory)

    def reserve(self, shown: str, key: str, reserve: int) -> str:
        """Make room for ``reserve`` bytes and create the temp file that holds the reservation."""
        while True:
            with self.space_lock():
                room = self.make_room(shown, reserve)
                if room:
                    path = layout.temp_path(self.directory, layout.new_temp_name(key, reserve))
                    flags = os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC
                    os.close(os.open(path, flags, 0o600))
                    return path
            wait_for_room(room, shown)

    def make_room(self, shown: str, needed: int, excluding: str | None = None) -> bool | None:
        """Evict least-recently-used files, one batch at most, so that ``needed`` more bytes
        fit under the limit. Called with the space lock held, which one batch (one index
        transaction, :data:`EVICTION_BATCH` entries) keeps bounded.

        True: they fit now. None: a batch was evicted and more may be needed (the caller
        releases the lock, so others' misses wait at most one batch, and calls again).
        False: only bytes reserved by other downloads in flight stand in the way (the
        caller waits for them to finish).
        """
        check_fits(shown, needed, self.size_limit)
        self.usage.flush()
        reserved = self.files.reserved_bytes(excluding)
        excess = self.index.cached_bytes() + reserved + needed - self.size_limit
        if excess <= 0:
            return True
        return None if self.evict(EVICTION_BATCH, excess) else False

    def evict(self, limit: int, covering: int | None = None, *, disk_full: bool = False) -> int:
        """Evict up to ``limit`` least-recently-used entries (no more than cover ``covering``
        bytes) in one index transaction, then delete their files (those of a mass eviction
        in the background: :mod:`.deletion`); how many were evicted.

        On a full disk (``disk_full``) where even that transaction finds no room, the
        files go first (the freed space lets the index drop them; a hit meanwhile finds
        the file missing, a miss)."""
        try:
            rows = self.index.drop_least_recent(limit, covering)
        except space.DiskFullError:
            if not disk_full:
                raise
            for row in self.index.rows(limit):
                if row.file is not None:
                    self.files.remove_data_file(row.key, row.file)
            rows = self.index.drop_least_recent(limit, covering)
        for row in rows:
            logger.log(self.log_level, "evicted %s (%d bytes)", redact_url(row.shown), row.size)
        evicted = [row for row in rows if row.file is not None]
        if len(evicted) < _DEFERRED_DELETES or disk_full or not self._defer(evicted):
            for row in evicted:
                self.files.remove_data_file(row.key, row.file)
        if rows:
            self.usage.add("evictions", len(rows))
        return len(rows)

    def _defer(self, rows: list[Row]) -> bool:
        """Hand the files of a mass eviction to the deleting thread (:mod:`.deletion`);
        False where the list cannot be written (the caller deletes them now)."""
        try:
            listed = deletion.write_list(self.directory, [row.file for row in rows])
        except OSError as error:
            logger.debug("deleting evicted files now: no eviction list (%s)", error)
            return False
        deletion.DELETER.submit(self.directory, listed)
        return True

    def with_room(
        self,
        operation: Callable[[], Any],
        needed: int | Callable[[], int],
        error: Callable[[str], OSError],
    ) -> Any:
        """``operation()``; on a full disk, free ``needed`` bytes (:meth:`free_disk_space`)
        and run it once more. A disk still full raises ``error(detail)``: an ENOSPC
        ``OSError`` naming the cache directory (a fill's :class:`CacheFullError` is
        streamed uncached by the caller). The one place a full disk is handled."""
        for attempt in range(2):
            try:
                return operation()
            except BaseException as raised:
                if isinstance(raised, CacheFullError) or not space.is_disk_full(raised):
                    raise
                if attempt:
                    detail = f"the disk of cache {self.directory} is still full after evicting"
                    raise error(detail) from None
                wanted = needed() if callable(needed) else needed
                if not self.free_disk_space(max(wanted, 1)):
                    detail = (
                        f"the disk of cache {self.directory} is full and no cached file is "
                        "left to evict"
                    )
                    raise error(detail) from None
                logger.log(self.log_level, "disk of %s full: evicted, retrying", self.directory)
        raise AssertionError("unreachable")

    def disk_full(self, detail: str) -> OSError:
        """The error of an index write that found the disk full (for :meth:`with_room`)."""
        return space.DiskFullError(self.directory, detail)

    def free_disk_space(self, needed: int) -> bool:
        """After a full disk: release the index's reserve, evict until ``needed`` bytes
        (and the reserve) are free, and make the reserve again; False when nothing could
        be evicted and no room appeared."""
        evicted = 0
        wanted = needed + space.RESERVE_BYTES  # the reserve is made again after
        with self.space_lock():
            space.release_reserve(self.directory)
            self.usage.flush()  # (kept for later where even that finds no room)
            while space.free_bytes(self.directory) < wanted:
                dropped = self.evict(space.EMERGENCY_BATCH, disk_full=True)
                if not dropped:
                    break
                evicted += dropped
            room = space.free_bytes(self.directory) >= wanted
            space.make_reserve(self.directory, spare=0)
        return evicted > 0 or room


def wait_for_room(room: bool | None, shown: str) -> None:
    """Between two tries at the space lock: a moment after an eviction batch (a process
    waiting for the lock takes it), longer while downloads in flight hold the room."""
    if room is None:
        time.sleep(_BETWEEN_BATCHES_SECONDS)
        return
    logger.debug("waiting for downloads in flight to make room for %s", shown)
    time.sleep(_WAIT_FOR_ROOM_SECONDS)
