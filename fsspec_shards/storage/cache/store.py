"""``ShardCache``: whole, verified files on local disk, keyed by object identity.

Invariants:

- Whole and verified, or absent. A download writes into ``tmp/``; only after
  ``download()`` returns (it verifies what it wrote) is the file made read-only, renamed
  into ``files/`` and recorded in the index (:mod:`.publication`). A process killed at any
  instant leaves a temp file or an unindexed file (both removed later, by name:
  :class:`.room.OwnFiles`) or a whole entry.
- Durable, or verified again: the fsync of a published file and its directory runs in the
  background (:mod:`fsspec_shards.storage.cache.durability`); until it is done the entry is
  recorded as not durable under this boot, and under another boot (a machine crash may
  have torn it) it is verified against its checksum before its first use, dropped where
  it does not match or none is known. Without a boot id the fsync comes before publishing.
- One download per key across processes (the key's lock); the bytes of published files
  plus the bytes reserved by downloads in flight stay within ``size_limit``, evicting
  least-recently-used files (:mod:`.room`; access times batched per process there too).
- A hit is one index lookup (usually answered from memory: :meth:`.Index.lookup`), an
  ``open`` and an ``fstat``: no write transaction (but the one a second that finds this
  process's batched uses due: :class:`.room.Usage`). A hit's file
  must be a regular file of the recorded size owned by the user, at the one name the cache
  makes for the key (:func:`~.layout.data_file_path`), opened without following symlinks;
  anything else is a miss, and the entry is dropped (the file is left where it is if the
  cache did not make that name).
- Generations: a download publishes only if no write of the object happened since the
  caller looked at the backend (``since``, from :meth:`ShardCache.generation`); otherwise
  the caller reads the bytes it downloaded and nothing is published.
- Everything stored or logged about an object is its ``ObjectId.shown`` (redacted) text.
- The cache deletes only files it made (:mod:`.layout` names, in its own subdirectories:
  :class:`.room.OwnFiles`).
- Degraded modes: a read-only cache serves the entries that check out and raises
  :class:`ReadOnlyCacheError` for misses (the caller streams); a directory that cannot be a
  cache at all serves nothing; both warn once, naming the path.
"""

from __future__ import annotations

import errno
import functools
import io
import logging
import os
import stat
import threading
import time
from collections.abc import Callable
from typing import Any, BinaryIO

from fsspec_shards.config import verbose_cache
from fsspec_shards.counters import COUNTERS
from fsspec_shards.redact import redact_url
from fsspec_shards.storage.backends import KEY_FORMAT, ObjectId
from fsspec_shards.storage.cache import deletion, layout, locks, space, trust
from fsspec_shards.storage.cache.durability import (
    SYNCER,
    boot_id,
    fsync_file_and_directory,
    matches,
)
from fsspec_shards.storage.cache.index import Index
from fsspec_shards.storage.cache.index_database import ReadOnlyCacheError
from fsspec_shards.storage.cache.notices import warn_once
from fsspec_shards.storage.cache.publication import download_and_publish
from fsspec_shards.storage.cache.room import (
    READ_FLAGS,
    OwnFiles,
    Room,
    Usage,
    check_fits,
    foreign_names,
    holding_space,
    remove_data_files,
)

logger = logging.getLogger("fsspec_shards.storage.cache")

_SETUP_RETRY_SECONDS = 5.0  # a cache directory that could not be set up on a full disk
_SHARED: dict[tuple[str, bool], tuple[Index, Usage]] = {}
_SHARED_LOCK = threading.Lock()


class WrittenWhileReadingError(OSError):
    """The object was written through ``wds`` after the reader looked at the backend."""

    def __init__(self, shown: str) -> None:
        self.url = redact_url(shown)
        super().__init__(errno.EAGAIN, f"{self.url} was written while it was being read")

    def __reduce__(self):
        return (type(self), (self.url,))


class ShardCache:
    """Whole, verified files on local disk, shared safely by any number of processes.

    ``size_limit`` bounds the bytes of published files plus the bytes reserved by downloads
    in flight. ``create=False`` uses only an existing cache (:class:`~.trust.NotACacheError`
    otherwise); ``read_only`` writes nothing, not even usage.
    """

    def __init__(
        self,
        directory: str,
        size_limit: int,
        *,
        create: bool = True,
        read_only: bool = False,
    ) -> None:
        prepared = trust.prepare(directory, create=create)
        self.directory = prepared.path
        self._room: Room | None = None
        self.size_limit = size_limit
        self._options = (create, read_only)
        self._set_up_again_at: float | None = None
        self._uid = os.geteuid()
        self._dropped: set[str] = set()
        self._verified_since_boot: set[tuple[str, str]] = set()
        """(key, file) of entries verified after a reboot that a read-only index could not
        record durable: not hashed again by this process."""
        self._log_level = logging.INFO if verbose_cache() else logging.DEBUG
        self._files = OwnFiles(self.directory, self._uid, self._log_level)
        self._set_up(prepared, read_only)

    def _set_up(self, prepared: trust.Prepared, read_only: bool) -> None:
        """Open the index of a prepared directory; a disk too full to set the cache up
        leaves it unusable for now, and :meth:`_set_up_again` tries again later."""
        if prepared.usable:
            try:
                self._open_index(prepared, read_only)
                return
            except space.DiskFullError as error:
                prepared = trust.Prepared(
                    self.directory, False, False, f"cannot be set up ({error})", full=True
                )
        if prepared.full:
            self._set_up_again_at = time.monotonic() + _SETUP_RETRY_SECONDS
        warn_once(
            self.directory,
            "unusable",
            f"cache {self.directory} {prepared.problem}: reading without the cache",
        )
        self._index: Index | None = None
        self._usage = Usage(None)

    def _set_up_again(self) -> None:
        """A cache that could not be set up on a full disk: try again (at most every
        few seconds), so a long-running process caches once space is freed."""
        when = self._set_up_again_at
        if when is None or time.monotonic() < when:
            return
        self._set_up_again_at = None
        create, read_only = self._options
        prepared = trust.prepare(self.directory, create=create)
        if prepared.usable:
            try:
                self._open_index(prepared, read_only)
                return
            except space.DiskFullError:
                pass
        if prepared.full or prepared.usable:
            self._set_up_again_at = time.monotonic() + _SETUP_RETRY_SECONDS

    def _open_index(self, prepared: trust.Prepared, read_only: bool) -> None:
        """The shared index of a usable directory; records the size limit it is used with."""
        writable = prepared.writable and not read_only
        if not prepared.writable and not read_only:
            warn_once(
                self.directory,
                "read-only",
                f"cache {self.directory} is read-only: cached files are served, everything "
                "else is read without caching",
            )
        index, usage = self._shared_index(writable)
        if index.writable:
            try:
                index.record_size_limit(self.size_limit)
                space.make_reserve(self.directory)
                deletion.recover(self.directory)
            except (ReadOnlyCacheError, space.DiskFullError, PermissionError):
                pass  # recorded, and made, by a later use
        self._index, self._usage = index, usage
        self._room = Room(self.size_limit, index, usage, self._files, self._log_level)

    @classmethod
    def existing(cls, directory: str, size_limit: int = 0, *, writable: bool = False) -> ShardCache:
        """An existing cache, for inspection (``writable`` to clear it): never creates one.

        Raises :class:`~.trust.NotACacheError` (naming the directory and the reason) for a
        directory that does not exist or is not a cache.
        """
        return cls(directory, size_limit, create=False, read_only=not writable)

    def _shared_index(self, writable: bool) -> tuple[Index, Usage]:
        """One index and one usage batch per directory and process, shared by instances."""
        with _SHARED_LOCK:
            shared = _SHARED.get((self.directory, writable))
            if shared is None:
                directory = self.directory
                index = Index(
                    directory,
                    writable,
                    space_lock=lambda: holding_space(directory),
                    on_reset=lambda: remove_data_files(directory),
                )
                if writable and index.key_format() != KEY_FORMAT:
                    for key, file in index.set_key_format():
                        self._files.remove_data_file(key, file)
                shared = (index, Usage(index))
                _SHARED[(self.directory, writable)] = shared
            return shared

    def __reduce__(self):
        return (_reopen, (self.directory, self.size_limit, *self._options))

    def __repr__(self) -> str:
        return f"ShardCache({self.directory!r}, size_limit={self.size_limit})"

    @property
    def size_limit(self) -> int:
        """The bytes of published files plus reservations this instance keeps within."""
        return self._size_limit

    @size_limit.setter
    def size_limit(self, limit: int) -> None:
        self._size_limit = int(limit)
        if self._room is not None:
            self._room.size_limit = self._size_limit

    @property
    def writable(self) -> bool:
        """Whether misses can be cached (False: read-only or unusable cache)."""
        return self._index is not None and self._index.writable

    # -- reading -------------------------------------------------------------------------

    def open(self, obj: ObjectId, *, count: bool = True) -> io.FileIO | None:
        """The cached file of ``obj`` open for reading, or None on a miss.

        A hit refreshes the file's least-recently-used position and, with ``count``, counts
        in ``hits``. Once open, the file stays readable even if it is evicted.
        """
        key = obj.key  # checked by data_file_path: the file's name must hold it
        self._set_up_again()
        index = self._index
        if index is None or key in self._dropped:
            return None
        for _ in range(3):
            found = index.lookup(key)
            if found is None:
                return None
            file, size, pending = found
            path = self._data_path(key, file, obj.shown)
            if path is None:
                return None
            try:
                descriptor = os.open(path, READ_FLAGS)
            except FileNotFoundError:
                if index.lookup(key) != found:
                    continue  # evicted or replaced between lookup and open
                self._drop_damaged(key, file, obj.shown, "is missing")
                return None
            except OSError as error:  # a symlink (ELOOP), a socket, ...
                self._drop_damaged(key, file, obj.shown, f"cannot be opened ({error.strerror})")
                return None
            info = os.fstat(descriptor)
            if stat.S_ISREG(info.st_mode) and info.st_size == size and info.st_uid == self._uid:
                if pending is not None and pending != boot_id():
                    problem = self._not_durable_problem(key, file, path, descriptor, size)
                    if problem is not None:
                        os.close(descriptor)
                        self._drop_damaged(key, file, obj.shown, problem)
                        return None
                self._usage.touch(key, count)
                handle = io.FileIO(descriptor, "rb")
                handle.name = path
                return handle
            os.close(descriptor)
            self._drop_damaged(key, file, obj.shown, _describe(info, size, self._uid))
            return None
        return None

    def _not_durable_problem(
        self, key: str, file: str, path: str, descriptor: int, size: int
    ) -> str | None:
        """Why an entry published before a reboot and not synced then cannot be served
        (None: it matches the checksum its download verified, and is durable now)."""
        if (key, file) in self._verified_since_boot:
            return None
        found = self._index.metadata(key)
        checksum = None if found is None else found[1].get("checksum")
        if not isinstance(checksum, str):
            return "was not durable before a reboot and has no checksum to verify it"
        if not matches(descriptor, size, checksum):
            return "was torn by a crash (not durable before a reboot, its checksum differs)"
        if self._index.writable:
            fsync_file_and_directory(path)
            try:
                self._index.mark_durable(key, file)
                return None
            except ReadOnlyCacheError:
                pass  # found read-only just now
        self._verified_since_boot.add((key, file))  # (another process verifies it again)
        return None

    def get(self, obj: ObjectId, *, count: bool = True) -> str | None:
        """Local path of the cached file of ``obj``, or None (prefer :meth:`open`: another
        process may evict the file before the caller opens the path)."""
        handle = self.open(obj, count=count)
        if handle is None:
            return None
        handle.close()
        return handle.name

    def generation(self, obj: ObjectId) -> int:
        """The write generation of ``obj``: read it before looking at the backend, and pass
        it to :meth:`fetch` as ``since``."""
        key = layout.check_key(obj.key)
        return 0 if self._index is None else self._index.generation(key)

    def metadata(self, obj: ObjectId) -> dict | None:
        """What ``download()`` returned for ``obj``, plus size, stored_at and validated_at."""
        key = layout.check_key(obj.key)
        found = None if self._index is None or key in self._dropped else self._index.metadata(key)
        if found is None:
            return None
        row, metadata = found
        return {
            **metadata,
            "size": row.size,
            "stored_at": row.stored_at,
            "validated_at": row.validated_at,
        }

    def entries(self) -> list[dict]:
        """Every cached file, least recently used first: url (shown text), size, times, path."""
        if self._index is None:
            return []
        self._usage.flush()
        result = []
        for row in self._index.rows():
            path = self._data_path(row.key, row.file, redact_url(row.shown), drop=False)
            if path is not None:
                result.append(
                    {
                        "url": redact_url(row.shown),
                        "size": row.size,
                        "stored_at": row.stored_at,
                        "accessed_at": row.accessed_at,
                        "path": path,
                    }
                )
        return result

    def stats(self) -> dict[str, Any]:
        """All counters, plus cached_files, cached_bytes, size_limit and directory."""
        self._usage.flush()
        result = dict.fromkeys(COUNTERS, 0)
        if self._index is not None:
            result.update(self._index.counters())
        for name, amount in self._usage.pending_counts().items():
            result[name] = result.get(name, 0) + amount
        files, cached_bytes = (0, 0) if self._index is None else self._index.totals()
        result.update(
            cached_files=files,
            cached_bytes=cached_bytes,
            size_limit=self.size_limit,
            directory=self.directory,
        )
        return result

    def recorded_size_limit(self) -> int | None:
        """The size limit the directory was last used with by a writable cache (None:
        never recorded); :attr:`size_limit` is this instance's."""
        return None if self._index is None else self._index.size_limit()

    def flush(self) -> None:
        """Wait for the background syncs of the files this process published, then write
        its batched access times and counts, and which files are durable, to the index."""
        SYNCER.drain()
        self._usage.flush()
        deletion.DELETER.drain()

    # -- writing -------------------------------------------------------------------------

    def incr(self, counter: str, amount: int = 1) -> None:
        """Add ``amount`` to a counter shared by every process using this directory."""
        self._usage.add(counter, amount)

    def touch_validated(self, obj: ObjectId) -> None:
        """Record that the cached copy of ``obj`` was just checked against the backend."""
        if self.writable:
            key = layout.check_key(obj.key)
            self._room.with_room(lambda: self._index.touch_validated(key), 0, self._room.disk_full)

    def fetch(
        self,
        obj: ObjectId,
        download: Callable[[BinaryIO], dict],
        expected_size: int | None = None,
        since: int | None = None,
    ) -> io.FileIO:
        """The cached file of ``obj`` open for reading, downloading it once on a miss.

        ``download(file)`` writes the whole, verified object into ``file`` and returns its
        metadata (JSON-serializable). One process downloads a key at a time; the others wait
        and read its copy. ``since`` is the :meth:`generation` read before the caller looked
        at the backend: if a write happened since, :class:`WrittenWhileReadingError` is
        raised before downloading, and a write during the download leaves it unpublished
        (the returned file is then the caller's own, already unlinked).

        Raises :class:`CacheFullError` when the file cannot fit, :class:`ReadOnlyCacheError`
        when nothing can be cached; an exception from ``download`` leaves nothing behind
        and propagates unchanged.
        """
        key = layout.check_key(obj.key)
        if expected_size is not None:
            check_fits(obj.shown, expected_size, self.size_limit)
        handle = self.open(obj)
        if handle is not None:
            return handle
        if not self.writable:
            raise ReadOnlyCacheError(self.directory)
        if since is None:
            since = self._index.generation(key)
        with locks.hold(layout.key_lock_path(self.directory, key)):
            handle = self.open(obj)
            if handle is not None:
                return handle
            if self._index.generation(key) != since:
                raise WrittenWhileReadingError(obj.shown)
            self._usage.add("misses")
            self._files.remove_leftovers(key)
            return download_and_publish(self._room, obj, key, download, expected_size, since)

    def discard(self, obj: ObjectId) -> None:
        """Drop the cached copy of ``obj`` and stop downloads in flight from publishing it
        (readers holding it open keep reading)."""
        key = layout.check_key(obj.key)
        if self._index is None:
            return
        if not self._index.writable:
            self._dropped.add(key)
            warn_once(
                self.directory,
                "read-only-discard",
                f"cache {self.directory} is read-only: copies of written or invalidated "
                "files stay on disk, this process no longer serves them",
            )
            return
        try:
            drop = functools.partial(self._index.drop, key, written=True)
            file = self._room.with_room(drop, 0, self._room.disk_full)
        except ReadOnlyCacheError:
            self._dropped.add(key)
            return
        if file is not None:
            self._files.remove_data_file(key, file)

    def clear(self) -> None:
        """Remove every cached file, stale temp file and counter; only files the cache made."""
        if not self.writable:
            raise ReadOnlyCacheError(self.directory)
        room = self._room
        with room.space_lock():
            self._usage.forget()
            for key, file in room.with_room(self._index.clear, 0, room.disk_full):
                self._files.remove_data_file(key, file)
            for name in self._files.temp_files():
                self._files.remove_if_stale(name)
            remove_data_files(self.directory)
        foreign = foreign_names(self.directory)
        if foreign:
            logger.warning(
                "cache %s: left %d file(s) the cache did not make, e.g. %s",
                self.directory,
                len(foreign),
                foreign[0],
            )

    # -- internals -----------------------------------------------------------------------

    def _data_path(self, key: str, file: str, shown: str, drop: bool = True) -> str | None:
        """The path of an index row's file if it is the cache's own name for ``key`` in a
        real, private ``files/`` subdirectory; otherwise reported (and the row dropped)."""
        path = self._files.data_path(key, file)
        if path is not None:
            return path
        subject = f"ignoring the index entry of {shown}: its file {file!r}"
        self._files.warn_not_ours(key, file, subject)
        if drop and self.writable:
            try:
                self._index.drop_if(key, file)
            except ReadOnlyCacheError:
                pass
        return None

    def _drop_damaged(self, key: str, file: str, shown: str, problem: str) -> None:
        logger.warning("dropping cache entry of %s: its file %s", shown, problem)
        if self.writable:
            try:
                self._index.drop_if(key, file)
            except ReadOnlyCacheError:
                self._dropped.add(key)
        else:
            self._dropped.add(key)


def _reopen(directory: str, size_limit: int, create: bool, read_only: bool) -> ShardCache:
    """A pickled cache, opened again in the process that unpickles it."""
    return ShardCache(directory, size_limit, create=create, read_only=read_only)


def _describe(info: os.stat_result, size: int, uid: int) -> str:
    if not stat.S_ISREG(info.st_mode):
        return "is not a regular file"
    if info.st_uid != uid:
        return f"is owned by uid {info.st_uid}"
    return f"is {info.st_size} bytes, expected {size}"
