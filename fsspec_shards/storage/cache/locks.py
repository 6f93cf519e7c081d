"""Inter-process locks of a cache: filelock's ``flock`` locks, with the cache's rules.

filelock (``UnixFileLock``, >= 3.30) does the locking; this module fixes how the cache uses
it, in one place:

- A lock file is created 0600 (``mode``), never through a symlink (filelock opens it with
  ``O_NOFOLLOW``), and never unlinked (``preserve_lock_file``): every waiter locks the same
  inode, so two holders can never lock two different files of one name.
- ``flock`` locks belong to an open file description; the kernel releases them when the
  holder dies, so a killed process never leaves a lock held. filelock releases with
  ``LOCK_UN`` before it closes the descriptor, so a forked child still holding a copy does
  not keep the lock (and a child never unlocks what its parent holds).
- No existence-lock fallback (``fallback_to_soft=False``): on a filesystem without
  ``flock`` a lock raises instead of turning into a marker file a killed holder would leave.
- Two threads of one process exclude each other too: every hold is a lock object of its
  own, with a descriptor of its own. A thread that asks again for a lock it holds gets
  filelock's ``RuntimeError`` instead of waiting for itself forever.
- A waiter polls with a backing-off interval (1 ms, doubling to 16 ms) instead of filelock's
  fixed 50 ms: a lock held for a moment (a prefetch's index write) costs its waiter about
  that moment, not 50 ms, and a long wait still wakes at most ~60 times a second.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager

from filelock import Timeout, UnixFileLock, lock_descriptor, unlock_descriptor

UNSUPPORTED = frozenset({errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EBADF, errno.EINVAL})
"""errnos of a filesystem that cannot lock (some network filesystems)."""

FIRST_POLL_SECONDS = 0.001
"""A waiter's first pause between two tries; each next one is twice as long..."""
LONGEST_POLL_SECONDS = 0.016
"""...up to this: a waiter never sleeps longer than this past the lock's release."""


def _lock(path: str) -> UnixFileLock:
    return UnixFileLock(path, mode=0o600, fallback_to_soft=False, preserve_lock_file=True)


def _acquire(lock: UnixFileLock) -> None:
    """Take ``lock``, waiting as long as it takes, polling with a backing-off interval."""
    pause = FIRST_POLL_SECONDS
    while True:
        try:
            lock.acquire(timeout=0)
            return
        except Timeout:
            time.sleep(pause)
            pause = min(pause * 2, LONGEST_POLL_SECONDS)


@contextmanager
def hold(path: str) -> Iterator[None]:
    """Hold the exclusive lock of ``path``, waiting as long as it takes."""
    lock = _lock(path)
    _acquire(lock)
    try:
        yield
    finally:
        lock.release()


@contextmanager
def hold_if_supported(path: str) -> Iterator[bool]:
    """Hold the lock of ``path`` where its filesystem can lock; yields whether it holds it
    (False: the filesystem cannot lock, and the caller goes on unlocked)."""
    lock = _lock(path)
    try:
        _acquire(lock)
    except OSError as error:
        if error.errno not in UNSUPPORTED | {errno.EROFS, errno.EACCES}:
            raise
        yield False
        return
    try:
        yield True
    finally:
        lock.release()


@contextmanager
def hold_if_free(path: str) -> Iterator[bool]:
    """Take the lock of ``path`` only if nobody holds it; yields whether the caller may go
    on (True also where the filesystem cannot lock: then nothing is held)."""
    lock = _lock(path)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        yield False
        return
    except OSError as error:
        if error.errno not in UNSUPPORTED | {errno.EROFS, errno.EACCES}:
            raise
        yield True
        return
    try:
        yield True
    finally:
        lock.release()


def is_free(path: str) -> bool:
    """Whether nobody holds the lock of ``path`` right now (a lock file never made is free,
    and is not made)."""
    if not os.path.lexists(path):
        return True
    lock = _lock(path)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        return False
    lock.release()
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
            locked = lock_descriptor(descriptor)
        except OSError as error:
            if error.errno not in UNSUPPORTED:
                raise
            locked = False
        try:
            yield
        finally:
            if locked:
                unlock_descriptor(descriptor)
    finally:
        os.close(descriptor)
