"""The names inside a cache directory: which files the cache makes, and where.

Layout (format :data:`FORMAT`)::

    fsspec-shards-cache.json   marker: says the directory is a cache, and its format
    cache.db                   diskcache index: entries, write generations, counters (0600)
    files/ab/<key>.<token>     cached bytes (0400), published by rename, never rewritten
    tmp/<key>.<pid>.<token>.<reserved>.part   downloads in flight and the bytes they reserve
    tmp/<key>.progress         how far a download in flight is verified (block manifests)
    tmp/<key>.progress.<token> the next progress record, before its rename over the last
    index.reserve              space kept for the index on a full disk (:mod:`.space`)
    tmp/evicted.<pid>.<token>  files of a mass eviction still to delete (:mod:`.deletion`)
    locks/<key>.lock           one download per key across processes (0600, kept)
    locks/space.lock           reservation, publication, eviction, clearing
    locks/scan.lock            shared tier: one eviction scan at a time; its mtime is the last

The shared tier (:mod:`.shared`) has the same marker, ``tmp/`` and ``locks/``, no index,
one file per object *version*: ``files/ab/<version>``, ``<version>`` a 64-digit digest,
and ``generations/<key>`` (a token; made when the object is first written through ``wds``).

Invariants:

- ``<key>`` is a 64-digit lowercase hex digest (an ``ObjectId.key``) and ``<token>`` 8 hex
  digits. The cache deletes only files whose names match these patterns, in the
  subdirectory the pattern belongs to: whatever else is there, it did not make.
- Publication is one sequence (:func:`write_new_file` or :func:`finish_file`, then
  :func:`rename_into_place`): the bytes are fsynced in ``tmp/``, renamed to their name, and
  the directory fsynced, so after a crash a file is absent or whole, never partial.
- A data file's name is a function of its directory and key (:func:`data_file_path`
  rebuilds the path from validated parts), so no text read from the index can lead outside
  ``files/``.
"""

from __future__ import annotations

import os
import re
import secrets
import stat
from collections.abc import Callable, Iterator

from diskcache.core import DBNAME

FORMAT = 3
"""Layout format written into the marker. Earlier formats, which :mod:`.trust` adopts:
1, the diskcache layout of the released versions (no marker; ``cache.db`` + ``state/``);
2, a marker and an index of the cache's own SQLite schema (``index.db``)."""

MARKER = "fsspec-shards-cache.json"
INDEX = DBNAME  # diskcache names its database; the index is a diskcache.Cache on the root
FILES, TMP, LOCKS = "files", "tmp", "locks"
SUBDIRECTORIES = (FILES, TMP, LOCKS)
GENERATIONS = "generations"
SPACE_LOCK = "space.lock"
SCAN_LOCK = "scan.lock"
RESERVE = "index.reserve"

_KEY = re.compile(r"[0-9a-f]{64}")
_DATA_NAME = re.compile(r"([0-9a-f]{64})\.[0-9a-f]{8}")
_DATA_FILE = re.compile(r"files/([0-9a-f]{2})/(([0-9a-f]{64})\.[0-9a-f]{8})")
_TEMP_NAME = re.compile(r"([0-9a-f]{64})\.[0-9]+\.[0-9a-f]{8}\.([0-9]+)\.part")
_SHARD_DIRECTORY = re.compile(r"[0-9a-f]{2}")
_PROGRESS_NAME = re.compile(r"([0-9a-f]{64})\.progress(\.[0-9a-f]{8})?")


def index_path(root: str) -> str:
    """The index database of the cache in ``root``."""
    return os.path.join(root, INDEX)


def marker_path(root: str) -> str:
    """The marker file that says ``root`` is a cache."""
    return os.path.join(root, MARKER)


def reserve_path(root: str) -> str:
    """The file holding the index's reserve of disk space (:mod:`.space`)."""
    return os.path.join(root, RESERVE)


def files_directory(root: str) -> str:
    """``files/``: the published data files, in 256 subdirectories."""
    return os.path.join(root, FILES)


def shard_directory_path(root: str, shard: str) -> str:
    """``files/<shard>``: the subdirectory of the keys starting with ``shard``."""
    return os.path.join(root, FILES, shard)


def temp_directory(root: str) -> str:
    """``tmp/``: downloads in flight, progress records, eviction lists."""
    return os.path.join(root, TMP)


def temp_path(root: str, name: str) -> str:
    """The file ``name`` in ``tmp/``."""
    return os.path.join(root, TMP, name)


def lock_path(root: str, name: str) -> str:
    """The lock file ``name`` in ``locks/``."""
    return os.path.join(root, LOCKS, name)


def key_lock_path(root: str, key: str) -> str:
    """The lock held by the one download of ``key`` across processes."""
    return lock_path(root, key_lock_name(key))


def space_lock_path(root: str) -> str:
    """The lock of reservation, publication, eviction and clearing."""
    return lock_path(root, SPACE_LOCK)


def scan_lock_path(root: str) -> str:
    """The shared tier's eviction scan lock (its mtime: the last scan)."""
    return lock_path(root, SCAN_LOCK)


def data_files(root: str) -> Iterator[tuple[str, str]]:
    """``(relative, path)`` of every data file the cache made in ``files/`` (names it
    makes, in real subdirectories); ``relative`` as the index records it."""
    for shard in list_directory(files_directory(root)):
        if is_shard_directory(shard):
            directory = shard_directory_path(root, shard)
            for name in list_directory(directory):
                if is_data_name(name, shard):
                    yield f"{FILES}/{shard}/{name}", os.path.join(directory, name)


def check_key(key: str) -> str:
    """``key`` if it is a cache key (64 lowercase hex digits), else ValueError."""
    if not isinstance(key, str) or not _KEY.fullmatch(key):
        raise ValueError(f"not a cache key: {key!r}")
    return key


def new_data_file(key: str) -> str:
    """A fresh relative name for the data file of ``key``: ``files/ab/<key>.<token>``."""
    return f"{FILES}/{key[:2]}/{key}.{secrets.token_hex(4)}"


def data_file_path(root: str, key: str, recorded: str) -> str | None:
    """The absolute path of ``recorded`` (an index row's file) if it is a name this cache
    makes for ``key``; None for anything else (another key's file, ``..``, absolute paths)."""
    match = _DATA_FILE.fullmatch(recorded) if isinstance(recorded, str) else None
    if match is None or match.group(3) != key or match.group(1) != key[:2]:
        return None
    return os.path.join(shard_directory_path(root, match.group(1)), match.group(2))


def is_data_name(name: str, shard_directory: str) -> bool:
    """Whether ``files/<shard_directory>/<name>`` is a name this cache makes."""
    match = _DATA_NAME.fullmatch(name)
    return match is not None and match.group(1)[:2] == shard_directory


def shared_data_path(root: str, version: str) -> str:
    """The shared tier's file of ``version`` (a checked 64-digit digest)."""
    check_key(version)
    return os.path.join(shard_directory_path(root, version[:2]), version)


def is_shared_data_name(name: str, shard_directory: str) -> bool:
    """Whether ``files/<shard_directory>/<name>`` is a name the shared tier makes."""
    return _KEY.fullmatch(name) is not None and name[:2] == shard_directory


def shared_generation_path(root: str, key: str) -> str:
    """The shared tier's generation file of ``key`` (a checked cache key)."""
    return os.path.join(root, GENERATIONS, check_key(key))


def is_shard_directory(name: str) -> bool:
    """Whether ``files/<name>`` is one of the cache's 256 data subdirectories."""
    return _SHARD_DIRECTORY.fullmatch(name) is not None


def new_temp_name(key: str, reserved: int) -> str:
    """A temp file name recording its key, owner pid and the bytes it reserves."""
    return f"{key}.{os.getpid()}.{secrets.token_hex(4)}.{reserved}.part"


def parse_temp_name(name: str) -> tuple[str, int] | None:
    """``(key, reserved bytes)`` of a temp file name this cache makes, else None."""
    match = _TEMP_NAME.fullmatch(name)
    return None if match is None else (match.group(1), int(match.group(2)))


def progress_name(key: str) -> str:
    """The progress record of a download of ``key`` in flight (:mod:`.following`)."""
    return f"{check_key(key)}.progress"


def new_progress_name(key: str) -> str:
    """A fresh name for the next progress record of ``key``, renamed over the last."""
    return f"{progress_name(key)}.{secrets.token_hex(4)}"


def parse_progress_name(name: str) -> str | None:
    """The key of a progress record name (current or next) this cache makes, else None."""
    match = _PROGRESS_NAME.fullmatch(name)
    return None if match is None else match.group(1)


def key_lock_name(key: str) -> str:
    return f"{key}.lock"


def remove_file(path: str) -> bool:
    """Unlink ``path`` if it is a regular file or a symlink (never what a link points to,
    never a directory); whether it was removed."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return False
    if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
        return False
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True


def is_real_directory(path: str) -> bool:
    """A directory, not a symlink to one."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


def list_directory(path: str) -> list[str]:
    """Names in ``path`` if it is a real directory, else none."""
    try:
        return os.listdir(path) if is_real_directory(path) else []
    except FileNotFoundError:
        return []


def remove_empty_directory(path: str) -> None:
    try:
        os.rmdir(path)
    except OSError:
        pass


def finish_file(descriptor: int, *, read_only: bool, durable: bool = True) -> None:
    """Make the bytes written to ``descriptor`` durable (fsync; left to the caller when not
    ``durable``), then 0400 when ``read_only``: a temp file ready for
    :func:`rename_into_place`."""
    if durable:
        os.fsync(descriptor)
    if read_only:
        os.fchmod(descriptor, 0o400)


def write_new_file(path: str, write: Callable[[int], object], *, read_only: bool) -> None:
    """Create ``path`` (it must not exist; never through a symlink), 0600, let ``write``
    fill its descriptor, then :func:`finish_file` it."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    descriptor = os.open(path, flags, 0o600)
    try:
        write(descriptor)
        finish_file(descriptor, read_only=read_only)
    finally:
        os.close(descriptor)


def rename_into_place(temp: str, final: str, *, durable: bool = True) -> None:
    """Rename the finished ``temp`` to ``final`` and fsync ``final``'s directory, so the
    rename survives a power loss once this returns (left to the caller when not
    ``durable``)."""
    os.rename(temp, final)
    if durable:
        fsync_directory(os.path.dirname(final))


def fsync_directory(directory: str) -> None:
    """Make the renames into ``directory`` durable across power loss."""
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
