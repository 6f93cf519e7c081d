"""The index of a cache directory, kept by diskcache: entries, write generations, counters.

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

Invariants:

- One entry per published file. The index never holds a secret: keys are digests, URLs
  are shown (redacted) text.
- A write bumps the key's generation and drops its entry in one transaction
  (``Cache.transact``); a download publishes only inside a transaction that finds the
  generation it started from (:meth:`Index.publish`), so no interleaving lets a download
  begun before a write publish after it.
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
- Least-recently-used order is diskcache's store time (``eviction_policy=
  "least-recently-stored"``): a use of an entry re-stores it (batched per process by
  :mod:`.usage`), so a lookup is a plain read, never a write transaction, and an entry's
  place only moves forward. diskcache never evicts by itself (``cull_limit=0``): the cache
  evicts, and deletes its files, itself. Statistics and the tag index are off.
- Values stay inside ``cache.db``, and nothing read from a row is unpickled, opened or
  deleted by diskcache (:class:`_IndexDisk`): a planted row is data, never a path followed.
- Rows other than entries have size 0, so diskcache's maintained total size is the bytes
  of the cached files.
- ``cache.db`` is created 0600 (its journal takes the same mode) before diskcache opens it,
  never through a symlink.
- A corrupt database is moved aside to ``cache.db.corrupt`` and started empty, once, with a
  warning naming the path (:meth:`Index.on_reset` lets the cache delete the files it held).
  Read-only, it is ignored instead: every lookup misses.
- What diskcache's API does not give is read from its documented tables, read-only, in
  :class:`_Table` alone: entries in least-recently-used order, their number and bytes, and
  every read of a read-only cache (``diskcache.Cache`` writes its settings when it opens).
"""

from __future__ import annotations

import errno
import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar
from urllib.request import pathname2url

import diskcache
from diskcache.core import MODE_RAW, UNKNOWN

from fsspec_shards.storage.backends.identity import KEY_FORMAT
from fsspec_shards.storage.cache import layout, space
from fsspec_shards.storage.cache.notices import warn_once
from fsspec_shards.storage.deps.diskcache import delete_raw_keys, open_cache

T = TypeVar("T")

ENTRY, GENERATION, COUNTER, KEY_FORMAT_NAME = "entry:", "generation:", "counter:", "key_format"
PENDING = "pending:"
SIZE_LIMIT = "size_limit"
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
_REMEMBERED_LOOKUPS = 65536

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


class _Entry:
    """An entry's value as diskcache stores it: JSON text, and the file's size."""

    __slots__ = ("size", "text")

    def __init__(self, record: dict) -> None:
        self.size = record["size"]
        self.text = json.dumps(record, default=str)


def _record(value: Any) -> dict | None:
    """The record of an entry's stored text; None for anything the index did not write."""
    if not isinstance(value, str):
        return None
    try:
        record = json.loads(value)
    except ValueError:
        return None
    if not isinstance(record, dict) or not isinstance(record.get("file"), str):
        return None
    return record if type(record.get("size")) is int else None


def _integer(value: Any) -> int:
    return value if type(value) is int else 0


class _IndexDisk(diskcache.Disk):
    """diskcache's serializer for the index: every value stays inside ``cache.db``, an
    entry's row carries its file's size, and a row's value is never unpickled and its
    filename never opened or deleted (the cache deletes its own files, by the names it
    makes)."""

    def store(self, value: Any, read: bool, key: Any = UNKNOWN) -> tuple:
        if isinstance(value, _Entry):
            return value.size, MODE_RAW, None, value.text
        if type(value) in (int, str):
            return 0, MODE_RAW, None, value
        raise TypeError(f"the cache index stores no {type(value).__name__}")

    def fetch(self, mode: int, filename: str | None, value: Any, read: bool) -> Any:
        return value if mode == MODE_RAW else None

    def remove(self, file_path: str) -> None:
        """Nothing: diskcache writes no files for the index."""


class _Table:
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
        return 0 if found is None else _integer(found[0])


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


class Index:
    """The index of the cache directory ``directory``, shared by the threads of a process.

    ``writable`` False opens it read-only. ``space_lock`` is the cache's space lock (held
    while a corrupt index is replaced); ``on_reset`` is called after a replacement, with
    the lock held, to delete the files the lost index described.
    """

    def __init__(
        self,
        directory: str,
        writable: bool,
        space_lock: Callable[[], Any],
        on_reset: Callable[[], None],
    ) -> None:
        self.directory = directory
        self.path = os.path.join(directory, layout.INDEX)
        self.writable = writable
        self.broken = False
        self._space_lock = space_lock
        self._on_reset = on_reset
        self._table = _Table(self.path)
        self._opening = threading.Lock()
        self._store: diskcache.Cache | None = None
        self._store_epoch = -1
        self._epoch = 0
        self._inode: int | None = None
        self._header: tuple[int, int, int] = (-1, -1, -1)  # pid, epoch, descriptor
        self._remembered: dict[str, tuple[bytes, tuple[str, int] | None]] = {}

    # -- the database --------------------------------------------------------------------

    def _diskcache(self) -> diskcache.Cache | None:
        """The diskcache of a writable index, opened again after the file was replaced;
        None once the index turned out read-only."""
        if self._store is not None and self._store_epoch == self._epoch and self.writable:
            return self._store
        with self._opening:
            if not self.writable:
                return None
            if self._store is None or self._store_epoch != self._epoch:
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
                self._store, self._store_epoch, self._inode = store, self._epoch, _inode(self.path)
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
                    self.directory, timeout=_BUSY_TIMEOUT_SECONDS, disk=_IndexDisk, **_SETTINGS
                )
            except sqlite3.OperationalError as error:
                # diskcache's set-up retries a busy database for most statements, not all
                # (its tag index): processes opening one index at once try again.
                if "database is locked" not in str(error) or time.monotonic() > deadline:
                    raise
                time.sleep(_OPEN_RETRY_SECONDS)

    def _connection(self) -> sqlite3.Connection:
        """The table reader's connection (a writable index's file opened first)."""
        if self.writable:
            self._diskcache()
        return self._table.connection(self._epoch, self.writable)

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
            self._epoch += 1

    # -- running operations --------------------------------------------------------------

    def _run(self, operation: Callable[[], T], default: T) -> T:
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

    def _write(self, operation: Callable[[diskcache.Cache], T], default: T = None) -> T:
        """``operation(cache)`` inside one write transaction."""

        def transact() -> T:
            store = self._diskcache()
            if store is None:
                raise ReadOnlyCacheError(self.directory)
            with store.transact():
                return operation(store)

        return self._run(transact, default)

    def _value(self, name: str) -> Any:
        """The value stored under ``name`` (through diskcache when the index is writable)."""
        store = self._diskcache()
        if store is not None:
            return store.get(name)
        return self._table.value(self._connection(), name)

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
        self._epoch += 1  # every thread reconnects
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
            self._epoch += 1  # threads that reconnected meanwhile reached the corrupt file
            self._inode = None
            with FORK_GUARD:  # taken after the space lock, as everywhere: never the other way
                self._diskcache()
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

    # -- reading -------------------------------------------------------------------------

    def lookup(self, key: str) -> tuple[str, int, str | None] | None:
        """``(file, size, boot)`` recorded for ``key`` (``boot``: the boot it was published
        under when not durable yet, else None), or None: the hit path, kept short.

        Answers are remembered with the database's file change counter (header bytes
        24-27, which every committed write moves, in any process) read *before* the query;
        a remembered answer is used only while the counter still reads the same, so a
        hit costs one ``pread`` instead of a query.
        """
        counter = self._change_counter()
        if counter is not None:
            remembered = self._remembered.get(key)
            if remembered is not None and remembered[0] == counter:
                return remembered[1]
        found = self._run(
            lambda: _file_and_size(self._value(ENTRY + key), self._value(PENDING + key)), None
        )
        if counter is not None:
            if len(self._remembered) >= _REMEMBERED_LOOKUPS:
                self._remembered.clear()
            self._remembered[key] = (counter, found)
        return found

    def _change_counter(self) -> bytes | None:
        """The database's file change counter, through a descriptor kept per process and
        per index file (None when it cannot be read: then every lookup queries)."""
        pid, epoch, descriptor = self._header
        if pid != os.getpid() or epoch != self._epoch:
            try:
                descriptor = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError:
                return None
            # The previous descriptor stays open: another thread may be reading through it.
            self._header = (os.getpid(), self._epoch, descriptor)
            self._remembered = {}
        try:
            counter = os.pread(descriptor, 4, 24)
        except OSError:
            return None
        return counter if len(counter) == 4 else None

    def metadata(self, key: str) -> tuple[Row, dict] | None:
        """The entry of ``key`` and the metadata its download returned."""
        record = self._run(lambda: _record(self._value(ENTRY + key)), None)
        if record is None:
            return None
        metadata = record.get("metadata")
        row = Row(key, record, record["size"], record.get("stored_at", 0.0))
        return row, metadata if isinstance(metadata, dict) else {}

    def rows(self, limit: int = -1) -> list[Row]:
        """Entries, least recently used first."""
        found = self._run(lambda: _Table.rows(self._connection(), ENTRY, limit), [])
        return [
            Row(name[len(ENTRY) :], _record(value), size, stored)
            for name, value, size, stored in found
        ]

    def least_recent(self) -> Row | None:
        found = self.rows(limit=1)
        return found[0] if found else None

    def generation(self, key: str) -> int:
        return self._run(lambda: _integer(self._value(GENERATION + key)), 0)

    def totals(self) -> tuple[int, int]:
        """Files and bytes in the index."""

        def count() -> tuple[int, int]:
            connection = self._connection()
            return _Table.count(connection, ENTRY), _Table.total_size(connection)

        return self._run(count, (0, 0))

    def cached_bytes(self) -> int:
        """Bytes of the files in the index (diskcache's maintained total: no scan)."""
        return self._run(lambda: _Table.total_size(self._connection()), 0)

    def counters(self) -> dict[str, int]:
        found = self._run(lambda: _Table.rows(self._connection(), COUNTER), [])
        return {name[len(COUNTER) :]: _integer(value) for name, value, _, _ in found}

    def key_format(self) -> str | None:
        return self._run(lambda: self._value(KEY_FORMAT_NAME), None)

    # -- writing -------------------------------------------------------------------------

    def publish(
        self,
        key: str,
        file: str,
        size: int,
        shown: str,
        metadata: dict,
        since: int,
        boot: str | None = None,
    ) -> tuple[bool, str | None]:
        """Record ``file`` for ``key`` if the key's generation is still ``since``; with
        ``boot``, as not durable yet, published under that boot (:meth:`mark_durable`).

        Returns whether it was recorded and the file of the entry it replaced.
        """

        def insert(store: diskcache.Cache) -> tuple[bool, str | None]:
            if _integer(store.get(GENERATION + key)) != since:
                return False, None
            old = _record(store.get(ENTRY + key))
            now = time.time()
            record = {"file": file, "size": size, "shown": shown, "metadata": metadata}
            if boot is not None:
                store.set(PENDING + key, json.dumps({"file": file, "boot": boot}))
            else:
                store.delete(PENDING + key)
            store.set(ENTRY + key, _Entry({**record, "stored_at": now, "validated_at": now}))
            return True, None if old is None else old["file"]

        return self._write(insert, (False, None))

    def drop(self, key: str, *, written: bool) -> str | None:
        """Delete the entry of ``key``; with ``written`` also bump its generation, so no
        download begun before now publishes. Returns the file the entry named."""

        def delete(store: diskcache.Cache) -> str | None:
            if written:
                store.incr(GENERATION + key)
            old = _record(store.get(ENTRY + key))
            store.delete(ENTRY + key)
            store.delete(PENDING + key)
            return None if old is None else old["file"]

        return self._write(delete)

    def drop_if(self, key: str, file: str | None) -> bool:
        """Delete the entry of ``key`` only if it still names ``file`` (None: a row the
        index did not write)."""

        def delete(store: diskcache.Cache) -> bool:
            value = store.get(ENTRY + key)
            record = _record(value)
            if (None if record is None else record["file"]) != file:
                return False
            store.delete(PENDING + key)
            return store.delete(ENTRY + key)

        return self._write(delete, False)

    def drop_least_recent(self, limit: int, covering: int | None = None) -> list[Row]:
        """Delete least recently used entries in one transaction: at most ``limit``, and
        no more than it takes to cover ``covering`` bytes (None: ``limit`` of them). The
        rows deleted (their files are the caller's to delete)."""

        def delete(store: diskcache.Cache) -> list[Row]:
            # Read under this transaction's write lock: no other writer changes the rows
            # between this SELECT (on the table's connection) and the deletes.
            found = _Table.rows(self._connection(), ENTRY, limit)
            dropped, names, freed = [], [], 0
            for name, value, size, stored in found:
                if covering is not None and freed >= covering:
                    break
                key = name[len(ENTRY) :]
                names += (name, PENDING + key)
                dropped.append(Row(key, _record(value), size, stored))
                freed += size
            delete_raw_keys(store, names)  # one statement per 250 entries, not 3 each
            return dropped

        return self._write(delete, [])

    def size_limit(self) -> int | None:
        """The size limit recorded by the last writable use (None: never recorded)."""
        found = self._run(lambda: self._value(SIZE_LIMIT), None)
        return found if type(found) is int else None

    def record_size_limit(self, limit: int) -> None:
        """Record the size limit this cache is used with (a write only when it changed)."""
        if self.size_limit() != limit:
            self._write(lambda store: store.set(SIZE_LIMIT, int(limit)))

    def record_usage(self, touches: dict[str, float], counts: dict[str, int]) -> None:
        """Re-store the entries used (in the order of their use: their least-recently-used
        place moves forward) and add counter increments, in one transaction."""

        def apply(store: diskcache.Cache) -> None:
            for key in sorted(touches, key=touches.__getitem__):
                record = _record(store.get(ENTRY + key))
                if record is not None:
                    store.set(ENTRY + key, _Entry(record))
            for name, amount in counts.items():
                store.incr(COUNTER + name, amount)

        self._write(apply)

    def mark_durable(self, key: str, file: str) -> None:
        """The entry of ``key`` is on disk, if it still names ``file``."""

        def update(store: diskcache.Cache) -> None:
            if _pending(store.get(PENDING + key), file) is not None:
                store.delete(PENDING + key)  # (the entry's row, its LRU place, untouched)

        self._write(update)

    def touch_validated(self, key: str) -> None:
        def update(store: diskcache.Cache) -> None:
            record = _record(store.get(ENTRY + key))
            if record is not None:
                store.set(ENTRY + key, _Entry({**record, "validated_at": time.time()}))

        self._write(update)

    def clear(self) -> list[tuple[str, str | None]]:
        """Delete every entry and counter; the ``(key, file)`` of the entries deleted.
        Generations stay, so a download in flight still cannot publish over a write."""

        def delete(store: diskcache.Cache) -> list[tuple[str, str | None]]:
            dropped = self._drop_entries(store)
            for name, _, _, _ in _Table.rows(self._connection(), COUNTER):
                store.delete(name)
            return dropped

        return self._write(delete, [])

    def set_key_format(self) -> list[tuple[str, str | None]]:
        """Drop every entry made under another key format (they could never be hit) and
        record the current one; the ``(key, file)`` of the entries dropped."""

        def reset(store: diskcache.Cache) -> list[tuple[str, str | None]]:
            if store.get(KEY_FORMAT_NAME) == KEY_FORMAT:
                return []
            dropped = self._drop_entries(store)
            store.set(KEY_FORMAT_NAME, KEY_FORMAT)
            return dropped

        return self._write(reset, [])

    def _drop_entries(self, store: diskcache.Cache) -> list[tuple[str, str | None]]:
        """Inside a transaction: delete every entry; their ``(key, file)``."""
        dropped = []
        for name, value, _, _ in _Table.rows(self._connection(), ENTRY):
            store.delete(name)
            record = _record(value)
            dropped.append((name[len(ENTRY) :], None if record is None else record["file"]))
        return dropped

    def adopt(
        self,
        entries: Iterable[tuple[str, dict]],
        generations: dict[str, int],
        counters: dict[str, int],
    ) -> None:
        """Take over what an index of an earlier layout held, in one transaction: entries
        ``(key, record)`` (records as :meth:`publish` makes them, least recently used
        first), generations and counters, made under the current key format."""

        def insert(store: diskcache.Cache) -> None:
            for names, values in ((GENERATION, generations), (COUNTER, counters)):
                for name, value in values.items():  # max: a second run changes nothing
                    current = _integer(store.get(names + name))
                    store.set(names + name, max(_integer(value), current))
            for key, record in entries:
                store.set(ENTRY + key, _Entry(record))
            store.set(KEY_FORMAT_NAME, KEY_FORMAT)

        self._write(insert)


def _file_and_size(value: Any, pending: Any) -> tuple[str, int, str | None] | None:
    record = _record(value)
    if record is None:
        return None
    return record["file"], record["size"], _pending(pending, record["file"])


def _pending(value: Any, file: str) -> str | None:
    """The boot under which ``file`` was published if its pending row names it, else None."""
    try:
        pending = json.loads(value) if isinstance(value, str) else None
    except ValueError:
        return None
    if not isinstance(pending, dict) or pending.get("file") != file:
        return None
    return str(pending.get("boot"))
