"""Inter-process locks of a cache: ``flock`` on files the cache keeps.

Invariants:

- A lock file is created 0600, never through a symlink, and never unlinked: every waiter
  locks the same inode, so two holders can never lock two different files of one name.
- ``flock`` locks belong to an open file description; the kernel releases them when the
  holder dies, so a killed process never leaves a lock held. A lock is released with
  ``LOCK_UN`` before its descriptor closes, so a forked child still holding a copy of the
  descriptor does not keep it.
- Two threads of one process exclude each other too (each opens its own descriptor).
"""

from __future__ import annotations

import errno
import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager


def _open_lock_file(path: str) -> int:
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)


@contextmanager
def hold(path: str) -> Iterator[None]:
    """Hold the exclusive lock of ``path``, waiting as long as it takes."""
    descriptor = _open_lock_file(path)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(descriptor, fcntl.LOCK_UN)
    finally:
        os.close(descriptor)


@contextmanager
def try_hold(path: str) -> Iterator[bool]:
    """Take the lock of ``path`` if it is free; yields whether it was taken."""
    descriptor = _open_lock_file(path)
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(descriptor, fcntl.LOCK_UN)
    finally:
        os.close(descriptor)


def is_free(path: str) -> bool:
    """Whether nobody holds the lock of ``path`` right now (a lock file never made is free)."""
    try:
        descriptor = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return True
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(descriptor)  # closing the only descriptor releases a lock just taken
    return True


@contextmanager
def hold_directory(path: str) -> Iterator[None]:
    """Hold an exclusive lock on the directory ``path`` itself (creates no file in it).

    Serializes the set-up of a new cache directory. Where the filesystem cannot lock a
    directory (some network filesystems), it goes on unlocked: the set-up steps are
    idempotent, so a race there costs only repeated work.
    """
    descriptor = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX)
            locked = True
        except OSError as error:
            if error.errno not in (errno.EBADF, errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):
                raise
            locked = False
        try:
            yield
        finally:
            if locked:
                fcntl.flock(descriptor, fcntl.LOCK_UN)
    finally:
        os.close(descriptor)
