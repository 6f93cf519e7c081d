"""Files of a mass eviction deleted off the readers' path, by a thread of the process.

An eviction pass of many entries drops their rows from the index first (a few
transactions), then writes the names of their files to an eviction list,
``tmp/evicted.<pid>.<token>``, which a background thread works through: it holds the
list's lock (``locks/evicted.<pid>.<token>.lock``) while it deletes the files (from several
threads: an unlink waits on the filesystem's journal more than on the CPU), then removes
the list. The readers waiting for room go on
as soon as the index is under the limit; until the list is done the bytes on disk may
exceed the limit by the files still on it (never more than before the pass began).

A process that exits or is killed first leaves its list behind; the next cache opened on
the directory (:func:`recover`) takes over every list whose lock is free. Only names the
cache makes for data files are deleted (:func:`~.layout.data_file_path`).
"""

from __future__ import annotations

import logging
import os
import re
import secrets
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor

from fsspec_shards.storage.cache import layout, locks
from fsspec_shards.storage.core.worker_thread import WorkerThread

logger = logging.getLogger("fsspec_shards.storage.cache")

DELETING_THREADS = 4
_LIST_NAME = re.compile(r"evicted\.[0-9]+\.[0-9a-f]{8}")
_DATA_FILE = re.compile(r"files/[0-9a-f]{2}/([0-9a-f]{64})\.[0-9a-f]{8}")


def is_list_name(name: str) -> bool:
    return _LIST_NAME.fullmatch(name) is not None


def write_list(directory: str, files: Iterable[str]) -> str:
    """An eviction list of ``files`` (relative names as the index recorded them)."""
    path = layout.temp_path(directory, f"evicted.{os.getpid()}.{secrets.token_hex(4)}")
    text = "\n".join(files).encode()
    layout.write_new_file(path, lambda descriptor: os.write(descriptor, text), read_only=False)
    return path


def delete_listed(directory: str, path: str) -> None:
    """Delete the files an eviction list names, then the list, holding its lock (a list
    another process is working through is left to it)."""
    lock = _lock_path(directory, path)
    with locks.hold_if_free(lock) as free:
        if not free or not os.path.lexists(path):
            return
        try:
            with open(path, "rb") as file:
                names = file.read().decode(errors="replace").split("\n")
        except OSError:
            return
        paths = []
        for name in names:
            match = _DATA_FILE.fullmatch(name)
            found = match and layout.data_file_path(directory, match.group(1), name)
            if found:
                paths.append(found)
        with ThreadPoolExecutor(DELETING_THREADS, thread_name_prefix="fsspec-shards-evict") as pool:
            for _ in pool.map(layout.remove_file, paths):
                pass
        layout.remove_file(path)
    layout.remove_file(lock)


def _lock_path(directory: str, path: str) -> str:
    return layout.lock_path(directory, os.path.basename(path) + ".lock")


def _delete_list(directory: str, path: str) -> None:
    try:
        delete_listed(directory, path)
    except Exception as error:  # the list stays: the next process takes it over
        logger.warning("cannot delete the files of eviction list %s: %s", path, error)


class Deleter(WorkerThread):
    """The thread of this process that works through eviction lists
    (``submit(directory, list_path)``)."""

    def __init__(self) -> None:
        super().__init__("fsspec-shards-deleter", _delete_list)


DELETER = Deleter()


def recover(directory: str) -> None:
    """Take over the eviction lists other processes left in ``directory`` (those being
    worked through are skipped by their lock)."""
    temp = layout.temp_directory(directory)
    for name in layout.list_directory(temp):
        if is_list_name(name):
            DELETER.submit(directory, os.path.join(temp, name))
