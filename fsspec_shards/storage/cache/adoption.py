"""Adopting a cache directory that an earlier layout format made.

- Format 1, the diskcache layout of the released versions (no marker; ``cache.db``,
  ``state/counters/``, ``state/validated/``, ``files/``, ``tmp/``, ``locks/`` and nothing
  else): its keys were made from URLs alone, under an earlier key format, so none of its
  entries could ever be hit. Its cached files, temp files and databases are deleted; its
  lock files stay.
- Format 2, a marker and the cache's own SQLite index (``index.db``): the entries it made
  under the current key format are taken over into the diskcache index (least recently
  used first, so their order stays), with their write generations and the counters. An
  entry is taken over only if its file is the name the cache makes for its key, in a real
  private ``files/<ab>/``, and is a regular file of the user of the recorded size. Every
  other file it cached is deleted, and ``index.db`` with it.

Only names the cache makes are deleted. Adoption runs under the directory's lock, with the
marker saying ``"adopting": <format>`` until it is done (:mod:`.trust`): a process killed
midway leaves the next one to finish it, and every step can run again.
"""

from __future__ import annotations

import json
import os
import sqlite3
import stat
from urllib.request import pathname2url

from fsspec_shards.storage.backends import KEY_FORMAT
from fsspec_shards.storage.cache import layout, locks
from fsspec_shards.storage.cache.index import Index

MARKED_FORMATS = (2,)
"""Earlier formats whose directories carry a marker."""

_FORMAT_1_NAMES = frozenset(
    {"cache.db", "cache.db-wal", "cache.db-shm", "files", "tmp", "locks", "state"}
)
_FORMAT_1_STATE = ("counters", "validated")
_FORMAT_2_INDEX = "index.db"
_SQLITE_SUFFIXES = ("", "-wal", "-shm", "-journal")


def is_format_1(path: str, names: list[str]) -> bool:
    """Whether ``path`` (holding ``names``) is a format-1 cache of the user, and nothing else."""
    if "cache.db" not in names or not set(names) <= _FORMAT_1_NAMES:
        return False
    database = os.path.join(path, "cache.db")
    info = os.lstat(database)
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
        return False
    try:
        connection = sqlite3.connect(f"file:{pathname2url(database)}?mode=ro", uri=True)
        try:
            tables = {row[0] for row in connection.execute("SELECT name FROM sqlite_master")}
        finally:
            connection.close()
    except sqlite3.DatabaseError:
        return False
    return {"Cache", "Settings"} <= tables


def adopt(path: str, earlier: int) -> None:
    """Make the cache in ``path``, of layout format ``earlier``, one of the current format
    (its subdirectories exist; the caller holds the directory's lock)."""
    if earlier == 1:
        _remove_format_1(path)
    else:
        _take_over_format_2(path)


def _remove_format_1(path: str) -> None:
    _remove_data_files(path, keep=set())
    _remove_temp_files(path)
    state = os.path.join(path, "state")
    if layout.is_real_directory(state):
        for name in _FORMAT_1_STATE:
            for suffix in _SQLITE_SUFFIXES:
                layout.remove_file(os.path.join(state, name, "cache.db" + suffix))
            layout.remove_empty_directory(os.path.join(state, name))
        layout.remove_empty_directory(state)
    for suffix in _SQLITE_SUFFIXES:
        layout.remove_file(os.path.join(path, "cache.db" + suffix))


def _take_over_format_2(path: str) -> None:
    entries, generations, counters = _read_format_2_index(os.path.join(path, _FORMAT_2_INDEX))
    space_lock = layout.space_lock_path(path)
    index = Index(path, True, space_lock=lambda: locks.hold(space_lock), on_reset=lambda: None)
    index.adopt(
        [(key, record) for key, record in entries if _checks_out(path, key, record)],
        generations,
        counters,
    )
    _remove_data_files(path, keep={row.file for row in index.rows()})
    _remove_temp_files(path)
    for suffix in _SQLITE_SUFFIXES:
        for name in (_FORMAT_2_INDEX, _FORMAT_2_INDEX + ".corrupt"):
            layout.remove_file(os.path.join(path, name + suffix))


def _read_format_2_index(database: str) -> tuple[list[tuple[str, dict]], dict, dict]:
    """Entries ``(key, record)`` (least recently used first) and generations made under the
    current key format, and counters; nothing from a file that cannot be read."""
    if not os.path.lexists(database) or not stat.S_ISREG(os.lstat(database).st_mode):
        return [], {}, {}
    try:
        connection = sqlite3.connect(f"file:{pathname2url(database)}?mode=ro", uri=True)
        try:
            meta = dict(connection.execute("SELECT name, value FROM meta"))
            counters = dict(connection.execute("SELECT name, value FROM counters"))
            if meta.get("key_format") != KEY_FORMAT:
                return [], {}, counters
            generations = dict(connection.execute("SELECT key, generation FROM generations"))
            rows = connection.execute(
                "SELECT key, file, size, shown, stored_at, validated_at, metadata "
                "FROM entries ORDER BY accessed_at"
            ).fetchall()
        finally:
            connection.close()
    except sqlite3.Error:
        return [], {}, {}
    entries = []
    for key, file, size, shown, stored_at, validated_at, metadata in rows:
        try:
            metadata = json.loads(metadata)
        except (TypeError, ValueError):
            metadata = {}
        record = {"file": file, "size": size, "shown": shown, "stored_at": stored_at}
        record.update(validated_at=validated_at, metadata=metadata)
        entries.append((key, record))
    return entries, generations, counters


def _checks_out(path: str, key: str, record: dict) -> bool:
    """Whether ``record``'s file is the cache's own, whole file for ``key``."""
    data = layout.data_file_path(path, key, record["file"])
    if data is None or type(record["size"]) is not int:
        return False
    try:
        shard, info = os.lstat(os.path.dirname(data)), os.lstat(data)
    except FileNotFoundError:
        return False
    private = stat.S_ISDIR(shard.st_mode) and not shard.st_mode & 0o022
    return (
        private
        and shard.st_uid == os.geteuid()
        and stat.S_ISREG(info.st_mode)
        and info.st_uid == os.geteuid()
        and info.st_size == record["size"]
    )


def _remove_data_files(path: str, keep: set) -> None:
    """Delete the cached files (names the cache makes) not named in ``keep``."""
    for relative, file in list(layout.data_files(path)):
        if relative not in keep:
            layout.remove_file(file)


def _remove_temp_files(path: str) -> None:
    for name in layout.list_directory(layout.temp_directory(path)):
        if layout.parse_temp_name(name) is not None:
            layout.remove_file(layout.temp_path(path, name))
