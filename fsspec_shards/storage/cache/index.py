"""The index of a cache directory, kept by diskcache: entries, write generations, counters.

The rows and their format, the database, its connections and its recovery are
:mod:`.index_database`'s.

Invariants:

- One entry per published file.
- A write bumps the key's generation and drops its entry in one transaction
  (``Cache.transact``); a download publishes only inside a transaction that finds the
  generation it started from (:meth:`Index.publish`), so no interleaving lets a download
  begun before a write publish after it.
- Least-recently-used order is diskcache's store time (``eviction_policy=
  "least-recently-stored"``): a use of an entry re-stores it (batched per process by
  :mod:`.room`), so a lookup is a plain read, never a write transaction, and an entry's
  place only moves forward.
- A lookup's answer is remembered only with the database's file change counter it was read
  under (:meth:`Index.lookup`): any commit, in any process, makes it read again.
- Nothing writes the index on a thread of its own after a call returned (a caller that
  removes the directory then never races a journal file being created in it): what the
  background syncer learns (a file is durable) waits in memory for the process's next write
  (:meth:`Index.note_durable`), batched uses for a later use (:class:`.room.Usage`).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import diskcache

from fsspec_shards.storage.backends import KEY_FORMAT
from fsspec_shards.storage.cache.index_database import (
    COUNTER,
    ENTRY,
    GENERATION,
    KEY_FORMAT_NAME,
    PENDING,
    SIZE_LIMIT,
    Database,
    Entry,
    Row,
    Table,
    file_and_size,
    integer,
    pending_boot,
    read_record,
)
from fsspec_shards.storage.deps.diskcache import delete_raw_keys

_REMEMBERED_LOOKUPS = 65536
T = TypeVar("T")


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
        self.database = Database(directory, writable, space_lock, on_reset)
        self._header: tuple[int, int, int] = (-1, -1, -1)  # pid, epoch, descriptor
        self._remembered: dict[str, tuple[bytes, tuple[str, int] | None]] = {}
        self._synced: dict[tuple[str, str], None] = {}
        """(key, file) of entries synced in the background and not recorded durable yet
        (:meth:`note_durable`); changed only by single dict operations: no lock to hold
        across a fork."""

    @property
    def path(self) -> str:
        """The index's database file."""
        return self.database.path

    @property
    def writable(self) -> bool:
        """Whether it can be written (False once it turned out read-only)."""
        return self.database.writable

    # -- reading -------------------------------------------------------------------------

    def lookup(self, key: str) -> tuple[str, int, str | None] | None:
        """``(file, size, boot)`` recorded for ``key`` (``boot``: the boot it was published
        under when not durable yet, nor noted durable here, else None), or None: the hit
        path, kept short.

        Answers are remembered with the database's file change counter (header bytes
        24-27, which every committed write moves, in any process) read *before* the query;
        a remembered answer is used only while the counter still reads the same, so a
        hit costs one ``pread`` instead of a query.
        """
        counter = self._change_counter()
        if counter is not None:
            remembered = self._remembered.get(key)
            if remembered is not None and remembered[0] == counter:
                found = remembered[1]
                return self._durable_if_synced(key, found) if self._synced else found
        found = self.database.run(
            lambda: file_and_size(
                self.database.value(ENTRY + key), self.database.value(PENDING + key)
            ),
            None,
        )
        if counter is not None:
            if len(self._remembered) >= _REMEMBERED_LOOKUPS:
                self._remembered.clear()
            self._remembered[key] = (counter, found)
        return self._durable_if_synced(key, found) if self._synced else found

    def _durable_if_synced(
        self, key: str, found: tuple[str, int, str | None] | None
    ) -> tuple[str, int, str | None] | None:
        """``found`` as durable where this process synced its file (not recorded yet)."""
        if found is None or found[2] is None or (key, found[0]) not in self._synced:
            return found
        return found[0], found[1], None

    def _change_counter(self) -> bytes | None:
        """The database's file change counter, through a descriptor kept per process and
        per index file (None when it cannot be read: then every lookup queries)."""
        pid, epoch, descriptor = self._header
        if pid != os.getpid() or epoch != self.database.epoch:
            try:
                descriptor = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError:
                return None
            # The previous descriptor stays open: another thread may be reading through it.
            self._header = (os.getpid(), self.database.epoch, descriptor)
            self._remembered = {}
        try:
            counter = os.pread(descriptor, 4, 24)
        except OSError:
            return None
        return counter if len(counter) == 4 else None

    def metadata(self, key: str) -> tuple[Row, dict] | None:
        """The entry of ``key`` and the metadata its download returned."""
        record = self.database.run(lambda: read_record(self.database.value(ENTRY + key)), None)
        if record is None:
            return None
        metadata = record.get("metadata")
        row = Row(key, record, record["size"], record.get("stored_at", 0.0))
        return row, metadata if isinstance(metadata, dict) else {}

    def rows(self, limit: int = -1) -> list[Row]:
        """Entries, least recently used first."""
        found = self.database.run(lambda: Table.rows(self.database.connection(), ENTRY, limit), [])
        return [
            Row(name[len(ENTRY) :], read_record(value), size, stored)
            for name, value, size, stored in found
        ]

    def least_recent(self) -> Row | None:
        found = self.rows(limit=1)
        return found[0] if found else None

    def generation(self, key: str) -> int:
        return self.database.run(lambda: integer(self.database.value(GENERATION + key)), 0)

    def totals(self) -> tuple[int, int]:
        """Files and bytes in the index."""

        def count() -> tuple[int, int]:
            connection = self.database.connection()
            return Table.count(connection, ENTRY), Table.total_size(connection)

        return self.database.run(count, (0, 0))

    def cached_bytes(self) -> int:
        """Bytes of the files in the index (diskcache's maintained total: no scan)."""
        return self.database.run(lambda: Table.total_size(self.database.connection()), 0)

    def counters(self) -> dict[str, int]:
        found = self.database.run(lambda: Table.rows(self.database.connection(), COUNTER), [])
        return {name[len(COUNTER) :]: integer(value) for name, value, _, _ in found}

    def key_format(self) -> str | None:
        return self.database.run(lambda: self.database.value(KEY_FORMAT_NAME), None)

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
            if integer(store.get(GENERATION + key)) != since:
                return False, None
            old = read_record(store.get(ENTRY + key))
            now = time.time()
            record = {"file": file, "size": size, "shown": shown, "metadata": metadata}
            if boot is not None:
                store.set(PENDING + key, json.dumps({"file": file, "boot": boot}))
            else:
                store.delete(PENDING + key)
            store.set(ENTRY + key, Entry({**record, "stored_at": now, "validated_at": now}))
            return True, None if old is None else old["file"]

        return self._write(insert, (False, None))

    def drop(self, key: str, *, written: bool) -> str | None:
        """Delete the entry of ``key``; with ``written`` also bump its generation, so no
        download begun before now publishes. Returns the file the entry named."""

        def delete(store: diskcache.Cache) -> str | None:
            if written:
                store.incr(GENERATION + key)
            old = read_record(store.get(ENTRY + key))
            store.delete(ENTRY + key)
            store.delete(PENDING + key)
            return None if old is None else old["file"]

        return self._write(delete)

    def drop_if(self, key: str, file: str | None) -> bool:
        """Delete the entry of ``key`` only if it still names ``file`` (None: a row the
        index did not write)."""

        def delete(store: diskcache.Cache) -> bool:
            value = store.get(ENTRY + key)
            record = read_record(value)
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
            found = Table.rows(self.database.connection(), ENTRY, limit)
            dropped, names, freed = [], [], 0
            for name, value, size, stored in found:
                if covering is not None and freed >= covering:
                    break
                key = name[len(ENTRY) :]
                names += (name, PENDING + key)
                dropped.append(Row(key, read_record(value), size, stored))
                freed += size
            delete_raw_keys(store, names)  # one statement per 250 entries, not 3 each
            return dropped

        return self._write(delete, [])

    def size_limit(self) -> int | None:
        """The size limit recorded by the last writable use (None: never recorded)."""
        found = self.database.run(lambda: self.database.value(SIZE_LIMIT), None)
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
                record = read_record(store.get(ENTRY + key))
                if record is not None:
                    store.set(ENTRY + key, Entry(record))
            for name, amount in counts.items():
                store.incr(COUNTER + name, amount)

        self._write(apply)

    def mark_durable(self, key: str, file: str) -> None:
        """The entry of ``key`` is on disk, if it still names ``file``: recorded now."""
        self._write(lambda store: _record_durable(store, key, file))

    def note_durable(self, key: str, file: str) -> None:
        """The entry of ``key`` is on disk, if it still names ``file``: noted in memory
        only (the background syncer calls this after a read returned, when a write could
        race whoever removes the directory). Recorded by this process's next write to the
        index (:meth:`_write`); until then its lookups answer it durable. Never recorded
        (the process ended first), it stays published under this boot: verified again
        after a reboot, a cost and never a wrong byte."""
        self._synced[(key, file)] = None

    def durable_unrecorded(self) -> bool:
        """Whether files noted durable wait for the next write (:meth:`note_durable`)."""
        return bool(self._synced)

    def _write(self, operation: Callable[[diskcache.Cache], T], default: T = None) -> T:
        """``operation(cache)`` inside one write transaction, which first records durable
        the files noted durable so far (:meth:`note_durable`)."""
        synced = list(self._synced.copy())

        def transact(store: diskcache.Cache) -> T:
            for key, file in synced:
                _record_durable(store, key, file)
            return operation(store)

        result = self.database.write(transact, default)
        for noted in synced:
            self._synced.pop(noted, None)
        return result

    def touch_validated(self, key: str) -> None:
        def update(store: diskcache.Cache) -> None:
            record = read_record(store.get(ENTRY + key))
            if record is not None:
                store.set(ENTRY + key, Entry({**record, "validated_at": time.time()}))

        self._write(update)

    def clear(self) -> list[tuple[str, str | None]]:
        """Delete every entry and counter; the ``(key, file)`` of the entries deleted.
        Generations stay, so a download in flight still cannot publish over a write."""

        def delete(store: diskcache.Cache) -> list[tuple[str, str | None]]:
            dropped = self._drop_entries(store)
            for name, _, _, _ in Table.rows(self.database.connection(), COUNTER):
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
        for name, value, _, _ in Table.rows(self.database.connection(), ENTRY):
            store.delete(name)
            record = read_record(value)
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
                    current = integer(store.get(names + name))
                    store.set(names + name, max(integer(value), current))
            for key, record in entries:
                store.set(ENTRY + key, Entry(record))
            store.set(KEY_FORMAT_NAME, KEY_FORMAT)

        self._write(insert)


def _record_durable(store: diskcache.Cache, key: str, file: str) -> None:
    """Inside a transaction: the entry of ``key`` is on disk, if it still names ``file``."""
    if pending_boot(store.get(PENDING + key), file) is not None:
        store.delete(PENDING + key)  # (the entry's row, its LRU place, untouched)
