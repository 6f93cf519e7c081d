"""The files a cache made in its directory: finding them and removing them, and nothing else.

Invariants:

- Only names :mod:`.layout` makes are removed, each in the subdirectory its pattern belongs
  to; a file named otherwise is reported (:func:`foreign_names`), never deleted.
- An entry's file is served or deleted only inside ``files/<ab>`` that is a real directory
  owned by the user and writable by no one else (:meth:`OwnFiles.shard_is_safe`).
- A temp file is removed only when no download holds its key's lock (stale), or with that
  lock held by the caller (leftovers of a killed process).
"""

from __future__ import annotations

import logging
import os
import stat

from fsspec_shards.storage.cache import deletion, layout, locks
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
