"""Out of space, in one place: how a full disk is recognised, the reserve the index can
always use, and the error that surfaces when no room can be made.

A full disk (``ENOSPC``/``EDQUOT``, SQLite's ``SQLITE_FULL``) is an expected state of a
cache, not an error path. Every index write and every fill of :class:`~.store.ShardCache`
goes through :meth:`~.room.Room.with_room`: on a full disk it releases the
reserve (:data:`RESERVE_BYTES` next to the index, kept so that the index transaction dropping
entries has journal space), evicts least-recently-used entries until enough is free,
makes the reserve again where it fits, and retries once; a fill that still finds the
disk full is streamed uncached (``CacheFullError``, an ``OSError`` with ``errno.ENOSPC``
naming the cache directory). Nothing partial is published: the fill's temp file is
removed before the retry.
"""

from __future__ import annotations

import errno
import os
import sqlite3

from fsspec_shards import exception_chain
from fsspec_shards.storage.cache import layout
from fsspec_shards.units import MiB

RESERVE_BYTES = MiB
"""Bytes kept free for the index (:data:`~.layout.RESERVE`, next to it): an eviction's
journal on a full disk (a batch of :data:`EMERGENCY_BATCH` entries needs far less)."""

EMERGENCY_BATCH = 64
"""Entries an eviction on a full disk drops per index transaction (small: its journal
must fit in the reserve)."""

_SQLITE_FULL = 13
_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


class DiskFullError(OSError):
    """The disk holding the cache directory is full (``errno.ENOSPC``, naming it)."""

    def __init__(self, directory: str, detail: str = "no space left on device") -> None:
        super().__init__(errno.ENOSPC, f"cache {directory}: {detail}")
        self.filename = directory

    def __str__(self) -> str:
        return self.args[1]

    def __reduce__(self):
        return (type(self), (self.filename, self.args[1].split(": ", 1)[-1]))


def is_disk_full(error: BaseException) -> bool:
    """Whether ``error`` or any exception it was raised from means the disk is full (also
    SQLite's "cannot rollback" that hides the ``SQLITE_FULL`` before it)."""
    for link in exception_chain.links(error, follow_suppressed=True):
        if isinstance(link, OSError) and link.errno in _FULL_ERRNOS:
            return True
        if isinstance(link, sqlite3.Error):
            code = getattr(link, "sqlite_errorcode", None)
            if (code is not None and code & 0xFF == _SQLITE_FULL) or "is full" in str(link):
                return True
    return False


def free_bytes(directory: str) -> int:
    """Bytes an unprivileged process can still write on the disk of ``directory``."""
    usage = os.statvfs(directory)
    return usage.f_bavail * usage.f_frsize


def make_reserve(directory: str, spare: int = RESERVE_BYTES) -> bool:
    """Make the reserve of ``directory`` if it is missing and fits with ``spare`` bytes
    still free after it; whether it is there now."""
    path = layout.reserve_path(directory)
    if os.path.lexists(path):
        return True
    try:
        if free_bytes(directory) < RESERVE_BYTES + spare:
            return False
        temp = f"{path}.{os.getpid()}"
        layout.write_new_file(
            temp, lambda descriptor: _allocate(descriptor, RESERVE_BYTES), read_only=False
        )
        os.rename(temp, path)
    except OSError as error:
        layout.remove_file(f"{path}.{os.getpid()}")
        if not is_disk_full(error):
            raise
        return False
    return True


def release_reserve(directory: str) -> bool:
    """Delete the reserve (the disk is full: the index may use its space); whether there
    was one. Called with the space lock held."""
    return layout.remove_file(layout.reserve_path(directory))


def _allocate(descriptor: int, size: int) -> None:
    try:
        os.posix_fallocate(descriptor, 0, size)
    except OSError as error:
        if error.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise
        os.write(descriptor, b"\0" * size)
