"""storage/cache/durability.py's own parts: the boot id, reading a file back against its checksum,
and the background syncer. (What the cache does with them, a reboot before a sync, is in
tests/test_cache_durability.py.)"""

from __future__ import annotations

import hashlib
import logging
import os
import signal
import threading
from pathlib import Path

import pytest

from fsspec_shards.storage.cache import durability
from fsspec_shards.storage.cache.durability import (
    Syncer,
    boot_id,
    fsync_file_and_directory,
    matches,
)

MiB = 1024 * 1024


def test_an_injected_boot_id_wins(monkeypatch):
    monkeypatch.setenv(durability.BOOT_ID_ENV, "boot-injected")
    assert boot_id() == "boot-injected"


def test_the_kernel_boot_id_is_read_when_none_is_injected(monkeypatch):
    monkeypatch.delenv(durability.BOOT_ID_ENV, raising=False)
    if not os.path.exists("/proc/sys/kernel/random/boot_id"):
        pytest.skip("no boot id on this system")
    assert boot_id() == Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def _opened(tmp_path, data: bytes) -> int:
    path = tmp_path / "file"
    path.write_bytes(data)
    return os.open(path, os.O_RDONLY)


def _sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def test_a_file_matches_the_checksum_of_its_first_size_bytes(tmp_path):
    data = os.urandom(9 * MiB)  # read back in more than one piece
    descriptor = _opened(tmp_path, data + b"trailing")
    try:
        assert matches(descriptor, len(data), _sha256(data))
        assert not matches(descriptor, len(data) + 1, _sha256(data))
        md5 = "md5:" + hashlib.md5(data).hexdigest()
        assert matches(descriptor, len(data), md5)
    finally:
        os.close(descriptor)


def test_a_zeroed_block_or_a_short_file_does_not_match(tmp_path):
    data = os.urandom(300_000)
    torn = data[:65536] + bytes(4096) + data[65536 + 4096 :]
    for written in (torn, data[:150_000]):
        descriptor = _opened(tmp_path, written)
        try:
            assert not matches(descriptor, len(data), _sha256(data))
        finally:
            os.close(descriptor)


def test_fsync_refuses_a_missing_file_and_a_symlink(tmp_path):
    (tmp_path / "real").write_bytes(b"x")
    fsync_file_and_directory(str(tmp_path / "real"))
    with pytest.raises(FileNotFoundError):
        fsync_file_and_directory(str(tmp_path / "missing"))
    os.symlink(tmp_path / "real", tmp_path / "link")
    with pytest.raises(OSError):
        fsync_file_and_directory(str(tmp_path / "link"))


def test_the_syncer_calls_on_durable_for_each_file_in_order_on_one_thread_of_its_own(tmp_path):
    syncer = Syncer()
    done: list[tuple[str, str]] = []
    for name in ("a", "b", "c"):
        (tmp_path / name).write_bytes(name.encode())
        syncer.submit(
            str(tmp_path / name),
            lambda name=name: done.append((name, threading.current_thread().name)),
        )
    syncer.drain()
    assert [name for name, _ in done] == ["a", "b", "c"]
    assert {thread for _, thread in done} == {"fsspec-shards-sync"}
    assert syncer._thread is not None and syncer._thread.daemon


def test_a_file_gone_before_its_sync_is_skipped_quietly(tmp_path, caplog):
    syncer = Syncer()
    done: list[str] = []
    with caplog.at_level(logging.WARNING, "fsspec_shards"):
        syncer.submit(str(tmp_path / "evicted"), lambda: done.append("evicted"))
        syncer.drain()
    assert done == [] and caplog.records == []


def test_a_file_that_cannot_be_made_durable_stays_not_durable_with_a_warning(tmp_path, caplog):
    (tmp_path / "f").write_bytes(b"x")

    def record_fails() -> None:
        raise OSError("disk full")

    syncer = Syncer()
    done: list[str] = []
    with caplog.at_level(logging.WARNING, "fsspec_shards"):
        syncer.submit(str(tmp_path / "f"), record_fails)
        (tmp_path / "g").write_bytes(b"y")
        syncer.submit(str(tmp_path / "g"), lambda: done.append("g"))
        syncer.drain()
    assert done == ["g"]  # the syncer goes on
    [warning] = caplog.records
    assert str(tmp_path / "f") in warning.getMessage() and "disk full" in warning.getMessage()


def test_a_forked_child_does_not_wait_for_what_its_parent_queued(tmp_path):
    (tmp_path / "f").write_bytes(b"x")
    release = threading.Event()
    syncer = Syncer()
    syncer.submit(str(tmp_path / "f"), lambda: release.wait(30))  # the parent stays busy
    pid = os.fork()
    if pid == 0:  # the child: drain returns, and a file of its own is synced
        signal.alarm(10)
        try:
            syncer.drain()
            synced: list[str] = []
            syncer.submit(str(tmp_path / "f"), lambda: synced.append("child"))
            syncer.drain()
            os._exit(0 if synced == ["child"] else 1)
        except BaseException:
            os._exit(2)
    try:
        _, status = os.waitpid(pid, 0)
    finally:
        release.set()
    syncer.drain()
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
