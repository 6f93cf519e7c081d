"""Durability off the critical path: cached files are made durable in the background, and
after a reboot a file that was not yet durable is verified again before its first use.

A process killed at any instant loses nothing the kernel has: the page cache outlives the
process, so a published file is whole for every later reader on the same boot. Only a
machine crash (power loss, kernel panic) can lose or tear what was not yet on disk. So the
cache publishes a file once it is written and verified, and :data:`SYNCER` (one thread per
process) then fsyncs it and its directory, creating nothing (a file or directory gone by
then is skipped), and tells the cache, which notes it durable in memory: the index records
it with the process's next write (``index.Index.note_durable``), so no write into the
cache directory happens after the call that filled it returned. An entry not recorded
durable carries the boot it was published under (:func:`boot_id`); under another boot it
is verified again against the checksum its download verified (dropped where none is
known) before it is served, then made durable.

Where the system has no boot id (not Linux), a file is fsynced before it is published, as
the rule needs one to tell a reboot.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

from fsspec_shards.checksums import StreamingHasher, parse_checksum
from fsspec_shards.storage.core.worker_thread import WorkerThread
from fsspec_shards.units import MiB

logger = logging.getLogger("fsspec_shards.storage.cache")

BOOT_ID_ENV = "FSSPEC_SHARDS_BOOT_ID"
"""Overrides the boot id (tests: a reboot without one)."""
_BOOT_ID_FILE = "/proc/sys/kernel/random/boot_id"
_READ_BACK = 8 * MiB
_boot_from_file: list[str | None] = []


def boot_id() -> str | None:
    """This boot's id (``$FSSPEC_SHARDS_BOOT_ID``, else the kernel's), or None if unknown."""
    injected = os.environ.get(BOOT_ID_ENV)
    if injected:
        return injected
    if not _boot_from_file:
        try:
            with open(_BOOT_ID_FILE) as file:
                _boot_from_file.append(file.read().strip() or None)
        except OSError:
            _boot_from_file.append(None)
    return _boot_from_file[0]


def fsync_file_and_directory(path: str) -> None:
    """Make the file at ``path`` and its name durable."""
    descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
    directory = os.open(os.path.dirname(path), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def matches(descriptor: int, size: int, checksum: str) -> bool:
    """Whether the first ``size`` bytes of the open file hash to ``checksum`` (``algo:hex``)."""
    expected = parse_checksum(checksum)
    hasher = StreamingHasher(expected.algorithm)
    position = 0
    while position < size:
        data = os.pread(descriptor, min(_READ_BACK, size - position), position)
        if not data:
            return False
        hasher.update(data)
        position += len(data)
    return hasher.checksum() == expected


def _make_durable(path: str, on_durable: Callable[[], None]) -> None:
    try:
        fsync_file_and_directory(path)
        on_durable()
    except FileNotFoundError:
        pass  # evicted or replaced before it was synced: nothing left to make durable
    except Exception as error:  # the entry stays not durable: verified after a reboot
        logger.warning("cannot make %s durable: %s", path, error)


class Syncer(WorkerThread):
    """Makes queued files durable on a thread of its own (``submit(path, on_durable)``),
    then calls each one's ``on_durable`` (which must not write into the cache directory);
    a file that cannot be synced stays not durable (logged)."""

    def __init__(self) -> None:
        super().__init__("fsspec-shards-sync", _make_durable)


SYNCER = Syncer()
