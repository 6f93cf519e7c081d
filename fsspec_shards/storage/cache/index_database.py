"""The database of a cache's index: opening diskcache on ``cache.db``, running operations
on it from any thread of any process, and recovering from a corrupt, replaced or read-only
file; and how the index's rows are stored in it.

Invariants of the database:

- Rollback journal (``sqlite_journal_mode="delete"``, no WAL): every SQLite lock is a
  ``fcntl`` lock on ``cache.db`` held only inside a statement or transaction, which
  survives ``fork`` (no shared-memory file whose lock bookkeeping a child would inherit)
  and reads on read-only media. No fork happens while a thread of this process is inside
  the index (:data:`FORK_GUARD`, taken after the cache's file locks, never before: filelock
  holds forks back while a lock changes hands).
- ``synchronous=FULL``: in rollback-journal mode SQLite's NORMAL can lose or corrupt the
  last commit on power loss; FULL syncs the journal and the database at every commit, so
  a commit that returned survives a machine crash (a few small fsyncs per published file,
  off the data's path: the data file itself is synced in the background,
  ``storage/cache/durability.py``).
- diskcache never evicts by itself (``cull_limit=0``): the cache evicts, and deletes its
  files, itself. Statistics and the tag index are off.
- ``cache.db`` is created 0600 (its journal takes the same mode) before diskcache opens it,
  never through a symlink.
- A corrupt database is moved aside to ``cache.db.corrupt`` and started empty, once, with a
  warning naming the path (``on_reset`` lets the cache delete the files it held).
  Read-only, it is ignored instead: every lookup misses.
- What diskcache's API does not give is read from its documented tables, read-only, in
  :class:`Table` alone: entries in least-recently-used order, their number and bytes, and
  every read of a read-only cache (``diskcache.Cache`` writes its settings when it opens).

The rows: their names, their values, and the serializer that keeps every value inside
``cache.db``.

One ``diskcache.Cache`` on the cache directory (its database, ``cache.db``) holds, under
string keys::

    entry:<key>        a published file: JSON {file, size, shown, stored_at, validated_at,
                       metadata}; the row's size column is the file's size
    pending:<key>      JSON {file, boot}: that file of the entry is not durable yet; it was
                       published under boot ``boot`` (storage/cache/durability.py)
    generation:<key>   the key's write generation (int)
    counter:<name>     a counter shared by every process (int)
    size_limit         the size limit the cache was last used with (int)
    key_format         the ObjectId key format the entries were made under

Invariants of the rows:

- The index never holds a secret: keys are digests, URLs are shown (redacted) text.
- Values stay inside ``cache.db``, and nothing read from a row is unpickled, opened or
  deleted by diskcache (:class:`IndexDisk`): a planted row is data, never a path followed;
  a value the index did not write reads as no record (:func:`record`).
- Rows other than entries have size 0, so diskcache's maintained total size is the bytes
  of the cached files.
"""

from __future__ import annotations

import errno
import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.request import pathname2url

import diskcache
from diskcache.core import MODE_RAW, UNKNOWN

from fsspec_shards.storage.cache import layout, space
from fsspec_shards.storage.cache.notices import warn_once
from fsspec_shards.storage.deps.diskcache import open_cache

ENTRY, GENERATION, COUNTER, KEY_FORMAT_NAME = "entry:", "generation:", "counter:", "key_format"
PENDING = "pending:"
SIZE_LIMIT = "size_limit"


class Row:
    """An entry: file (relative name as stored; None if the row is not one the cache
    wrote), size, shown URL and times."""

    __slots__ = ("key", "file", "size", "shown", "stored_at", "accessed_at", "validated_at")

    def __init__(self, key: str, record: dict | None, size: int, accessed_at: float) -> None:
        record = record or {}
        self.key, self.file, self.size = key, record.get("file"), size
        self.shown = str(record.get("shown") or f"an entry the cache did not write ({key})")
        self.stored_at = record.get("stored_at", accessed_at)
        self.validated_at = record.get("validated_at", self.stored_at)
        self.accessed_at = accessed_at


class Entry:
    """An entry's value as diskcache stores it: JSON text, and the file's size."""

    __slots__ = ("size", "text")

    def __init__(self, record: dict) -> None:
        self.size = record["size"]
        self.text = json.dumps(record, default=str)


def read_record(value: Any) -> dict | None:
    """The record of an entry's stored text; None for anything the index did not write."""
    if not isinstance(value, str):
        return None
    try:
        loaded = json.loads(value)
    except ValueError:
        return None
    if not isinstance(loaded, dict) or not isinstance(loaded.get("file"), str):
        return None
    return loaded if type(loaded.get("size")) is int else None


def integer(value: Any) -> int:
    return value if type(value) is int else 0


class IndexDisk(diskcache.Disk):
    """diskcache's serializer for the index: every value stays inside ``cache.db``, an
    entry's row carries its file's size, and a row's value is never unpickled and its
    filename never opened or deleted (the cache deletes its own files, by the names it
    makes)."""

    def store(self, value: Any, read: bool, key: Any = UNKNOWN) -> tuple:
        if isinstance(value, Entry):
            return value.size, MODE_RAW, None, value.text
        if type(value) in (int, str):
            return 0, MODE_RAW, None, value
        raise TypeError(f"the cache index stores no {type(value).__name__}")

    def fetch(self, mode: int, filename: str | None, value: Any, read: bool) -> Any:
        return value if mode == MODE_RAW else None

    def remove(self, file_path: str) -> None:
        """Nothing: diskcache writes no files for the index."""


def file_and_size(value: Any, pending: Any) -> tuple[str, int, str | None] | None:
    found = read_record(value)
    if found is None:
        return None
    return found["file"], found["size"], pending_boot(pending, found["file"])


def pending_boot(value: Any, file: str) -> str | None:
    """The boot under which ``file`` was published if its pending row names it, else None."""
    try:
        pending = json.loads(value) if isinstance(value, str) else None
    except ValueError:
        return None
    if not isinstance(pending, dict) or pending.get("file") != file:
        return None
    return str(pending.get("boot"))


T = TypeVar("T")

_SETTINGS = {
    "eviction_policy": "least-recently-stored",
    "cull_limit": 0,
    "statistics": False,
    "tag_index": False,
    "sqlite_journal_mode": "delete",
    "sqlite_synchronous": 2,  # FULL: see the module docstring
}
_CORRUPT_CODES = frozenset({11, 26})  # SQLITE_CORRUPT, SQLITE_NOTADB
_READONLY_CODES = frozenset({8, 14})  # SQLITE_READONLY, SQLITE_CANTOPEN
_UNWRITABLE = frozenset({errno.EROFS, errno.EACCES, errno.EPERM})
_BUSY_TIMEOUT_SECONDS = 120
_OPEN_RETRY_SECONDS = 0.01

# SQLite keeps each process's lock state in memory, and a forked child inherits it: a child
# forked while another thread is inside a transaction believes that lock held by itself.
# No fork happens while a thread of this process is inside the index.
FORK_GUARD = threading.RLock()


def _hold_forks() -> None:
    FORK_GUARD.acquire()


def _allow_forks() -> None:
    FORK_GUARD.release()


def _after_fork_in_child() -> None:
    global FORK_GUARD
    FORK_GUARD = threading.RLock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(
        before=_hold_forks, after_in_parent=_allow_forks, after_in_child=_after_fork_in_child
    )


class ReadOnlyCacheError(OSError):
    """The cache cannot be written (read-only medium or permissions): misses stream."""

    def __init__(self, path: str, detail: str = "is read-only") -> None:
        super().__init__(errno.EROFS, f"cache {path} {detail}")
        self.filename = path


class Table:
    """Read-only queries of diskcache's ``Cache`` and ``Settings`` tables (the schema
    ``diskcache.core.Cache.__init__`` creates and documents), for what diskcache's API does
    not give: entries in least-recently-used (store time) order, their number, the total
    size diskcache maintains, and every read of a read-only cache. Only SELECTs run here.

    A writable cache's connection may roll back a journal a killed writer left; a read-only
    one opens the file ``mode=ro``, or ``immutable`` when a hot journal cannot be rolled back.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._local = threading.local()

    def connection(self, epoch: int, writable: bool) -> sqlite3.Connection:
        local = self._local
        if getattr(local, "pid", None) == os.getpid() and local.epoch == epoch:
            return local.connection
        if getattr(local, "connection", None) is not None:
            local.connection.close()
        url = pathname2url(self.path)
        if writable:
            connection = sqlite3.connect(
                f"file:{url}?mode=rw", uri=True, timeout=_BUSY_TIMEOUT_SECONDS
            )
        else:
            try:
                connection = sqlite3.connect(f"file:{url}?mode=ro", uri=True, timeout=5)
                connection.execute("SELECT count(*) FROM Settings").fetchall()
            except sqlite3.OperationalError:  # a hot journal no one can roll back, no file
                connection = sqlite3.connect(f"file:{url}?immutable=1", uri=True)
        connection.isolation_level = None
        local.connection, local.pid, local.epoch = connection, os.getpid(), epoch
        return connection

    @staticmethod
    def value(connection: sqlite3.Connection, name: str) -> Any:
        found = connection.execute(
            "SELECT value FROM Cache WHERE key = ? AND raw = 1 AND mode = ?", (name, MODE_RAW)
        ).fetchone()
        return None if found is None else found[0]

    @staticmethod
    def rows(connection: sqlite3.Connection, prefix: str, limit: int = -1) -> list[tuple]:
        """``(name, value, size, store_time)`` of the rows named ``prefix...``, least
        recently stored first (value None where diskcache did not keep it inline)."""
        return connection.execute(
            # +key: the range must not pick the key index, or every row is sorted to
            # return the first few; diskcache's store_time index gives them in order
            "SELECT key, CASE mode WHEN ? THEN value END, size, store_time FROM Cache "
            "WHERE +key >= ? AND +key < ? AND raw = 1 ORDER BY store_time LIMIT ?",
            (MODE_RAW, *_range(prefix), limit),
        ).fetchall()

    @staticmethod
    def count(connection: sqlite3.Connection, prefix: str) -> int:
        return connection.execute(
            "SELECT count(*) FROM Cache WHERE key >= ? AND key < ?", _range(prefix)
        ).fetchone()[0]

    @staticmethod
    def total_size(connection: sqlite3.Connection) -> int:
        found = connection.execute("SELECT value FROM Settings WHERE key = 'size'").fetchone()
        return 0 if found is None else integer(found[0])


def _range(prefix: str) -> tuple[str, str]:
    """Bounds of the names starting with ``prefix`` (which ends with ':')."""
    return prefix, prefix[:-1] + chr(ord(prefix[-1]) + 1)


def _inode(path: str) -> int | None:
    try:
        return os.stat(path).st_ino
    except FileNotFoundError:
        return None


def _cause(error: BaseException) -> BaseException:
    """The sqlite3 error behind ``error`` (diskcache raises its Timeout from one)."""
    if isinstance(error, diskcache.Timeout) and isinstance(error.__context__, sqlite3.Error):
        return error.__context__
    return error


def _is_corrupt(error: BaseException) -> bool:
    code = getattr(error, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in _CORRUPT_CODES
    return type(error) is sqlite3.DatabaseError


def _is_unmade(error: BaseException) -> bool:
    return isinstance(error, sqlite3.OperationalError) and "no such table" in str(error)


def _is_read_only(error: BaseException) -> bool:
    code = getattr(error, "sqlite_errorcode", None)
    return isinstance(error, sqlite3.OperationalError) and (
        (code is not None and code & 0xFF in _READONLY_CODES) or "readonly" in str(error)
    )


class Database:
    """The diskcache of the index of ``directory``, shared by the threads of a process.

    ``writable`` False opens it read-only (and it turns read-only when it is found so).
    ``space_lock`` is the cache's space lock (held while a corrupt index is replaced);
    ``on_reset`` is called after a replacement, with the lock held, to delete the files
    the lost index described.
    """

    def __init__(
        self,
        directory: str,
        writable: bool,
        space_lock: Callable[[], Any],
        on_reset: Callable[[], None],
    ) -> None:
        self.directory = directory
        self.path = layout.index_path(directory)
        self.writable = writable
        self.broken = False
        self.epoch = 0
        """Moves each time the file is replaced: every thread reconnects."""
        self._space_lock = space_lock
        self._on_reset = on_reset
        self._table = Table(self.path)
        self._opening = threading.Lock()
        self._store: diskcache.Cache | None = None
        self._store_epoch = -1
        self._inode: int | None = None

    def writable_cache(self) -> diskcache.Cache | None:
        """The diskcache of a writable index, opened again after the file was replaced;
        None once the index turned out read-only."""
        if self._store is not None and self._store_epoch == self.epoch and self.writable:
            return self._store
        with self._opening:
            if not self.writable:
                return None
            if self._store is None or self._store_epoch != self.epoch:
                try:
                    store = self._open()
                except OSError as error:
                    if error.errno not in _UNWRITABLE:
                        raise
                    self._become_read_only()
                    return None
                except sqlite3.OperationalError as error:
                    if not _is_read_only(error):
                        raise
                    self._become_read_only()
                    return None
                self._store, self._store_epoch, self._inode = store, self.epoch, _inode(self.path)
            return self._store

    def _open(self) -> diskcache.Cache:
        try:
            flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            os.close(os.open(self.path, flags, 0o600))
        except FileExistsError:
            pass
        deadline = time.monotonic() + _BUSY_TIMEOUT_SECONDS
        while True:
            try:
                return open_cache(
                    self.directory, timeout=_BUSY_TIMEOUT_SECONDS, disk=IndexDisk, **_SETTINGS
                )
            except sqlite3.OperationalError as error:
                # diskcache's set-up retries a busy database for most statements, not all
                # (its tag index): processes opening one index at once try again.
                if "database is locked" not in str(error) or time.monotonic() > deadline:
                    raise
                time.sleep(_OPEN_RETRY_SECONDS)

    def connection(self) -> sqlite3.Connection:
        """The table reader's connection (a writable index's file opened first)."""
        if self.writable:
            self.writable_cache()
        return self._table.connection(self.epoch, self.writable)

    def _become_read_only(self) -> None:
        self.writable = False
        warn_once(
            self.directory,
            "read-only",
            f"cache {self.directory} is read-only: cached files are served, "
            "everything else is read without caching",
        )

    def _notice_replacement(self) -> None:
        """Reconnect everything when another process replaced the index file."""
        inode = _inode(self.path)
        if inode != self._inode:
            self._inode = inode
            self.epoch += 1

    def run(self, operation: Callable[[], T], default: T) -> T:
        """``operation()``; a corrupt index is replaced once and the operation run again; a
        broken read-only index gives ``default``."""
        for attempt in range(2):
            if self.broken:
                return default
            self._notice_replacement()
            try:
                with FORK_GUARD:
                    return operation()
            except (OSError, sqlite3.Error, diskcache.Timeout) as raised:
                if space.is_disk_full(raised):
                    # SQLite rolled back by itself: diskcache's ROLLBACK then fails with
                    # "no transaction is active", hiding SQLITE_FULL. Either way: ENOSPC.
                    raise space.DiskFullError(self.directory) from None
                if isinstance(raised, OSError):
                    raise
                error = _cause(raised)
                if _is_unmade(error):
                    return default  # a database diskcache has not set up yet: empty
                if _is_read_only(error):
                    if not self.writable:
                        return default  # read-only, and no index to read: an empty cache
                    self._become_read_only()
                    raise ReadOnlyCacheError(self.directory) from None
                if not _is_corrupt(error) or attempt:
                    if error is raised:
                        raise
                    raise error from None
            self._replace_corrupt()
        return default

    def write(self, operation: Callable[[diskcache.Cache], T], default: T = None) -> T:
        """``operation(cache)`` inside one write transaction."""

        def transact() -> T:
            store = self.writable_cache()
            if store is None:
                raise ReadOnlyCacheError(self.directory)
            with store.transact():
                return operation(store)

        return self.run(transact, default)

    def value(self, name: str) -> Any:
        """The value stored under ``name`` (through diskcache when the index is writable)."""
        store = self.writable_cache()
        if store is not None:
            return store.get(name)
        return self._table.value(self.connection(), name)

    def _replace_corrupt(self) -> None:
        """Move a corrupt index aside and start empty (read-only: ignore the index)."""
        if not self.writable:
            self.broken = True
            warn_once(
                self.path,
                "corrupt",
                f"cache index {self.path} is corrupt and the cache is read-only: "
                "reading without the cache",
            )
            return
        self.epoch += 1  # every thread reconnects
        with self._space_lock():
            if not self._is_corrupt_now():
                return  # another process replaced it already
            aside = self.path + ".corrupt"
            os.replace(self.path, aside)
            with_journal = self.path + "-journal"
            if os.path.lexists(with_journal):
                os.replace(with_journal, aside + "-journal")
            warn_once(
                self.path,
                "corrupt",
                f"cache index {self.path} was corrupt: moved aside to {aside} and started "
                "empty (the files it described are deleted)",
            )
            self.epoch += 1  # threads that reconnected meanwhile reached the corrupt file
            self._inode = None
            with FORK_GUARD:  # taken after the space lock, as everywhere: never the other way
                self.writable_cache()
            self._on_reset()

    def _is_corrupt_now(self) -> bool:
        url = pathname2url(self.path)
        with FORK_GUARD:
            try:
                probe = sqlite3.connect(f"file:{url}?mode=rw", uri=True, timeout=5)
            except sqlite3.OperationalError:
                return False  # moved aside by another process: the next open makes a new one
            try:
                probe.execute("SELECT count(*) FROM Cache").fetchone()
            except sqlite3.DatabaseError as error:
                return _is_corrupt(error)
            finally:
                probe.close()
        return False
