"""``ShardCache``: whole, verified files on local disk, keyed by object identity.

Invariants:

- Whole and verified, or absent. A download writes into ``tmp/``; only after
  ``download()`` returns (it verifies what it wrote) is the file made read-only, renamed
  into ``files/`` and recorded in the index. A process killed at any instant leaves a temp
  file or an unindexed file (both removed later, by name) or a whole entry.
- Durable, or verified again: the fsync of a published file and its directory runs in the
  background (:mod:`fsspec_shards.storage.cache.durability`); until it is done the entry is
  recorded as not durable under this boot, and under another boot (a machine crash may
  have torn it) it is verified against its checksum before its first use, dropped where
  it does not match or none is known. Without a boot id the fsync comes before publishing.
- One download per key across processes (the key's lock); the bytes of published files
  plus the bytes reserved by downloads in flight stay within ``size_limit``, evicting
  least-recently-used files (access times batched per process: :mod:`.usage`).
- A hit is one index lookup (usually answered from memory: :meth:`.Index.lookup`), an
  ``open`` and an ``fstat``: no write transaction. A hit's file
  must be a regular file of the recorded size owned by the user, at the one name the cache
  makes for the key (:func:`~.layout.data_file_path`), opened without following symlinks;
  anything else is a miss, and the entry is dropped (the file is left where it is if the
  cache did not make that name).
- Generations: a download publishes only if no write of the object happened since the
  caller looked at the backend (``since``, from :meth:`ShardCache.generation`); otherwise
  the caller reads the bytes it downloaded and nothing is published.
- Everything stored or logged about an object is its ``ObjectId.shown`` (redacted) text.
- The cache deletes only files it made (:mod:`.layout` names, in its own subdirectories).
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
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any, BinaryIO

from fsspec_shards.config import verbose_cache
from fsspec_shards.counters import COUNTERS
from fsspec_shards.errors import IntegrityError
from fsspec_shards.redact import redact_url
from fsspec_shards.storage.backends.identity import KEY_FORMAT, ObjectId
from fsspec_shards.storage.cache import deletion, layout, locks, space, trust
from fsspec_shards.storage.cache.durability import (
    SYNCER,
    boot_id,
    fsync_file_and_directory,
    matches,
)
from fsspec_shards.storage.cache.index import Index, ReadOnlyCacheError, Row
from fsspec_shards.storage.cache.notices import warn_once
from fsspec_shards.storage.cache.usage import Usage

logger = logging.getLogger("fsspec_shards.storage.cache")


_WAIT_FOR_ROOM_SECONDS = 0.05
_BETWEEN_BATCHES_SECONDS = 0.001  # the space lock is free this long between eviction batches
_SETUP_RETRY_SECONDS = 5.0  # a cache directory that could not be set up on a full disk
EVICTION_BATCH = 8192
_DEFERRED_DELETES = 64  # a batch of this many evictions leaves its files to .deletion
"""Entries one eviction pass drops (one index transaction, the space lock held for it)."""
_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_SHARED: dict[tuple[str, bool], tuple[Index, Usage]] = {}
_SHARED_LOCK = threading.Lock()
_HOLDING_SPACE = threading.local()


class CacheFullError(OSError):
    """There is no room for a file even after evicting everything that may be evicted."""

    def __init__(self, shown: str, detail: str) -> None:
        self.url = redact_url(shown)
        self.detail = detail
        super().__init__(errno.ENOSPC, f"no room in the cache for {self.url}: {detail}")

    def __reduce__(self):
        return (type(self), (self.url, self.detail))


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
        self.size_limit = int(size_limit)
        self._options = (create, read_only)
        self._set_up_again_at: float | None = None
        self._uid = os.geteuid()
        self._checked_shards: set[str] = set()
        self._dropped: set[str] = set()
        self._verified_since_boot: set[tuple[str, str]] = set()
        """(key, file) of entries verified after a reboot that a read-only index could not
        record durable: not hashed again by this process."""
        self._log_level = logging.INFO if verbose_cache() else logging.DEBUG
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
                    space_lock=lambda: _holding_space(directory),
                    on_reset=lambda: _remove_data_files(directory),
                )
                if writable and index.key_format() != KEY_FORMAT:
                    for key, file in index.set_key_format():
                        self._remove_data_file(key, file)
                shared = (index, Usage(index))
                _SHARED[(self.directory, writable)] = shared
            return shared

    def __reduce__(self):
        return (_reopen, (self.directory, self.size_limit, *self._options))

    def __repr__(self) -> str:
        return f"ShardCache({self.directory!r}, size_limit={self.size_limit})"

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
                descriptor = os.open(path, _OPEN_FLAGS)
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
        """Write this process's batched access times and counts to the index now, and wait
        for the background syncs of the files it published."""
        self._usage.flush()
        SYNCER.drain()
        deletion.DELETER.drain()

    # -- writing -------------------------------------------------------------------------

    def incr(self, counter: str, amount: int = 1) -> None:
        """Add ``amount`` to a counter shared by every process using this directory."""
        self._usage.add(counter, amount)

    def touch_validated(self, obj: ObjectId) -> None:
        """Record that the cached copy of ``obj`` was just checked against the backend."""
        if self.writable:
            key = layout.check_key(obj.key)
            self._with_room(lambda: self._index.touch_validated(key), 0, self._disk_full)

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
        if expected_size is not None and expected_size > self.size_limit:
            raise CacheFullError(
                obj.shown, f"{expected_size} bytes exceed the cache size limit of {self.size_limit}"
            )
        handle = self.open(obj)
        if handle is not None:
            return handle
        if not self.writable:
            raise ReadOnlyCacheError(self.directory)
        if since is None:
            since = self._index.generation(key)
        with locks.hold(self._lock_path(key)):
            handle = self.open(obj)
            if handle is not None:
                return handle
            if self._index.generation(key) != since:
                raise WrittenWhileReadingError(obj.shown)
            self._usage.add("misses")
            self._remove_leftovers(key)
            return self._download_and_publish(obj, key, download, expected_size, since)

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
            file = self._with_room(lambda: self._index.drop(key, written=True), 0, self._disk_full)
        except ReadOnlyCacheError:
            self._dropped.add(key)
            return
        if file is not None:
            self._remove_data_file(key, file)

    def clear(self) -> None:
        """Remove every cached file, stale temp file and counter; only files the cache made."""
        if not self.writable:
            raise ReadOnlyCacheError(self.directory)
        with self._space_lock():
            self._usage.forget()
            for key, file in self._with_room(self._index.clear, 0, self._disk_full):
                self._remove_data_file(key, file)
            for name in self._temp_files():
                self._remove_if_stale(name)
            _remove_data_files(self.directory)
        foreign = _foreign_names(self.directory)
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
        path = layout.data_file_path(self.directory, key, file)
        if path is not None and self._shard_is_safe(key[:2]):
            return path
        warn_once(
            self.directory,
            f"outside:{key}:{file}",
            f"cache {self.directory}: ignoring the index entry of {shown}: its file {file!r} "
            f"is not a file this cache made in {os.path.join(self.directory, layout.FILES)}",
        )
        if drop and self.writable:
            try:
                self._index.drop_if(key, file)
            except ReadOnlyCacheError:
                pass
        return None

    def _shard_is_safe(self, shard: str) -> bool:
        """``files/<shard>`` is a real directory owned by the user, writable by no one else."""
        if shard in self._checked_shards:
            return True
        try:
            info = os.lstat(os.path.join(self.directory, layout.FILES, shard))
        except FileNotFoundError:
            return True  # nothing there to open; made 0700 by the cache when needed
        safe = stat.S_ISDIR(info.st_mode) and info.st_uid == self._uid and not info.st_mode & 0o022
        if safe:
            self._checked_shards.add(shard)
        return safe

    def _drop_damaged(self, key: str, file: str, shown: str, problem: str) -> None:
        logger.warning("dropping cache entry of %s: its file %s", shown, problem)
        if self.writable:
            try:
                self._index.drop_if(key, file)
            except ReadOnlyCacheError:
                self._dropped.add(key)
        else:
            self._dropped.add(key)

    def _remove_data_file(self, key: str, file: str) -> None:
        """Delete an entry's file, if it is a name the cache made for ``key``."""
        path = layout.data_file_path(self.directory, key, file)
        if path is None or not self._shard_is_safe(key[:2]):
            warn_once(
                self.directory,
                f"outside:{key}:{file}",
                f"cache {self.directory}: not deleting {file!r} named by the index: it is not "
                f"a file this cache made in {os.path.join(self.directory, layout.FILES)}",
            )
            return
        layout.remove_file(path)

    def _download_and_publish(
        self,
        obj: ObjectId,
        key: str,
        download: Callable[[BinaryIO], dict],
        expected_size: int | None,
        since: int,
    ) -> io.FileIO:
        """Download into a temp file and publish it (on a full disk: :meth:`_with_room`)."""
        reserve = expected_size or 0
        written = [0]

        def attempt() -> io.FileIO:
            temp = self._reserve(obj, key, reserve)
            try:
                return self._write_and_publish(obj, key, temp, download, expected_size, since)
            except BaseException:
                written[0] = _size_of(temp)
                layout.remove_file(temp)
                raise

        return self._with_room(
            attempt,
            lambda: max(reserve, written[0] + 1),
            lambda detail: CacheFullError(obj.shown, detail),
        )

    def _with_room(
        self,
        operation: Callable[[], Any],
        needed: int | Callable[[], int],
        error: Callable[[str], OSError],
    ) -> Any:
        """``operation()``; on a full disk, free ``needed`` bytes (:meth:`_free_disk_space`)
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
                if not self._free_disk_space(max(wanted, 1)):
                    detail = (
                        f"the disk of cache {self.directory} is full and no cached file is "
                        "left to evict"
                    )
                    raise error(detail) from None
                logger.log(self._log_level, "disk of %s full: evicted, retrying", self.directory)
        raise AssertionError("unreachable")

    def _disk_full(self, detail: str) -> OSError:
        return space.DiskFullError(self.directory, detail)

    def _reserve(self, obj: ObjectId, key: str, reserve: int) -> str:
        """Make room for ``reserve`` bytes and create the temp file that holds the reservation."""
        while True:
            with self._space_lock():
                room = self._make_room(obj.shown, reserve)
                if room:
                    name = layout.new_temp_name(key, reserve)
                    path = os.path.join(self.directory, layout.TMP, name)
                    flags = os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC
                    os.close(os.open(path, flags, 0o600))
                    return path
            _wait_for_room(room, obj.shown)

    def _write_and_publish(
        self,
        obj: ObjectId,
        key: str,
        temp: str,
        download: Callable[[BinaryIO], dict],
        expected_size: int | None,
        since: int,
    ) -> io.FileIO:
        """Let ``download`` fill ``temp``, make it durable, rename it into ``files/`` and
        record it, unless the object was written meanwhile."""
        started = time.monotonic()
        boot = boot_id()
        with open(temp, "r+b") as file:
            metadata = download(file)
            file.flush()
            # no way to tell a reboot later (no boot id): durable before publishing;
            # otherwise durability.py syncs it in the background
            layout.finish_file(file.fileno(), read_only=True, durable=boot is None)
            size = os.fstat(file.fileno()).st_size
        # The download says what it verified (a newer version may differ in size from
        # what was reserved); otherwise the size announced beforehand must hold.
        promised = (metadata or {}).get("size", expected_size)
        if promised is not None and size != promised:
            self.incr("integrity_failures")
            raise IntegrityError(obj.shown, f"{promised} bytes", f"{size} bytes", "cached download")
        relative = layout.new_data_file(key)
        final = os.path.join(self.directory, relative)
        record = {
            name: redact_url(value) if isinstance(value, str) else value
            for name, value in (metadata or {}).items()
        }
        while True:
            with self._space_lock():
                room = self._make_room(obj.shown, size, excluding=temp)
                if room:
                    os.makedirs(os.path.dirname(final), mode=0o700, exist_ok=True)
                    if not self._shard_is_safe(key[:2]):
                        raise trust.CacheDirectoryError(
                            os.path.dirname(final),
                            "is not a private directory of the cache",
                            "remove it (the cache makes it again)",
                        )
                    handle = None
                    try:
                        layout.rename_into_place(temp, final, durable=boot is None)
                        # opened before the index names it: from then on a discard by
                        # another thread or process may remove it (the handle still reads)
                        handle = io.FileIO(os.open(final, _OPEN_FLAGS), "rb")
                        handle.name = final
                        published, replaced = self._index.publish(
                            key, relative, size, redact_url(obj.shown), record, since, boot
                        )
                    except BaseException:
                        if handle is not None:
                            handle.close()
                        layout.remove_file(final)
                        raise
                    if not published:
                        layout.remove_file(final)
                    else:
                        if boot is not None:
                            SYNCER.submit(
                                final, functools.partial(self._index.mark_durable, key, relative)
                            )
                        if replaced is not None and replaced != relative:
                            self._remove_data_file(key, replaced)
                    break
            _wait_for_room(room, obj.shown)
        if published:
            logger.log(
                self._log_level,
                "cached %s (%d bytes in %.2fs)",
                obj.shown,
                size,
                time.monotonic() - started,
            )
        else:
            logger.log(self._log_level, "not caching %s: it was written meanwhile", obj.shown)
        return handle

    def _make_room(self, shown: str, needed: int, excluding: str | None = None) -> bool | None:
        """Evict least-recently-used files, one batch at most, so that ``needed`` more bytes
        fit under the limit. Called with the space lock held, which one batch (one index
        transaction, :data:`EVICTION_BATCH` entries) keeps bounded.

        True: they fit now. None: a batch was evicted and more may be needed (the caller
        releases the lock, so others' misses wait at most one batch, and calls again).
        False: only bytes reserved by other downloads in flight stand in the way (the
        caller waits for them to finish).
        """
        if needed > self.size_limit:
            raise CacheFullError(
                shown, f"{needed} bytes exceed the cache size limit of {self.size_limit}"
            )
        self._usage.flush()
        reserved = sum(
            layout.parse_temp_name(name)[1]
            for name in self._temp_files()
            if os.path.join(self.directory, layout.TMP, name) != excluding
            and not self._remove_if_stale(name)
        )
        excess = self._index.cached_bytes() + reserved + needed - self.size_limit
        if excess <= 0:
            return True
        return None if self._evict(EVICTION_BATCH, excess) else False

    def _evict(self, limit: int, covering: int | None = None, *, disk_full: bool = False) -> int:
        """Evict up to ``limit`` least-recently-used entries (no more than cover ``covering``
        bytes) in one index transaction, then delete their files (those of a mass eviction
        in the background: :mod:`.deletion`); how many were evicted.

        On a full disk (``disk_full``) where even that transaction finds no room, the
        files go first (the freed space lets the index drop them; a hit meanwhile finds
        the file missing, a miss)."""
        try:
            rows = self._index.drop_least_recent(limit, covering)
        except space.DiskFullError:
            if not disk_full:
                raise
            for row in self._index.rows(limit):
                if row.file is not None:
                    self._remove_data_file(row.key, row.file)
            rows = self._index.drop_least_recent(limit, covering)
        for row in rows:
            logger.log(self._log_level, "evicted %s (%d bytes)", redact_url(row.shown), row.size)
        evicted = [row for row in rows if row.file is not None]
        if len(evicted) < _DEFERRED_DELETES or disk_full or not self._defer(evicted):
            for row in evicted:
                self._remove_data_file(row.key, row.file)
        if rows:
            self.incr("evictions", len(rows))
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

    def _free_disk_space(self, needed: int) -> bool:
        """After a full disk: release the index's reserve, evict until ``needed`` bytes
        (and the reserve) are free, and make the reserve again; False when nothing could
        be evicted and no room appeared."""
        evicted = 0
        wanted = needed + space.RESERVE_BYTES  # the reserve is made again after
        with self._space_lock():
            space.release_reserve(self.directory)
            self._usage.flush()  # (kept for later where even that finds no room)
            while space.free_bytes(self.directory) < wanted:
                dropped = self._evict(space.EMERGENCY_BATCH, disk_full=True)
                if not dropped:
                    break
                evicted += dropped
            room = space.free_bytes(self.directory) >= wanted
            space.make_reserve(self.directory, spare=0)
        return evicted > 0 or room

    def _temp_files(self) -> list[str]:
        """Temp files the cache made (names it makes), in ``tmp/``."""
        return [
            name
            for name in layout.list_directory(os.path.join(self.directory, layout.TMP))
            if layout.parse_temp_name(name) is not None
        ]

    def _remove_leftovers(self, key: str) -> None:
        """Remove what killed processes left for ``key``: temp files, and published files that
        never made it into the index. Called on a miss with the key's lock held, so no one else
        is writing these files and none of them is referenced."""
        temp = os.path.join(self.directory, layout.TMP)
        for name in layout.list_directory(temp):
            parsed = layout.parse_temp_name(name)
            if (parsed is not None and parsed[0] == key) or layout.parse_progress_name(name) == key:
                logger.log(self._log_level, "removing leftover file %s", name)
                layout.remove_file(os.path.join(temp, name))
        shard = os.path.join(self.directory, layout.FILES, key[:2])
        if not self._shard_is_safe(key[:2]):
            return
        for name in layout.list_directory(shard):
            if name.startswith(key + ".") and layout.is_data_name(name, key[:2]):
                logger.log(self._log_level, "removing leftover file %s", name)
                layout.remove_file(os.path.join(shard, name))

    def _remove_if_stale(self, name: str) -> bool:
        """Remove a temp file whose download is not in progress (its key lock is free)."""
        key = layout.parse_temp_name(name)[0]
        if not locks.is_free(self._lock_path(key)):
            return False
        logger.log(self._log_level, "removing stale temp file %s", name)
        layout.remove_file(os.path.join(self.directory, layout.TMP, name))
        return True

    def _lock_path(self, key: str) -> str:
        return os.path.join(self.directory, layout.LOCKS, layout.key_lock_name(key))

    def _space_lock(self) -> AbstractContextManager[None]:
        return _holding_space(self.directory)


@contextmanager
def _holding_space(directory: str) -> Iterator[None]:
    """The space lock of ``directory``. A thread holding it already goes on: the index
    replaces a corrupt file under it, also when the operation that found it holds it."""
    held = _HOLDING_SPACE.__dict__.setdefault("directories", set())
    if directory in held:
        yield
        return
    with locks.hold(os.path.join(directory, layout.LOCKS, layout.SPACE_LOCK)):
        held.add(directory)
        try:
            yield
        finally:
            held.discard(directory)


def _reopen(directory: str, size_limit: int, create: bool, read_only: bool) -> ShardCache:
    """A pickled cache, opened again in the process that unpickles it."""
    return ShardCache(directory, size_limit, create=create, read_only=read_only)


def _describe(info: os.stat_result, size: int, uid: int) -> str:
    if not stat.S_ISREG(info.st_mode):
        return "is not a regular file"
    if info.st_uid != uid:
        return f"is owned by uid {info.st_uid}"
    return f"is {info.st_size} bytes, expected {size}"


def _remove_data_files(directory: str) -> None:
    """Delete every data file the cache made in ``files/`` (the index no longer knows them)."""
    files = os.path.join(directory, layout.FILES)
    for shard in layout.list_directory(files):
        if layout.is_shard_directory(shard):
            shard_path = os.path.join(files, shard)
            for name in layout.list_directory(shard_path):
                if layout.is_data_name(name, shard):
                    layout.remove_file(os.path.join(shard_path, name))


def _foreign_names(directory: str) -> list[str]:
    """Files in ``files/`` and ``tmp/`` with names the cache does not make."""
    found = []
    files = os.path.join(directory, layout.FILES)
    for shard in layout.list_directory(files):
        if not layout.is_shard_directory(shard):
            found.append(os.path.join(files, shard))
            continue
        for name in layout.list_directory(os.path.join(files, shard)):
            if not layout.is_data_name(name, shard):
                found.append(os.path.join(files, shard, name))
    temp = os.path.join(directory, layout.TMP)
    found.extend(
        os.path.join(temp, name)
        for name in layout.list_directory(temp)
        if layout.parse_temp_name(name) is None
        and layout.parse_progress_name(name) is None
        and not deletion.is_list_name(name)
    )
    return found


def _wait_for_room(room: bool | None, shown: str) -> None:
    """Between two tries at the space lock: a moment after an eviction batch (a process
    waiting for the lock takes it), longer while downloads in flight hold the room."""
    if room is None:
        time.sleep(_BETWEEN_BATCHES_SECONDS)
        return
    logger.debug("waiting for downloads in flight to make room for %s", shown)
    time.sleep(_WAIT_FOR_ROOM_SECONDS)


def _size_of(path: str) -> int:
    try:
        return os.lstat(path).st_size
    except OSError:
        return 0
