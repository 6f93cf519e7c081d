"""Which directories the cache trusts, and how it makes one its own.

Invariants (as ssh's StrictModes):

- A new cache directory is created 0700 and gets its marker file (:data:`~.layout.MARKER`,
  with the layout format) first, atomically (written under a temporary name, renamed):
  a marked directory is a cache (missing subdirectories are made at its next use), an
  unmarked one is not. A directory an earlier version left half-made (only our empty,
  private subdirectories, no marker: it met a full disk) is adopted as empty.
- A disk too full to set a directory up is not an error: the cache is unusable for now
  (``Prepared.full``; reads stream) and is set up at a later use.
- An existing directory is used only if it is empty or carries the marker, is owned by the
  current user, and is not writable by group or others; the same holds for the marker,
  the subdirectories and the index file, none of which may be a symlink. Anything else is
  a :class:`CacheDirectoryError` naming the path, the reason and a fix that keeps it safe
  (a directory of one's own; never loosening or tightening a directory others use).
- A sticky directory everyone may write to (``/tmp``, ``/dev/shm``) is never the cache
  itself: the cache lives in ``fsspec-shards-<uid>`` inside it, made 0700 and marked, and
  held to the rules above (another user's, or a symlink, is refused).
- A directory of an earlier layout format (format 1: no marker, the released versions'
  diskcache layout and nothing else; format 2: a marker of format 2) is adopted
  (:func:`adopt`, below) under the directory's lock, the marker saying ``"adopting"`` until it
  is done, so a process killed midway leaves the next one to finish the job. Nothing it
  cached is served unless it was made under the current key format and checks out.
- Inspection (``create=False``) writes nothing, anywhere; a directory that is not a cache
  is a :class:`NotACacheError`.
- The marker names the tier (``"local"`` or ``"shared"``): a node's local cache is never
  taken for the shared tier, nor the other way round.

Adopting a cache directory that an earlier layout format made.

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
marker saying ``"adopting": <format>`` until it is done (above): a process killed
midway leaves the next one to finish it, and every step can run again.
"""

from __future__ import annotations

import errno
import json
import os
import secrets
import sqlite3
import stat
from dataclasses import dataclass
from urllib.request import pathname2url

from fsspec_shards.config import user_cache_dir
from fsspec_shards.storage.backends import KEY_FORMAT
from fsspec_shards.storage.cache import layout, locks, space
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


_UNWRITABLE = (errno.EROFS, errno.EACCES, errno.EPERM)
PRIVATE_PREFIX = "fsspec-shards-"


class CacheDirectoryError(OSError):
    """A cache directory the cache will not use: names the path, the reason and the fix."""

    def __init__(self, path: str, reason: str, fix: str, code: int = errno.EPERM) -> None:
        self.path, self.reason, self.fix = path, reason, fix
        super().__init__(code, f"cache: {path} {reason}; {fix}")
        self.filename = path

    def __str__(self) -> str:
        return self.args[1]

    def __reduce__(self):
        return (type(self), (self.path, self.reason, self.fix, self.errno))


class NotACacheError(CacheDirectoryError):
    """Inspection of a directory that is not a fsspec-shards cache (nothing was created).

    ``kind`` says why: ``"missing"``, ``"empty"`` (no cache yet), ``"foreign"`` (other
    files), ``"previous"`` (a cache of an earlier layout format, adopted at first use).
    """

    def __init__(self, path: str, reason: str, kind: str, code: int = errno.ENOENT) -> None:
        self.kind = kind
        super().__init__(path, reason, "nothing was created", code)

    def __reduce__(self):
        return (type(self), (self.path, self.reason, self.kind, self.errno))


@dataclass(frozen=True)
class Prepared:
    """A cache directory ready for use: ``writable`` False means read-only; ``usable`` False
    means there is no cache at all (every read streams), ``problem`` says why."""

    path: str
    writable: bool
    usable: bool = True
    problem: str = ""
    full: bool = False


_OPTION_OF_TIER = {
    "local": "cache_dir (or FSSPEC_SHARDS_CACHE)",
    "shared": "shared_cache_dir (or FSSPEC_SHARDS_SHARED_CACHE)",
}


def _choose_another(tier: str) -> str:
    """The fix that always works: the option (of ``tier``) naming a directory of one's own
    (for the local tier, the per-user default as an example)."""
    example = f" (such as {user_cache_dir()})" if tier == "local" else ""
    return f"set {_OPTION_OF_TIER[tier]} to a new or empty directory of your own{example}"


def private_directory(shared: str) -> str:
    """Where the cache of this user lives when it is given a sticky, world-writable
    directory (``/tmp``, ``/dev/shm``) that everyone shares: ``fsspec-shards-<uid>`` in it."""
    return os.path.join(shared, f"{PRIVATE_PREFIX}{os.geteuid()}")


def _in_sticky_directory(path: str, create: bool, tier: str) -> str:
    """``path``, or for a sticky world-writable directory the private one inside it (made
    0700 with ``create``; a symlink there is refused: anyone may have planted it)."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return path
    sticky_and_shared = info.st_mode & stat.S_ISVTX and info.st_mode & stat.S_IWOTH
    if not (stat.S_ISDIR(info.st_mode) and sticky_and_shared):
        return path
    private = private_directory(path)
    if create:
        _create(private)
    try:
        found = os.lstat(private)
    except FileNotFoundError:
        return private
    if stat.S_ISLNK(found.st_mode):
        raise CacheDirectoryError(private, "is a symlink", _choose_another(tier))
    return private


def prepare(directory: str, *, create: bool = True, tier: str = "local") -> Prepared:
    """Check ``directory`` and, with ``create``, make it (or an empty one) a cache of
    ``tier`` (``"local"``, or ``"shared"``: the tier all nodes mount). A sticky directory
    everyone may write to (``/tmp``) holds the cache in a private directory of this user
    (:func:`private_directory`), never itself. A disk too full to set it up gives an
    unusable ``Prepared`` with ``full`` set (a later use tries again)."""
    try:
        return _prepare(directory, create, tier)
    except OSError as error:
        if not create or not space.is_disk_full(error) or isinstance(error, CacheDirectoryError):
            raise
        path = os.path.abspath(os.path.expanduser(str(directory)))
        reason = f"cannot be set up: the disk is full ({os.strerror(errno.ENOSPC)})"
        return Prepared(path, writable=False, usable=False, problem=reason, full=True)


def _prepare(directory: str, create: bool, tier: str) -> Prepared:
    path = os.path.abspath(os.path.expanduser(str(directory)))
    path = _in_sticky_directory(path, create, tier)
    try:
        info = os.stat(path)
    except FileNotFoundError:
        if not create:
            raise NotACacheError(path, "does not exist", "missing") from None
        problem = _create(path)
        if problem:
            return Prepared(path, writable=False, usable=False, problem=problem)
        info = os.stat(path)
    if not stat.S_ISDIR(info.st_mode):
        if not create:
            raise NotACacheError(path, "is not a directory", "foreign", errno.ENOTDIR)
        raise CacheDirectoryError(path, "is not a directory", _choose_another(tier), errno.ENOTDIR)
    _check_private(path, info, tier)
    marker = _read_marker(path, tier)
    writable = os.access(path, os.W_OK)
    if marker is None or _earlier_format(marker) is not None:
        if not create:
            raise _not_a_cache(path, marker)
        if not writable:
            return Prepared(
                path, writable=False, usable=False, problem="cannot be set up: it is read-only"
            )
        marker = _take(path, tier)
    if marker.get("tier", "local") != tier:
        raise CacheDirectoryError(
            path,
            f"is the {marker.get('tier', 'local')} tier of a cache, not a {tier} one",
            "give the local cache (cache_dir) and the shared tier (shared_cache_dir) "
            "directories of their own",
            errno.EEXIST,
        )
    _check_contents(path, writable, tier)
    return Prepared(path, writable=writable)


def _create(path: str) -> str:
    """Create ``path`` 0700 (its parents as the umask says); a reason if that is impossible."""
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as error:
        if error.errno in _UNWRITABLE:
            return f"cannot be created ({os.strerror(error.errno)})"
        raise
    return ""


def _take(path: str, tier: str) -> dict:
    """Under the directory's lock: mark an empty directory, or adopt one of an earlier
    layout format, or refuse anything else. Returns the marker."""
    with locks.hold_directory(path):
        marker = _read_marker(path, tier)
        if marker is None:
            names = os.listdir(path)
            if not names or _is_half_made(path, names, tier):
                made = _write_marker(path, tier=tier)  # first: then it is a cache
                _make_subdirectories(path)
                return made
            if tier != "local" or not is_format_1(path, names):
                raise CacheDirectoryError(
                    path,
                    f"is not empty and is not a fsspec-shards cache (no {layout.MARKER})",
                    _choose_another(tier),
                    errno.EEXIST,
                )
            earlier = 1
        else:
            earlier = _earlier_format(marker)
            if earlier is None or marker.get("tier", "local") != tier:
                return marker
        _write_marker(path, tier=tier, adopting=earlier)
        _make_subdirectories(path)
        if tier == "local":  # the shared tier's layout is the same in every format
            adopt(path, earlier)
        return _write_marker(path, tier=tier)


def _is_half_made(path: str, names: list[str], tier: str) -> bool:
    """Whether ``path`` is a directory set up only halfway by an earlier version (it made
    the subdirectories before the marker, and met a full disk): nothing in it but some of
    our subdirectories, each real, ours, private and empty."""
    if not set(names) <= set(layout.SUBDIRECTORIES):
        return False
    for name in names:
        try:
            info = check_directory(os.path.join(path, name), tier)
        except CacheDirectoryError:
            return False
        if info is None or os.listdir(os.path.join(path, name)):
            return False
    return True


def _earlier_format(marker: dict) -> int | None:
    """The earlier layout format a marked directory is still to be adopted from, if any
    (format 2 marked a directory "adopting" while it adopted one of format 1)."""
    if marker["format"] in MARKED_FORMATS:
        return 1 if marker.get("adopting") else marker["format"]
    adopting = marker.get("adopting")
    return adopting if adopting in (1, *MARKED_FORMATS) else None


def _not_a_cache(path: str, marker: dict | None) -> NotACacheError:
    previous = (
        "is a cache of an earlier fsspec-shards version: it is adopted the first time a "
        "read uses it (what cannot be served under this version is removed)"
    )
    if marker is not None:
        return NotACacheError(path, previous, "previous")
    names = os.listdir(path)
    if not names:
        return NotACacheError(path, "is empty: no cache yet", "empty")
    if is_format_1(path, names):
        return NotACacheError(path, previous, "previous")
    return NotACacheError(path, f"is not a fsspec-shards cache (no {layout.MARKER})", "foreign")


def _check_private(path: str, info: os.stat_result, tier: str) -> None:
    """``path`` (stat ``info``) is owned by the current user and writable by nobody else."""
    if info.st_uid != os.geteuid():
        raise CacheDirectoryError(
            path,
            f"is owned by uid {info.st_uid}, not by you (uid {os.geteuid()})",
            _choose_another(tier),
        )
    if info.st_mode & 0o022:
        raise CacheDirectoryError(
            path,
            f"is writable by group or others (mode {stat.S_IMODE(info.st_mode):04o}), who "
            "could swap the files it holds",
            _choose_another(tier),
        )


def check_directory(path: str, tier: str) -> os.stat_result | None:
    """lstat of a directory inside a cache of ``tier`` (e.g. ``files/ab``): None if absent;
    a :class:`CacheDirectoryError` if it is a symlink, not a directory, foreign or writable
    by others (whoever may write in it may swap the files it holds)."""
    return _check_entry(path, "directory", tier)


def _check_entry(path: str, kind: str, tier: str) -> os.stat_result | None:
    """lstat of a file the cache keeps: None if absent; an error if it is a symlink, not of
    ``kind`` ("directory" or "file"), foreign or writable by others."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    wanted = stat.S_ISDIR if kind == "directory" else stat.S_ISREG
    if not wanted(info.st_mode):
        what = "a symlink" if stat.S_ISLNK(info.st_mode) else f"not a {kind}"
        raise CacheDirectoryError(
            path,
            f"is {what}",
            f"remove it (the cache makes it again), or {_choose_another(tier)}",
        )
    _check_private(path, info, tier)
    return info


def _read_marker(path: str, tier: str) -> dict | None:
    marker_path = layout.marker_path(path)
    if _check_entry(marker_path, "file", tier) is None:
        return None
    try:
        descriptor = os.open(marker_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(descriptor, "rb") as file:
            marker = json.loads(file.read(4096))
        version = marker["format"]
    except (OSError, ValueError, KeyError, TypeError):
        raise CacheDirectoryError(
            marker_path, "is damaged", f"remove the directory, or {_choose_another(tier)}"
        ) from None
    if version != layout.FORMAT and version not in MARKED_FORMATS:
        raise CacheDirectoryError(
            path,
            f"holds a cache of layout format {version!r}, this version of fsspec-shards "
            f"reads format {layout.FORMAT}",
            f"use the fsspec-shards version that made it, or {_choose_another(tier)}",
        )
    return marker


def _write_marker(path: str, *, tier: str, adopting: int | None = None) -> dict:
    """Write the marker atomically and durably (the publication sequence of
    :mod:`.layout`: a temp file, fsynced, renamed over it, the directory fsynced), 0600;
    returns it. ``adopting``: the earlier layout format being adopted."""
    content = {"format": layout.FORMAT, "made_by": "fsspec-shards", "tier": tier}
    if adopting is not None:
        content["adopting"] = adopting
    temp = os.path.join(path, f".{layout.MARKER}.{secrets.token_hex(4)}")
    text = json.dumps(content).encode()
    try:
        layout.write_new_file(temp, lambda descriptor: os.write(descriptor, text), read_only=False)
        layout.rename_into_place(temp, layout.marker_path(path))
    except BaseException:
        layout.remove_file(temp)
        raise
    return content


def _make_subdirectories(path: str) -> None:
    for name in layout.SUBDIRECTORIES:
        try:
            os.mkdir(os.path.join(path, name), 0o700)
        except FileExistsError:
            pass


def _check_contents(path: str, writable: bool, tier: str) -> None:
    """Subdirectories and index private and real (no symlinks); missing ones made."""
    for name in layout.SUBDIRECTORIES:
        subdirectory = os.path.join(path, name)
        if check_directory(subdirectory, tier) is None and writable:
            try:
                os.mkdir(subdirectory, 0o700)
            except FileExistsError:
                check_directory(subdirectory, tier)
    index = layout.index_path(path)
    for suffix in _SQLITE_SUFFIXES[1:]:
        _check_entry(index + suffix, "file", tier)
    info = _check_entry(index, "file", tier)
    if info is not None and info.st_mode & 0o077 and writable:
        os.chmod(index, 0o600)
