"""The SQLite index of a cache directory: entries, write generations and counters.

Invariants:

- One row per published file: key, the file's relative name, size, display URL (redacted),
  times and metadata. The index never holds a secret: keys are digests, URLs are shown text.
- ``generations`` holds a per-key write generation. A write bumps it and drops the entry
  in one transaction; a download publishes only inside a transaction that finds the
  generation it started from (:meth:`Index.publish`), so no interleaving lets a download
  begun before a write publish after it.
- Rollback-journal mode (no WAL): every lock is a ``fcntl`` lock on the database file, held
  only inside a statement or transaction, which survives ``fork`` (no shared-memory file
  whose lock bookkeeping a child would inherit) and reads on read-only media. No fork
  happens while a thread of this process is inside the index (:data:`FORK_GUARD`).
- The database file (and its journal) is created 0600 and never through a symlink.
- A corrupt database is moved aside to ``index.db.corrupt`` and started empty, once, with
  a warning naming the path (:meth:`Index.on_reset` lets the cache delete the files it
  held). Read-only, it is ignored instead: every lookup misses.
"""

from __future__ import annotations

import errno
import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar
from urllib.request import pathname2url

from fsspec_shards.storage.cache import layout
from fsspec_shards.storage.cache.notices import warn_once
from fsspec_shards.storage.identity import KEY_FORMAT

T = TypeVar("T")

_SCHEMA = (
    "CREATE TABLE meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE entries (key TEXT PRIMARY KEY, file TEXT NOT NULL, size INTEGER NOT NULL, "
    "shown TEXT NOT NULL, stored_at REAL NOT NULL, accessed_at REAL NOT NULL, "
    "validated_at REAL NOT NULL, metadata TEXT NOT NULL) WITHOUT ROWID",
    "CREATE INDEX entries_by_access ON entries (accessed_at)",
    "CREATE TABLE generations (key TEXT PRIMARY KEY, generation INTEGER NOT NULL)",
    "CREATE TABLE counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL)",
    "CREATE TABLE totals (id INTEGER PRIMARY KEY CHECK (id = 0), files INTEGER, bytes INTEGER)",
    "INSERT INTO totals VALUES (0, 0, 0)",
    "CREATE TRIGGER entries_added AFTER INSERT ON entries "
    "BEGIN UPDATE totals SET files = files + 1, bytes = bytes + NEW.size; END",
    "CREATE TRIGGER entries_removed AFTER DELETE ON entries "
    "BEGIN UPDATE totals SET files = files - 1, bytes = bytes - OLD.size; END",
    "CREATE TRIGGER entries_resized AFTER UPDATE OF size ON entries "
    "BEGIN UPDATE totals SET bytes = bytes - OLD.size + NEW.size; END",
)
_CORRUPT_CODES = frozenset({11, 26})  # SQLITE_CORRUPT, SQLITE_NOTADB
_READONLY_CODES = frozenset({8, 14})  # SQLITE_READONLY, SQLITE_CANTOPEN
_BUSY_TIMEOUT_SECONDS = 120
_REMEMBERED_LOOKUPS = 65536

# SQLite keeps each process's lock state in memory, and a forked child inherits it: a child
# forked while another thread is inside a transaction believes that lock held by itself.
# No fork happens while a thread of this process is inside the index.
FORK_GUARD = threading.RLock()
_ABANDONED: list[sqlite3.Connection] = []  # a parent's connections, never closed in a child


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
    """An index row: file (relative name as stored), size, shown URL, times, metadata."""

    __slots__ = ("key", "file", "size", "shown", "stored_at", "accessed_at", "validated_at")

    def __init__(self, key, file, size, shown, stored_at, accessed_at, validated_at) -> None:
        self.key, self.file, self.size, self.shown = key, file, size, shown
        self.stored_at, self.accessed_at, self.validated_at = stored_at, accessed_at, validated_at


_ROW_COLUMNS = "key, file, size, shown, stored_at, accessed_at, validated_at"
_LOOKUP = "SELECT file, size FROM entries WHERE key = ?"


def _inode(path: str) -> int | None:
    try:
        return os.stat(path).st_ino
    except FileNotFoundError:
        return None


def _is_corrupt(error: BaseException) -> bool:
    code = getattr(error, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in _CORRUPT_CODES
    return type(error) is sqlite3.DatabaseError


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
        self._local = threading.local()
        self._epoch = 0
        self._header: tuple[int, int, int] = (-1, -1, -1)  # pid, epoch, descriptor
        self._remembered: dict[str, tuple[bytes, tuple[str, int] | None]] = {}

    # -- connections -------------------------------------------------------------------

    def _connection(self) -> sqlite3.Connection:
        local = self._local
        inode = _inode(self.path)
        if getattr(local, "pid", None) == os.getpid() and local.epoch == self._epoch:
            if local.inode == inode:
                return local.connection
            self._epoch += 1  # the file was replaced (another process set a corrupt one aside)
        if getattr(local, "pid", None) not in (None, os.getpid()):
            _ABANDONED.append(local.connection)
        elif getattr(local, "connection", None) is not None:
            local.connection.close()
        local.connection = self._connect()
        local.pid, local.epoch, local.inode = os.getpid(), self._epoch, _inode(self.path)
        return local.connection

    def _connect(self) -> sqlite3.Connection:
        if self.writable:
            try:
                flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
                os.close(os.open(self.path, flags, 0o600))
            except FileExistsError:
                pass
            connection = sqlite3.connect(
                self.path,
                timeout=_BUSY_TIMEOUT_SECONDS,
                isolation_level=None,
                check_same_thread=False,
            )
            connection.execute("PRAGMA journal_mode=DELETE")
            connection.execute("PRAGMA synchronous=NORMAL")
            self._create_schema(connection)
            return connection
        url = pathname2url(self.path)
        try:
            connection = sqlite3.connect(
                f"file:{url}?mode=ro", uri=True, timeout=5, check_same_thread=False
            )
            connection.execute("SELECT value FROM meta WHERE name = 'format'").fetchall()
        except sqlite3.OperationalError:  # a hot journal no one can roll back, no such file
            connection = sqlite3.connect(
                f"file:{url}?immutable=1", uri=True, check_same_thread=False
            )
        connection.isolation_level = None
        return connection

    @staticmethod
    def _create_schema(connection: sqlite3.Connection) -> None:
        with FORK_GUARD:
            known = connection.execute("SELECT 1 FROM sqlite_master WHERE name = 'meta'").fetchone()
            if known:
                return
            connection.execute("BEGIN IMMEDIATE")
            try:
                if not connection.execute(
                    "SELECT 1 FROM sqlite_master WHERE name = 'meta'"
                ).fetchone():
                    for statement in _SCHEMA:
                        connection.execute(statement)
                    connection.executemany(
                        "INSERT INTO meta VALUES (?, ?)",
                        [("format", str(layout.FORMAT)), ("key_format", KEY_FORMAT)],
                    )
                connection.execute("COMMIT")
            except BaseException:
                connection.execute("ROLLBACK")
                raise

    # -- running statements ------------------------------------------------------------

    def _run(self, operation: Callable[[sqlite3.Connection], T], default: T) -> T:
        """``operation(connection)``; a corrupt index is replaced once and the operation
        run again; a broken read-only index gives ``default``."""
        for attempt in range(2):
            if self.broken:
                return default
            try:
                connection = self._connection()
                with FORK_GUARD:
                    return operation(connection)
            except sqlite3.DatabaseError as error:
                if _is_read_only(error):
                    if not self.writable:
                        return default  # read-only, and no index to read: an empty cache
                    self.writable = False
                    warn_once(
                        self.directory,
                        "read-only",
                        f"cache {self.directory} is read-only: cached files are served, "
                        "everything else is read without caching",
                    )
                    raise ReadOnlyCacheError(self.directory) from None
                if not _is_corrupt(error) or attempt:
                    raise
            self._replace_corrupt()
        return default

    @contextmanager
    def _transaction(self, connection: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
        if not self.writable:
            raise ReadOnlyCacheError(self.directory)
        connection.execute("BEGIN IMMEDIATE")
        try:
            yield connection
        except BaseException:
            connection.execute("ROLLBACK")
            raise
        connection.execute("COMMIT")

    def _write(self, operation: Callable[[sqlite3.Connection], T], default: T = None) -> T:
        def transact(connection: sqlite3.Connection) -> T:
            with self._transaction(connection):
                return operation(connection)

        return self._run(transact, default)

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
            probe = None
            try:
                probe = self._connect()
                probe.execute("SELECT count(*) FROM entries").fetchone()
                return  # another process replaced it already
            except sqlite3.DatabaseError as error:
                if not _is_corrupt(error):
                    raise
            finally:
                if probe is not None:
                    probe.close()
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
            self._connection()
            self._on_reset()

    # -- reading -----------------------------------------------------------------------

    def lookup(self, key: str) -> tuple[str, int] | None:
        """``(file, size)`` recorded for ``key``, or None: the hit path, kept short.

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
        found = self._query_lookup(key)
        if counter is not None:
            if len(self._remembered) >= _REMEMBERED_LOOKUPS:
                self._remembered.clear()
            self._remembered[key] = (counter, found)
        return found

    def _query_lookup(self, key: str) -> tuple[str, int] | None:
        local = self._local
        if getattr(local, "pid", None) == os.getpid() and local.epoch == self._epoch:
            try:
                with FORK_GUARD:
                    return local.connection.execute(_LOOKUP, (key,)).fetchone()
            except sqlite3.DatabaseError:
                pass  # handled (corrupt, read-only) by the general path below
        return self._run(lambda c: c.execute(_LOOKUP, (key,)).fetchone(), None)

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

    def row(self, key: str) -> Row | None:
        found = self._run(
            lambda c: c.execute(
                f"SELECT {_ROW_COLUMNS} FROM entries WHERE key = ?", (key,)
            ).fetchone(),
            None,
        )
        return None if found is None else Row(*found)

    def metadata(self, key: str) -> tuple[Row, dict] | None:
        found = self._run(
            lambda c: c.execute(
                f"SELECT {_ROW_COLUMNS}, metadata FROM entries WHERE key = ?", (key,)
            ).fetchone(),
            None,
        )
        if found is None:
            return None
        try:
            metadata = json.loads(found[-1])
        except ValueError:
            metadata = {}
        return Row(*found[:-1]), metadata if isinstance(metadata, dict) else {}

    def rows(self) -> list[Row]:
        """Every row, least recently used first."""
        found = self._run(
            lambda c: c.execute(
                f"SELECT {_ROW_COLUMNS} FROM entries ORDER BY accessed_at"
            ).fetchall(),
            [],
        )
        return [Row(*values) for values in found]

    def least_recent(self) -> Row | None:
        found = self._run(
            lambda c: c.execute(
                f"SELECT {_ROW_COLUMNS} FROM entries ORDER BY accessed_at LIMIT 1"
            ).fetchone(),
            None,
        )
        return None if found is None else Row(*found)

    def generation(self, key: str) -> int:
        found = self._run(
            lambda c: c.execute(
                "SELECT generation FROM generations WHERE key = ?", (key,)
            ).fetchone(),
            None,
        )
        return 0 if found is None else found[0]

    def totals(self) -> tuple[int, int]:
        """Files and bytes in the index."""
        found = self._run(
            lambda c: c.execute("SELECT files, bytes FROM totals WHERE id = 0").fetchone(), None
        )
        return (0, 0) if found is None else (found[0], found[1])

    def counters(self) -> dict[str, int]:
        found = self._run(lambda c: c.execute("SELECT name, value FROM counters").fetchall(), [])
        return dict(found)

    def key_format(self) -> str | None:
        found = self._run(
            lambda c: c.execute("SELECT value FROM meta WHERE name = 'key_format'").fetchone(),
            None,
        )
        return None if found is None else found[0]

    # -- writing -----------------------------------------------------------------------

    def publish(
        self, key: str, file: str, size: int, shown: str, metadata: dict, since: int
    ) -> tuple[bool, str | None]:
        """Record ``file`` for ``key`` if the key's generation is still ``since``.

        Returns whether it was recorded and the file of the entry it replaced.
        """

        def insert(connection: sqlite3.Connection) -> tuple[bool, str | None]:
            found = connection.execute(
                "SELECT generation FROM generations WHERE key = ?", (key,)
            ).fetchone()
            if (0 if found is None else found[0]) != since:
                return False, None
            old = connection.execute("SELECT file FROM entries WHERE key = ?", (key,)).fetchone()
            connection.execute("DELETE FROM entries WHERE key = ?", (key,))
            now = time.time()
            connection.execute(
                "INSERT INTO entries VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (key, file, size, shown, now, now, now, json.dumps(metadata, default=str)),
            )
            return True, None if old is None else old[0]

        return self._write(insert, (False, None))

    def drop(self, key: str, *, written: bool) -> str | None:
        """Delete the entry of ``key``; with ``written`` also bump its generation, so no
        download begun before now publishes. Returns the file the entry named."""

        def delete(connection: sqlite3.Connection) -> str | None:
            if written:
                connection.execute(
                    "INSERT INTO generations VALUES (?, 1) "
                    "ON CONFLICT (key) DO UPDATE SET generation = generation + 1",
                    (key,),
                )
            found = connection.execute("SELECT file FROM entries WHERE key = ?", (key,)).fetchone()
            connection.execute("DELETE FROM entries WHERE key = ?", (key,))
            return None if found is None else found[0]

        return self._write(delete)

    def drop_if(self, key: str, file: str) -> bool:
        """Delete the entry of ``key`` only if it still names ``file``."""

        def delete(connection: sqlite3.Connection) -> bool:
            return (
                connection.execute(
                    "DELETE FROM entries WHERE key = ? AND file = ?", (key, file)
                ).rowcount
                > 0
            )

        return self._write(delete, False)

    def record_usage(self, touches: dict[str, float], counts: dict[str, int]) -> None:
        """Apply batched access times (never moving one back) and counter increments."""

        def apply(connection: sqlite3.Connection) -> None:
            connection.executemany(
                "UPDATE entries SET accessed_at = ? WHERE key = ? AND accessed_at < ?",
                [(when, key, when) for key, when in touches.items()],
            )
            connection.executemany(
                "INSERT INTO counters VALUES (?, ?) "
                "ON CONFLICT (name) DO UPDATE SET value = value + excluded.value",
                list(counts.items()),
            )

        self._write(apply)

    def touch_validated(self, key: str) -> None:
        self._write(
            lambda c: c.execute(
                "UPDATE entries SET validated_at = ? WHERE key = ?", (time.time(), key)
            )
        )

    def clear(self) -> list[tuple[str, str]]:
        """Delete every entry and counter; the ``(key, file)`` of the entries deleted.
        Generations stay, so a download in flight still cannot publish over a write."""

        def delete(connection: sqlite3.Connection) -> list[tuple[str, str]]:
            found = connection.execute("SELECT key, file FROM entries").fetchall()
            connection.execute("DELETE FROM entries")
            connection.execute("DELETE FROM counters")
            return found

        return self._write(delete, [])

    def set_key_format(self) -> list[tuple[str, str]]:
        """Drop every entry made under another key format (they could never be hit) and
        record the current one; the ``(key, file)`` of the entries dropped."""

        def reset(connection: sqlite3.Connection) -> list[tuple[str, str]]:
            found = connection.execute(
                "SELECT value FROM meta WHERE name = 'key_format'"
            ).fetchone()
            if found is not None and found[0] == KEY_FORMAT:
                return []
            dropped = connection.execute("SELECT key, file FROM entries").fetchall()
            connection.execute("DELETE FROM entries")
            connection.execute(
                "INSERT INTO meta VALUES ('key_format', ?) "
                "ON CONFLICT (name) DO UPDATE SET value = excluded.value",
                (KEY_FORMAT,),
            )
            return dropped

        return self._write(reset, [])
