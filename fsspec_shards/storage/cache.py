"""A process-safe, size-bounded cache of whole, verified files, keyed by URL.

Layout of a cache directory (mode 0700)::

    cache.db            diskcache index: one row per cached file (metadata, size, LRU access time)
    files/ab/<key>.<t>  the cached bytes, published by rename, never rewritten in place
    tmp/<key>.<pid>.<t>.<reserved>.part   downloads in flight; the name carries the bytes reserved
    locks/<key>.lock    per-key lock: one download per key across processes
    locks/space.lock    serializes reservations, publication and eviction
    state/counters/     diskcache of persistent counters shared by all processes
    state/validated/    diskcache of the times cached files were last checked against the backend

A download writes into a temp file in ``tmp/``; only after ``download()`` returns (it verifies
what it wrote) is the file fsynced and renamed into ``files/``, then recorded in the index. A
process killed at any instant therefore leaves either a temp file (cleaned by the next process
that finds its lock free) or a whole published file, never a partial entry.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import secrets
import sqlite3
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import BinaryIO
from urllib.request import pathname2url

import diskcache
from diskcache.core import DBNAME, MODE_RAW
from filelock import FileLock, Timeout

from fsspec_shards.config import verbose_cache
from fsspec_shards.errors import IntegrityError, strip_secrets
from fsspec_shards.redact import redact_url

logger = logging.getLogger(__name__)

COUNTERS = ("hits", "misses", "bytes_downloaded", "retries", "integrity_failures", "evictions")
"""Counters every cache reports, zero until first incremented."""

_WAIT_FOR_ROOM_SECONDS = 0.05


class CacheFullError(OSError):
    """There is no room for a file even after evicting everything that may be evicted."""

    def __init__(self, url: str, detail: str) -> None:
        self.url = redact_url(url)
        self.detail = detail
        super().__init__(errno.ENOSPC, f"no room in the cache for {self.url}: {detail}")

    def __reduce__(self):
        return (type(self), (self.url, self.detail))


# SQLite keeps each process's lock state in memory, and a forked child inherits it: a child
# forked while another thread is inside a write transaction believes that lock held by itself
# and gets "database is locked" for good (DataLoader workers fork while prefetch threads
# write). No fork happens while a thread of this process is inside the index.
_FORK_GUARD = threading.RLock()


def _hold_forks() -> None:
    _FORK_GUARD.acquire()


def _allow_forks() -> None:
    _FORK_GUARD.release()


def _fresh_fork_guard() -> None:
    global _FORK_GUARD
    _FORK_GUARD = threading.RLock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(
        before=_hold_forks, after_in_parent=_allow_forks, after_in_child=_fresh_fork_guard
    )


class _ForkSafeCache(diskcache.Cache):
    """diskcache ``Cache`` whose set-up and write transactions never straddle a fork."""

    def __init__(self, *args, **kwargs) -> None:
        with _FORK_GUARD:
            super().__init__(*args, **kwargs)

    @contextmanager
    def _transact(self, retry: bool = False, filename: str | None = None):
        with _FORK_GUARD, super()._transact(retry, filename) as transaction:
            yield transaction


class _Entry:
    """An index value describing a published file: diskcache stores it without reading the file."""

    def __init__(self, filename: str, size: int, record: dict) -> None:
        self.filename = filename
        self.size = size
        self.record = record


class _PublishedFileDisk(diskcache.Disk):
    """diskcache ``Disk`` that records files published by rename instead of copying values in.

    The row's ``size`` column carries the file size (so diskcache's size accounting covers the
    data files), its ``filename`` column the data file (so deleting a row unlinks it), and its
    value the JSON record.
    """

    def store(self, value, read, key=diskcache.core.UNKNOWN):
        if isinstance(value, _Entry):
            return value.size, MODE_RAW, value.filename, json.dumps(value.record, default=str)
        return super().store(value, read, key)

    def remove(self, file_path: str) -> None:
        """Unlink a data file; open readers keep their copy (POSIX unlink semantics)."""
        with suppress(FileNotFoundError):
            os.remove(os.path.join(self._directory, file_path))


def cache_key(url: str) -> str:
    """The key of ``url``: a hash of the whole URL (protocol, bucket, path) without secrets."""
    return hashlib.sha256(strip_secrets(url).encode("utf-8")).hexdigest()


def _is_disk_full(error: BaseException) -> bool:
    """Whether ``error`` or an exception it was raised from means the disk is full."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if isinstance(error, sqlite3.OperationalError) and "full" in str(error):
            return True
        error = error.__cause__ or error.__context__
    return False


class ShardCache:
    """Whole, verified files on local disk, shared safely by any number of processes.

    ``size_limit`` bounds the bytes of published files plus the bytes reserved by downloads in
    flight; least-recently-used files are evicted to stay within it.
    """

    def __init__(self, directory: str, size_limit: int) -> None:
        self.directory = os.path.abspath(os.path.expanduser(str(directory)))
        self.size_limit = int(size_limit)
        for sub in ("", "files", "tmp", "locks"):
            os.makedirs(os.path.join(self.directory, sub), mode=0o700, exist_ok=True)
        self._index = _ForkSafeCache(
            self.directory,
            disk=_PublishedFileDisk,
            eviction_policy="least-recently-used",
            size_limit=self.size_limit,
            cull_limit=0,
        )
        self._counters = _ForkSafeCache(
            os.path.join(self.directory, "state", "counters"), eviction_policy="none"
        )
        self._validated = _ForkSafeCache(
            os.path.join(self.directory, "state", "validated"), eviction_policy="none"
        )
        self._log_level = logging.INFO if verbose_cache() else logging.DEBUG
        if self._log_level == logging.INFO and not logger.handlers:
            logger.addHandler(logging.StreamHandler(sys.stderr))
            logger.setLevel(logging.INFO)

    def __reduce__(self):
        return (type(self), (self.directory, self.size_limit))

    def __repr__(self) -> str:
        return f"ShardCache({self.directory!r}, size_limit={self.size_limit})"

    # -- reading -------------------------------------------------------------------------

    def get(self, url: str, *, count: bool = True) -> str | None:
        """Local path of the whole, verified file for ``url``, or None on a miss.

        A hit refreshes the file's least-recently-used position and, with ``count``, counts
        in ``hits`` (a prefetch that finds the file already there is no read of it).
        """
        path = self._lookup(cache_key(url))
        if path is not None and count:
            self.incr("hits")
        return path

    def open(self, url: str) -> BinaryIO | None:
        """The cached file for ``url`` opened for reading, or None on a miss.

        Unlike :meth:`get` there is no window in which an eviction can remove the file between
        lookup and open; once open, the file stays readable even if it is evicted.
        """
        for _ in range(3):
            path = self.get(url)
            if path is None:
                return None
            try:
                return open(path, "rb")
            except FileNotFoundError:
                continue
        return None

    def metadata(self, url: str) -> dict | None:
        """What ``download()`` returned for ``url``, plus size, stored_at and validated_at."""
        value = self._index.get(cache_key(url), retry=True)
        if value is None:
            return None
        record = json.loads(value)
        metadata = dict(record["metadata"])
        metadata["size"] = record["size"]
        metadata["stored_at"] = record["stored_at"]
        metadata["validated_at"] = self._validated.get(
            record["file"], record["stored_at"], retry=True
        )
        return metadata

    def touch_validated(self, url: str) -> None:
        """Record that the cached copy of ``url`` was just checked against the backend."""
        value = self._index.get(cache_key(url), retry=True)
        if value is not None:
            self._validated.set(json.loads(value)["file"], time.time(), retry=True)

    def entries(self) -> list[dict]:
        """Every cached file, least recently used first: url (secret-free), size, times."""
        rows = self._query(
            "SELECT value, size, store_time, access_time FROM Cache ORDER BY access_time"
        )
        result = []
        for value, size, stored_at, accessed_at in rows:
            record = json.loads(value)
            result.append(
                {
                    "url": record["url"],
                    "size": size,
                    "stored_at": stored_at,
                    "accessed_at": accessed_at,
                    "path": os.path.join(self.directory, record["file"]),
                }
            )
        return result

    def stats(self) -> dict:
        """All counters, plus cached_files, cached_bytes, size_limit and directory."""
        result = dict.fromkeys(COUNTERS, 0)
        for counter in self._counters.iterkeys():
            result[counter] = self._counters.get(counter, 0, retry=True)
        files, cached_bytes = self._index_totals()
        result.update(
            cached_files=files,
            cached_bytes=cached_bytes,
            size_limit=self.size_limit,
            directory=self.directory,
        )
        return result

    # -- writing -------------------------------------------------------------------------

    def incr(self, counter: str, amount: int = 1) -> None:
        """Add ``amount`` to a persistent counter shared by every process using this directory."""
        try:
            self._counters.incr(counter, amount, retry=True)
        except sqlite3.OperationalError as error:
            logger.warning("could not count %s in %s: %s", counter, self.directory, error)

    def fetch(
        self,
        url: str,
        download: Callable[[BinaryIO], dict],
        expected_size: int | None = None,
    ) -> str:
        """Local path of the cached file for ``url``, downloading it once if it is not cached.

        ``download(file)`` writes the whole, verified object into ``file`` and returns its
        metadata (JSON-serializable, e.g. ``{"identity": ..., "checksum": "sha256:..."}``). Only
        one process downloads a given URL at a time; the others wait and then read its copy.
        ``download`` is called again after a full disk forced an eviction. An exception from
        ``download`` leaves nothing behind and propagates unchanged.

        Raises :class:`CacheFullError` if ``expected_size`` exceeds ``size_limit`` or the disk is
        full even with every evictable file evicted.
        """
        if expected_size is not None and expected_size > self.size_limit:
            raise CacheFullError(
                url, f"{expected_size} bytes exceed the cache size limit of {self.size_limit}"
            )
        key = cache_key(url)
        path = self._lookup(key)
        if path is not None:
            self.incr("hits")
            return path
        with self._key_lock(key):
            path = self._lookup(key)
            if path is not None:
                self.incr("hits")
                return path
            self.incr("misses")
            self._remove_leftovers(key)
            return self._download_and_publish(url, key, download, expected_size)

    def discard(self, url: str) -> None:
        """Drop the cached copy of ``url``, if any (readers holding it open keep reading)."""
        self._delete_if_current(cache_key(url), None)

    def clear(self) -> None:
        """Remove every cached file, stale temp file and counter."""
        with self._space_lock():
            self._index.clear(retry=True)
            self._counters.clear(retry=True)
            self._validated.clear(retry=True)
            for name in self._temp_files():
                self._remove_if_stale(name)
            for directory, _, names in os.walk(os.path.join(self.directory, "files")):
                for name in names:
                    with suppress(FileNotFoundError):
                        os.remove(os.path.join(directory, name))

    # -- internals -----------------------------------------------------------------------

    def _lookup(self, key: str) -> str | None:
        """Path of a published, whole file for ``key``; drops an entry whose file is damaged."""
        value = self._index.get(key, retry=True)
        if value is None:
            return None
        record = json.loads(value)
        path = os.path.join(self.directory, record["file"])
        try:
            actual = os.stat(path).st_size
        except FileNotFoundError:
            actual = None
        if actual == record["size"]:
            return path
        logger.warning(
            "dropping cache entry for %s: file is %s, expected %d bytes",
            record["url"],
            "missing" if actual is None else f"{actual} bytes",
            record["size"],
        )
        self._delete_if_current(key, record["file"])
        return None

    def _delete_if_current(self, key: str, filename: str | None) -> bool:
        """Delete the entry of ``key`` (only if it still names ``filename``, when given)."""
        with self._index.transact(retry=True):
            value = self._index.get(key, retry=True)
            if value is None:
                return False
            current = json.loads(value)["file"]
            if filename is not None and current != filename:
                return False
            self._index.delete(key, retry=True)
        self._validated.delete(current, retry=True)
        return True

    def _download_and_publish(
        self,
        url: str,
        key: str,
        download: Callable[[BinaryIO], dict],
        expected_size: int | None,
    ) -> str:
        """Download into a temp file and publish it; after a full disk, evict and try again."""
        reserve = expected_size or 0
        while True:
            temp = self._reserve(url, key, reserve)
            try:
                return self._write_and_publish(url, key, temp, download, expected_size)
            except BaseException as error:
                with suppress(FileNotFoundError):
                    os.remove(temp)
                if isinstance(error, CacheFullError) or not _is_disk_full(error):
                    raise
                if not self._free_disk_space(max(reserve, 1)):
                    raise CacheFullError(
                        url, "the disk is full and no cached file is left to evict"
                    ) from error
                logger.log(self._log_level, "disk full while caching %s; retrying", redact_url(url))

    def _reserve(self, url: str, key: str, reserve: int) -> str:
        """Make room for ``reserve`` bytes and create the temp file that holds the reservation."""
        while True:
            with self._space_lock():
                if self._make_room(url, reserve):
                    return self._new_temp_file(key, reserve)
            logger.debug("waiting for downloads in flight to make room for %s", redact_url(url))
            time.sleep(_WAIT_FOR_ROOM_SECONDS)

    def _write_and_publish(
        self,
        url: str,
        key: str,
        temp: str,
        download: Callable[[BinaryIO], dict],
        expected_size: int | None,
    ) -> str:
        """Let ``download`` fill ``temp``, make it durable, and rename it into the store."""
        started = time.monotonic()
        with open(temp, "r+b") as file:
            metadata = download(file)
            file.flush()
            os.fsync(file.fileno())
            size = os.fstat(file.fileno()).st_size
            os.fchmod(file.fileno(), 0o400)
        if expected_size is not None and size != expected_size:
            self.incr("integrity_failures")
            raise IntegrityError(url, f"{expected_size} bytes", f"{size} bytes", "cached download")
        filename = os.path.join("files", key[:2], f"{key}.{secrets.token_hex(4)}")
        record = {
            "url": strip_secrets(url),
            "file": filename,
            "size": size,
            "stored_at": time.time(),
            "metadata": _without_secrets(metadata or {}),
        }
        final = os.path.join(self.directory, filename)
        while True:
            with self._space_lock():
                if self._make_room(url, size, excluding=temp):
                    os.makedirs(os.path.dirname(final), mode=0o700, exist_ok=True)
                    os.rename(temp, final)
                    try:
                        _fsync_directory(os.path.dirname(final))
                        self._index.set(key, _Entry(filename, size, record), retry=True)
                    except BaseException:
                        os.remove(final)
                        raise
                    break
            time.sleep(_WAIT_FOR_ROOM_SECONDS)
        logger.log(
            self._log_level,
            "cached %s (%d bytes in %.2fs)",
            redact_url(url),
            size,
            time.monotonic() - started,
        )
        return final

    def _make_room(self, url: str, needed: int, excluding: str | None = None) -> bool:
        """Evict least-recently-used files until ``needed`` more bytes fit under the limit.

        Called with the space lock held. Bytes reserved by other downloads in flight count;
        returns False when only they stand in the way (the caller waits for them to finish).
        """
        if needed > self.size_limit:
            raise CacheFullError(
                url, f"{needed} bytes exceed the cache size limit of {self.size_limit}"
            )
        while True:
            reserved = sum(
                _reserved_bytes(name)
                for name in self._temp_files()
                if os.path.join(self.directory, "tmp", name) != excluding
                and not self._remove_if_stale(name)
            )
            cached = self._index_totals()[1]
            if cached + reserved + needed <= self.size_limit:
                return True
            if not self._evict_least_recently_used():
                return False

    def _evict_least_recently_used(self) -> bool:
        """Evict the least recently used file; False if there is none."""
        rows = self._query("SELECT key, value FROM Cache ORDER BY access_time LIMIT 1")
        if not rows:
            return False
        key, value = rows[0]
        record = json.loads(value)
        if self._delete_if_current(key, record["file"]):
            self.incr("evictions")
            logger.log(self._log_level, "evicted %s (%d bytes)", record["url"], record["size"])
        return True

    def _free_disk_space(self, needed: int) -> bool:
        """After a full disk: evict until ``needed`` bytes are free; False if none was evicted."""
        evicted = False
        with self._space_lock():
            while _free_bytes(self.directory) < needed and self._evict_least_recently_used():
                evicted = True
            if not evicted:
                evicted = self._evict_least_recently_used()
        return evicted

    def _new_temp_file(self, key: str, reserve: int) -> str:
        """Create the temp file of a download; its name records the owner pid and reservation."""
        name = f"{key}.{os.getpid()}.{secrets.token_hex(4)}.{reserve}.part"
        path = os.path.join(self.directory, "tmp", name)
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        return path

    def _temp_files(self) -> list[str]:
        try:
            return [
                n for n in os.listdir(os.path.join(self.directory, "tmp")) if n.endswith(".part")
            ]
        except FileNotFoundError:
            return []

    def _remove_leftovers(self, key: str) -> None:
        """Remove what killed processes left for ``key``: temp files, and published files that
        never made it into the index. Called on a miss with the key's lock held, so no one else
        is writing these files and none of them is referenced."""
        places = [
            os.path.join(self.directory, "tmp"),
            os.path.join(self.directory, "files", key[:2]),
        ]
        for place in places:
            with suppress(FileNotFoundError):
                for name in os.listdir(place):
                    if name.startswith(key + "."):
                        logger.log(self._log_level, "removing leftover file %s", name)
                        with suppress(FileNotFoundError):
                            os.remove(os.path.join(place, name))

    def _remove_if_stale(self, name: str) -> bool:
        """Remove a temp file whose download is not in progress (its key lock is free)."""
        key = name.split(".", 1)[0]
        lock = FileLock(self._lock_path(key), timeout=0)
        try:
            lock.acquire()
        except Timeout:
            return False
        try:
            logger.log(self._log_level, "removing stale temp file %s", name)
            with suppress(FileNotFoundError):
                os.remove(os.path.join(self.directory, "tmp", name))
        finally:
            lock.release()
        return True

    def _lock_path(self, key: str) -> str:
        return os.path.join(self.directory, "locks", f"{key}.lock")

    @contextmanager
    def _key_lock(self, key: str) -> Iterator[None]:
        lock = FileLock(self._lock_path(key))
        if not _try_acquire(lock):
            logger.debug("waiting for another process downloading %s", key)
            lock.acquire()
        try:
            yield
        finally:
            lock.release()

    @contextmanager
    def _space_lock(self) -> Iterator[None]:
        lock = FileLock(os.path.join(self.directory, "locks", "space.lock"))
        with lock:
            yield

    def _index_totals(self) -> tuple[int, int]:
        """Files and bytes in the index, from the totals diskcache's triggers maintain."""
        totals = dict(self._query("SELECT key, value FROM Settings WHERE key IN ('count', 'size')"))
        return totals["count"], totals["size"]

    def _query(self, statement: str) -> list[tuple]:
        """Read diskcache's ``Cache`` table directly: its public API has no LRU-ordered listing."""
        path = pathname2url(os.path.join(self.directory, DBNAME))
        with _FORK_GUARD:
            connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=60)
            try:
                return connection.execute(statement).fetchall()
            finally:
                connection.close()


def _try_acquire(lock: FileLock) -> bool:
    try:
        lock.acquire(timeout=0)
    except Timeout:
        return False
    return True


def _reserved_bytes(temp_name: str) -> int:
    """The reservation recorded in a temp file name ``<key>.<pid>.<token>.<bytes>.part``."""
    try:
        return int(temp_name.split(".")[-2])
    except (IndexError, ValueError):
        return 0


def _without_secrets(metadata: dict) -> dict:
    """``metadata`` with any URL-like string value redacted, so no secret reaches the index."""
    return {k: redact_url(v) if isinstance(v, str) else v for k, v in metadata.items()}


def _free_bytes(directory: str) -> int:
    usage = os.statvfs(directory)
    return usage.f_bavail * usage.f_frsize


def _fsync_directory(directory: str) -> None:
    """Make a rename durable across power loss."""
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
