"""The cache's locks (filelock's flock locks, used by the cache's rules), with real threads,
real forked children and a real SIGKILL."""

from __future__ import annotations

import multiprocessing
import os
import signal
import stat
import threading
import time
from pathlib import Path

import pytest

from fsspec_shards.storage.cache import locks

JOIN_TIMEOUT = 120


def _hold_until_killed(path: str, held) -> None:
    with locks.hold(path):
        held.set()
        threading.Event().wait(JOIN_TIMEOUT)


def _report_whether_free(path: str, results) -> None:
    results.put(locks.is_free(path))


def free_in_another_process(path: Path) -> bool:
    """Whether ``path``'s lock is free, as a process that holds no copy of it sees it."""
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    child = context.Process(target=_report_whether_free, args=(str(path), results))
    child.start()
    try:
        return results.get(timeout=JOIN_TIMEOUT)
    finally:
        child.join(JOIN_TIMEOUT)


def test_a_lock_file_is_made_0600_and_kept_after_release(tmp_path: Path) -> None:
    path = tmp_path / "a.lock"
    previous = os.umask(0)
    try:
        with locks.hold(str(path)):
            assert stat.S_IMODE(path.stat().st_mode) == 0o600
            inode = path.stat().st_ino
    finally:
        os.umask(previous)
    assert path.stat().st_ino == inode  # never unlinked: every waiter locks this inode
    assert locks.is_free(str(path))


def test_a_lock_file_that_is_a_symlink_is_never_followed(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.txt"
    target.write_bytes(b"mine")
    os.chmod(target, 0o644)
    (tmp_path / "a.lock").symlink_to(target)
    with pytest.raises(OSError):
        with locks.hold(str(tmp_path / "a.lock")):
            pass
    assert target.read_bytes() == b"mine" and stat.S_IMODE(target.stat().st_mode) == 0o644


def test_is_free_of_a_lock_never_made_makes_no_file(tmp_path: Path) -> None:
    assert locks.is_free(str(tmp_path / "never.lock"))
    assert not (tmp_path / "never.lock").exists()


def test_two_threads_of_one_process_exclude_each_other(tmp_path: Path) -> None:
    path = str(tmp_path / "a.lock")
    inside, release = threading.Event(), threading.Event()
    order = []

    def first() -> None:
        with locks.hold(path):
            order.append("first in")
            inside.set()
            assert release.wait(JOIN_TIMEOUT)
            order.append("first out")

    def second() -> None:
        with locks.hold(path):
            order.append("second in")

    one = threading.Thread(target=first)
    one.start()
    assert inside.wait(JOIN_TIMEOUT)
    assert not locks.is_free(path)  # a third thread's probe sees it held
    two = threading.Thread(target=second)
    two.start()
    two.join(0.5)
    assert two.is_alive()  # waiting for the first
    release.set()
    one.join(JOIN_TIMEOUT)
    two.join(JOIN_TIMEOUT)
    assert order == ["first in", "first out", "second in"]


def test_a_killed_holder_leaves_the_lock_free(tmp_path: Path) -> None:
    path = str(tmp_path / "a.lock")
    context = multiprocessing.get_context("spawn")
    held = context.Event()
    holder = context.Process(target=_hold_until_killed, args=(path, held))
    holder.start()
    assert held.wait(JOIN_TIMEOUT)
    assert not locks.is_free(path)
    os.kill(holder.pid, signal.SIGKILL)
    holder.join(JOIN_TIMEOUT)
    assert holder.exitcode == -signal.SIGKILL
    assert locks.is_free(path)
    with locks.hold(path):
        pass


def test_a_forked_child_neither_keeps_nor_releases_its_parents_lock(tmp_path: Path) -> None:
    path = str(tmp_path / "a.lock")
    context = multiprocessing.get_context("fork")
    with locks.hold(path):
        child = context.Process(target=time.sleep, args=(3,))
        child.start()  # holds a copy of the locked descriptor
        assert not free_in_another_process(tmp_path / "a.lock")
        quick = context.Process(target=os._exit, args=(0,))
        quick.start()
        quick.join(JOIN_TIMEOUT)  # a child that exits at once releases nothing of ours
        assert not free_in_another_process(tmp_path / "a.lock")
    assert child.is_alive()  # still holding its copy, while the parent released the lock
    assert free_in_another_process(tmp_path / "a.lock")
    child.join(JOIN_TIMEOUT)


def test_a_directory_lock_excludes_another_process_and_makes_no_file(tmp_path: Path) -> None:
    directory = tmp_path / "cache"
    directory.mkdir()
    context = multiprocessing.get_context("spawn")
    with locks.hold_directory(str(directory)):
        results = context.Queue()
        child = context.Process(target=_try_directory, args=(str(directory), results))
        child.start()
        assert results.get(timeout=JOIN_TIMEOUT) == "busy"
        child.join(JOIN_TIMEOUT)
    assert list(directory.iterdir()) == []


def _try_directory(path: str, results) -> None:
    import fcntl

    descriptor = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        results.put("free")
    except BlockingIOError:
        results.put("busy")
    finally:
        os.close(descriptor)


def _wait_after_a_short_hold(path: Path) -> float:
    """How long past the release of a lock held for a moment by another thread its waiter
    gets it."""
    held, released_at, waited = threading.Event(), [], []

    def holder() -> None:
        with locks.hold(str(path)):
            held.set()
            time.sleep(0.005)
            released_at.append(time.perf_counter())

    thread = threading.Thread(target=holder)
    thread.start()
    assert held.wait(JOIN_TIMEOUT)
    with locks.hold(str(path)):
        waited.append(time.perf_counter())
    thread.join(JOIN_TIMEOUT)
    return waited[0] - released_at[0]


def test_a_waiter_gets_a_briefly_held_lock_soon_after_its_release(tmp_path: Path) -> None:
    """filelock's fixed 50 ms poll made the first sample of a cold shard wait up to 50 ms
    behind a prefetch's moment of index writing; the backing-off poll wakes within a few
    ms. The best of five tries, so that a loaded machine's scheduling delay does not count."""
    best = min(_wait_after_a_short_hold(tmp_path / "lock") for _ in range(5))
    assert best < 0.02, best


def test_a_long_wait_polls_no_faster_than_the_longest_interval(tmp_path: Path) -> None:
    """Backing off: a waiter behind a lock held 0.3 s tries it a few dozen times, not
    thousands (no busy-spinning)."""
    path = str(tmp_path / "lock")
    tries = []
    original = locks.UnixFileLock.acquire

    held = threading.Event()
    release = threading.Event()

    def holder() -> None:
        with locks.hold(path):
            held.set()
            release.wait(JOIN_TIMEOUT)

    thread = threading.Thread(target=holder)
    thread.start()
    assert held.wait(JOIN_TIMEOUT)
    waiter = locks._lock(path)

    def counting(*args, **kwargs):
        tries.append(1)
        return original(waiter, *args, **kwargs)

    threading.Timer(0.3, release.set).start()
    waiter.acquire = counting  # counts this one lock object's tries; the lock is real
    started = time.perf_counter()
    locks._acquire(waiter)
    waited = time.perf_counter() - started
    waiter.release()
    thread.join(JOIN_TIMEOUT)
    # the short first pauses (1 + 2 + 4 + 8 ms), then one try per 16 ms at most
    assert 2 <= len(tries) <= waited / locks.LONGEST_POLL_SECONDS + 6, (len(tries), waited)
