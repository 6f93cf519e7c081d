"""Where :class:`~fsspec_shards.iteration.writer.ShardWriter` assembles files before they get
their final names, and the clean-up after writers that died.

A writer owns a run directory ``<base>/.fsspec-shards-spool-<uid>/<token>/`` and, while it
runs, an ``flock`` on ``<token>.lock`` beside it. The kernel drops that lock when the process
ends, however it ends (SIGKILL included), so the next writer over the same base takes the
lock of each dead run and removes its directory; a live writer's lock is held, and its run is
left alone. No pid is trusted: pids are reused and differ across hosts and containers.

The spool directory is this user's own (not a symlink, no access for others), or it is
refused naming the option that chose it.
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import stat
import uuid

_LOCK = ".lock"
_NEW_LOCK = ".lock.new"  # a lock being made: renamed to .lock once held
_ATTEMPTS = 8


class Spool:
    """This writer's run directory under ``base``, made after removing the runs of writers
    that died. ``option`` names what chose ``base``, for the refusal of a foreign one."""

    def __init__(self, base: str, option: str) -> None:
        self.area = os.path.join(base, f".fsspec-shards-spool-{os.geteuid()}")
        self.option = option
        for _ in range(_ATTEMPTS):
            self._make_area()
            remove_dead_runs(self.area)
            try:
                self.token, self._lock = self._hold_lock()
                self.run = os.path.join(self.area, self.token)
                os.mkdir(self.run, 0o700)
                return
            except (FileNotFoundError, BlockingIOError):
                continue  # another writer removed the empty area, or a cleaner took the lock
        raise OSError(f"could not make a spool directory in {self.area} ({option})")

    def path(self, name: str) -> str:
        """A new file's path in the run directory for ``name`` (a shard or manifest name)."""
        return os.path.join(self.run, f"{name}.{uuid.uuid4().hex[:12]}.part")

    def close(self) -> None:
        """Remove the run directory and its lock; the area too when no other run is in it."""
        if self._lock is None:
            return
        lock, self._lock = self._lock, None
        try:
            _remove_tree(self.run)
            _unlink(os.path.join(self.area, self.token + _LOCK))
        finally:
            os.close(lock)
        try:
            os.rmdir(self.area)
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOENT):
                raise

    def _make_area(self) -> None:
        os.makedirs(self.area, mode=0o700, exist_ok=True)
        found = os.lstat(self.area)
        if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.geteuid() or found.st_mode & 0o077:
            raise PermissionError(
                f"spool directory {self.area} is not a private directory of this user: "
                f"remove it, or choose another {self.option}"
            )

    def _hold_lock(self) -> tuple[str, int]:
        """A new token and its lock file, held: made under a name cleaners skip while it is
        not yet locked, then renamed into place."""
        token = uuid.uuid4().hex
        new = os.path.join(self.area, token + _NEW_LOCK)
        descriptor = os.open(new, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.rename(new, os.path.join(self.area, token + _LOCK))
        except BaseException:
            os.close(descriptor)
            raise
        return token, descriptor


def remove_dead_runs(area: str) -> list[str]:
    """Remove the run directories in ``area`` whose lock no live process holds; their
    tokens. A lock file left before it was renamed into place goes the same way."""
    removed = []
    for entry in sorted(os.listdir(area)):
        for suffix in (_LOCK, _NEW_LOCK):
            if entry.endswith(suffix) and _remove_if_dead(area, entry[: -len(suffix)], entry):
                removed.append(entry[: -len(suffix)])
    return removed


def _remove_if_dead(area: str, token: str, lock_name: str) -> bool:
    lock_path = os.path.join(area, lock_name)
    try:
        descriptor = os.open(lock_path, os.O_RDWR)
    except FileNotFoundError:
        return False  # removed by another cleaner meanwhile
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # its writer is alive
        if lock_name.endswith(_LOCK):
            _remove_tree(os.path.join(area, token))
        _unlink(lock_path)
        return True
    finally:
        os.close(descriptor)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass  # another cleaner removed it: the goal either way


def _remove_tree(path: str) -> None:
    try:
        shutil.rmtree(path)
    except FileNotFoundError:
        pass  # removed by another cleaner meanwhile
