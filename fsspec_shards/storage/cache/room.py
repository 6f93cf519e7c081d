"""Making room in a cache: the size limit, the space lock, eviction, and a full disk.

Invariants:

- The bytes of published files plus the bytes reserved by downloads in flight (their temp
  files' names say how many) stay within ``size_limit``: a reservation and a publication
  are made with the space lock held, after evicting least-recently-used entries.
- One eviction pass drops at most :data:`EVICTION_BATCH` entries in one index transaction,
  the space lock held for it; between passes the lock is free a moment, so others' misses
  wait at most one batch.
- A full disk is handled in one place (:meth:`Room.with_room`): the index's reserve is
  released, entries are evicted until the bytes needed are free, the reserve is made
  again, and the operation runs once more.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from fsspec_shards.redact import redact_url
from fsspec_shards.storage.cache import deletion, layout, locks, space
from fsspec_shards.storage.cache.index import Index
from fsspec_shards.storage.cache.index_database import Row
from fsspec_shards.storage.cache.own_files import OwnFiles
from fsspec_shards.storage.cache.usage import Usage

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
