"""The shared cache tier: whole, verified files on a filesystem every node mounts.

A node's local cache (:class:`~.store.ShardCache`) looks here on a miss before it asks the
backend, and publishes here what it downloads, so a cluster downloads each shard once.

Invariants:

- One file per object *version*: ``files/ab/<version>``, where ``<version>`` digests the
  object's key, its identity (ETag / generation / version id, else modification time;
  always the size) and its write generation. A replaced object has a new name; there is no
  index to keep consistent across hosts, and no file is ever rewritten.
- A write through ``wds`` gives the object a new write generation (a random token in
  ``generations/<key>``, replaced by rename, before and after the write), so no copy made
  before the write is served after it on any host, also when the backend's identity cannot
  tell the versions apart (the same size and modification time). A copy published by a
  download that began before the write is named under the old generation: never read again.
- Whole and verified, or absent: a file is copied into ``tmp/``, fsynced, made read-only
  and renamed into place (atomic on local and network filesystems), so a reader on any host
  sees the whole file or nothing, also when a publisher is killed at any instant.
- A copy out of the tier is checked like a download: the size always, the checksum whenever
  one is known. A copy that fails is deleted and the object downloaded from the backend.
- One download per version across hosts where the filesystem's locks reach across hosts
  (``flock`` on ``locks/<version>.lock``, through :mod:`.locks`); where they do not, two
  hosts may each download (each copy is still whole).
- Its own size cap and least-recently-used order (a hit refreshes the file's modification
  time): a publication scans the tier and deletes the least recently used files until it
  fits, and temp files older than :data:`STALE_TEMP_SECONDS` — at most once every
  :data:`SCAN_INTERVAL_SECONDS` for the whole cluster, not per process: the modification
  time of ``locks/scan.lock`` records the last scan, and its lock lets one process scan at
  a time (a thousand nodes must not list the tier every few seconds). Between scans it may
  overshoot by what the cluster publishes meanwhile.
- The same trust rules as the local cache (:mod:`.trust`, marker tier ``"shared"``), and
  only names the tier makes are ever deleted.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import re
import secrets
import stat
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import BinaryIO

from fsspec_shards.storage.backends import ObjectId
from fsspec_shards.storage.cache import layout, locks, trust
from fsspec_shards.storage.cache.notices import warn_once
from fsspec_shards.storage.core.verification import Expectation, WholeHasher
from fsspec_shards.units import MiB

logger = logging.getLogger("fsspec_shards.storage.cache")

SCAN_INTERVAL_SECONDS = 30.0
STALE_TEMP_SECONDS = 3600.0
_CHUNK = 4 * MiB
_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_GENERATION_BYTES = 16
_TOKEN = re.compile(f"[0-9a-f]{{{2 * _GENERATION_BYTES}}}")
Counter = Callable[[str, int], None]


class SharedTier:
    """The shared tier in ``directory``, holding at most ``size_limit`` bytes.

    ``count(name, amount)`` receives ``shared_evictions`` and ``integrity_failures``.
    """

    def __init__(self, directory: str, size_limit: int, count: Counter | None = None) -> None:
        prepared = trust.prepare(directory, create=True, tier="shared")
        self.directory = prepared.path
        self.size_limit = int(size_limit)
        self.usable = prepared.usable
        self.writable = prepared.usable and prepared.writable
        self._count = count or (lambda name, amount: None)
        self._uid = os.geteuid()
        self._last_scan = float("-inf")
        if not self.usable:
            warn_once(
                self.directory,
                "unusable",
                f"shared cache tier {self.directory} {prepared.problem}: not used",
            )
        elif not self.writable:
            warn_once(
                self.directory,
                "read-only",
                f"shared cache tier {self.directory} is read-only: its files are used, "
                "nothing is added",
            )

    def __repr__(self) -> str:
        return f"SharedTier({self.directory!r}, size_limit={self.size_limit})"

    @staticmethod
    def version(obj: ObjectId, identity: str, generation: str = "") -> str:
        """The name of ``obj`` at ``identity`` (the backend's version of it) and write
        ``generation`` (none before its first write through ``wds``)."""
        written = f"\0{generation}" if generation else ""
        return hashlib.sha256(f"{obj.key}\0{identity}{written}".encode()).hexdigest()

    def current_version(self, obj: ObjectId, identity: str) -> str | None:
        """The name of ``obj`` at ``identity`` under its current write generation; None when
        the generation cannot be trusted (the tier is then not used for ``obj``)."""
        generation = self._generation(obj.key)
        return None if generation is None else self.version(obj, identity, generation)

    def new_generation(self, obj: ObjectId) -> None:
        """``obj`` is being written: a new write generation, for every host. A tier that
        cannot record it is reported (its copies of ``obj`` could be served stale)."""
        if not self.writable:
            return
        path = layout.shared_generation_path(self.directory, obj.key)
        temp = layout.temp_path(self.directory, layout.new_temp_name(obj.key, 0))
        try:
            if not self._directory_is_safe(path, create=True):
                raise OSError(errno.EPERM, "its generations directory is not private")
            token = secrets.token_hex(_GENERATION_BYTES).encode()
            layout.write_new_file(temp, lambda fd: os.write(fd, token), read_only=False)
            layout.rename_into_place(temp, path)
        except OSError as error:
            layout.remove_file(temp)
            warn_once(
                self.directory,
                f"generation:{obj.key}",
                f"shared cache tier {self.directory}: could not record the write of "
                f"{obj.shown} ({error}): other hosts may read its previous copy",
            )

    def fill(
        self,
        version: str | None,
        out: BinaryIO,
        download: Callable[[BinaryIO], dict],
        *,
        size: int | None,
        expected: Expectation,
        identity: str,
    ) -> tuple[dict, str]:
        """Fill ``out`` with ``version``: copied from this tier (``"shared"``) when it holds
        a copy that checks out (``size``, ``expected`` checksum), else by ``download(out)``
        from the backend and then published here (``"backend"``). Returns the metadata a
        download returns, and where the bytes came from. ``version`` None (see
        :meth:`current_version`): from the backend, nothing published."""
        if version is None:
            return download(out), "backend"
        with self._lock(version):
            copied = self._copy_out(version, out, size, expected, identity)
            if copied is not None:
                return copied, "shared"
            metadata = download(out)
            self.publish(version, out)
            return metadata, "backend"

    def publish(self, version: str, source: BinaryIO) -> bool:
        """Copy the whole, verified file ``source`` into the tier as ``version``; whether the
        tier holds it now. Failures (a full or read-only shared disk) are logged, not raised:
        the reader has its bytes either way."""
        if not self.writable:
            return False
        final = layout.shared_data_path(self.directory, version)
        if not self._directory_is_safe(final, create=True):
            return False
        if self._holds(final):
            return True
        source.flush()
        size = os.fstat(source.fileno()).st_size
        temp = layout.temp_path(self.directory, layout.new_temp_name(version, 0))
        try:
            layout.write_new_file(temp, lambda fd: _copy(source.fileno(), fd, size), read_only=True)
            layout.rename_into_place(temp, final)
        except OSError as error:
            layout.remove_file(temp)
            logger.warning(
                "could not add a file to the shared cache tier %s: %s", self.directory, error
            )
            return False
        self._evict_if_due()
        return True

    def _holds(self, final: str) -> bool:
        """Whether ``final`` is a copy this tier published: a regular file of ours. Anything
        else at that name (a symlink, another user's file) is replaced by the publication's
        rename, which never follows a link and never removes a directory: the name is one
        the tier makes, in a directory only we may write (:meth:`_directory_is_safe`), so
        nobody else's file can be there by right, and leaving it would keep the version
        from ever being published again (every host downloading from the backend)."""
        try:
            info = os.lstat(final)
        except FileNotFoundError:
            return False
        if stat.S_ISREG(info.st_mode) and info.st_uid == self._uid:
            return True
        kind = "a symlink" if stat.S_ISLNK(info.st_mode) else f"owned by uid {info.st_uid}"
        logger.warning(
            "shared cache tier: %s is %s; replacing it with the verified copy", final, kind
        )
        return False

    def discard(self, version: str | None) -> None:
        """Delete the tier's copy of ``version`` (found bad, or invalidated)."""
        if version is None:
            return
        path = layout.shared_data_path(self.directory, version)
        if self.writable and self._directory_is_safe(path):
            layout.remove_file(path)

    # -- internals -----------------------------------------------------------------------

    def _copy_out(
        self, version: str, out: BinaryIO, size: int | None, expected: Expectation, identity: str
    ) -> dict | None:
        if not self.usable:
            return None
        path = layout.shared_data_path(self.directory, version)
        if not self._directory_is_safe(path):
            return None
        try:
            descriptor = os.open(path, _OPEN_FLAGS)
        except OSError:  # absent; or a symlink, never followed
            return None
        try:
            info = os.fstat(descriptor)
            if not stat.S_ISREG(info.st_mode) or info.st_uid != self._uid:
                return None
            if size is not None and info.st_size != size:
                logger.warning("shared cache tier: %s has the wrong size; ignoring it", path)
                self._count("integrity_failures", 1)
                self.discard(version)
                return None
            out.seek(0)
            out.truncate()
            hasher = WholeHasher(expected.algorithms) if expected else None
            while data := os.read(descriptor, _CHUNK):
                out.write(data)
                if hasher is not None:
                    hasher.update(data)
        except OSError as error:  # e.g. evicted by another host mid-copy (ESTALE on NFS)
            logger.info("shared cache tier: could not copy %s: %s", path, error)
            return None
        finally:
            os.close(descriptor)
        if hasher is not None and expected.mismatch(hasher.checksums()) is not None:
            logger.warning("shared cache tier: %s fails its checksum; downloading again", path)
            self._count("integrity_failures", 1)
            self.discard(version)
            return None
        self._refresh(path)
        strongest = expected.strongest() if expected else None
        return {
            "size": info.st_size,
            "identity": identity,
            "checksum": str(strongest) if strongest is not None else None,
        }

    def _generation(self, key: str) -> str | None:
        """The write generation of ``key``: "" before its first write through ``wds``; None
        when what is there is not a token the tier wrote in a private directory."""
        path = layout.shared_generation_path(self.directory, key)
        if not self._directory_is_safe(path):
            return None if os.path.lexists(os.path.dirname(path)) else ""
        try:
            descriptor = os.open(path, _OPEN_FLAGS)
        except FileNotFoundError:
            return ""
        except OSError as error:  # a symlink, never followed
            logger.warning("shared cache tier: cannot read %s: %s", path, error)
            return None
        try:
            info = os.fstat(descriptor)
            token = os.read(descriptor, 2 * _GENERATION_BYTES + 1).decode("ascii", "replace")
        finally:
            os.close(descriptor)
        if (
            not stat.S_ISREG(info.st_mode)
            or info.st_uid != self._uid
            or not _TOKEN.fullmatch(token)
        ):
            logger.warning("shared cache tier: %s is not a generation it wrote; ignoring it", path)
            return None
        return token

    def _directory_is_safe(self, path: str, create: bool = False) -> bool:
        """Whether the directory holding ``path`` (``files/<xx>``, ``generations``) is real,
        ours and writable by no one else (:func:`.trust.check_directory`, as the local
        cache's): whoever may write in it may rename one copy over another (or bring back an
        old generation), which no check of the copy can tell.
        ``create`` makes it (0700) when absent. An unsafe one is reported once and unused."""
        directory = os.path.dirname(path)
        try:
            if trust.check_directory(directory, "shared") is not None:
                return True
            if not create:
                return False
            try:
                os.mkdir(directory, 0o700)
            except FileExistsError:
                pass
            return trust.check_directory(directory, "shared") is not None
        except trust.CacheDirectoryError as error:
            warn_once(
                self.directory, f"unsafe:{directory}", f"shared cache tier: {error}; not using it"
            )
            return False

    @contextmanager
    def _lock(self, version: str) -> Iterator[None]:
        """Hold the version's lock where the filesystem can lock; go on without elsewhere."""
        if not self.writable:
            yield
            return
        path = layout.key_lock_path(self.directory, version)
        with locks.hold_if_supported(path):
            yield

    def _refresh(self, path: str) -> None:
        """A hit: the file is now the most recently used (its modification time)."""
        if self.writable:
            try:
                os.utime(path)
            except OSError:
                pass

    def _evict_if_due(self) -> None:
        now = time.monotonic()
        if now - self._last_scan < SCAN_INTERVAL_SECONDS:
            return
        self._last_scan = now
        marker = layout.scan_lock_path(self.directory)
        last = _modified_at(marker)  # None: the tier was never scanned
        if last is not None and time.time() - last < SCAN_INTERVAL_SECONDS:
            return  # another process, maybe on another host, scanned lately
        with locks.hold_if_free(marker) as mine:
            if mine and (last is None or _modified_at(marker) == last):
                _touch(marker)
                self._evict()

    def _evict(self) -> None:
        found = []
        for shard in layout.list_directory(layout.files_directory(self.directory)):
            directory = layout.shard_directory_path(self.directory, shard)
            if not layout.is_shard_directory(shard) or not self._directory_is_safe(
                os.path.join(directory, shard)
            ):
                continue
            for name in layout.list_directory(directory):
                if layout.is_shared_data_name(name, shard):
                    path = os.path.join(directory, name)
                    try:
                        info = os.lstat(path)
                    except FileNotFoundError:
                        continue
                    if stat.S_ISREG(info.st_mode):
                        found.append((info.st_mtime, info.st_size, path))
        self._remove_stale_temp_files()
        total = sum(size for _, size, _ in found)
        for _, size, path in sorted(found):
            if total <= self.size_limit:
                break
            if layout.remove_file(path):
                self._count("shared_evictions", 1)
            total -= size

    def _remove_stale_temp_files(self) -> None:
        temp = layout.temp_directory(self.directory)
        for name in layout.list_directory(temp):
            if layout.parse_temp_name(name) is None:
                continue
            path = os.path.join(temp, name)
            try:
                if time.time() - os.lstat(path).st_mtime > STALE_TEMP_SECONDS:
                    layout.remove_file(path)
            except FileNotFoundError:
                pass


def _modified_at(path: str) -> float | None:
    try:
        return os.stat(path).st_mtime
    except FileNotFoundError:
        return None


def _touch(path: str) -> None:
    try:
        os.utime(path)
    except OSError:
        pass


def _copy(source: int, target: int, size: int) -> None:
    """Copy ``size`` bytes from the start of ``source`` to ``target`` (in the kernel where
    it can)."""
    copied = 0
    try:
        while copied < size and hasattr(os, "copy_file_range"):  # Linux
            done = os.copy_file_range(source, target, size - copied, copied, copied)
            if done == 0:
                break
            copied += done
    except OSError as error:
        if error.errno not in (errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
            raise
    while copied < size:
        data = os.pread(source, min(_CHUNK, size - copied), copied)
        if not data:
            break
        os.pwrite(target, data, copied)
        copied += len(data)
    if copied != size:
        raise OSError(errno.EIO, f"copied {copied} of {size} bytes")
