"""Durability off the critical path (storage/cache/durability.py, publication.py, store.py):
a file is published once written and verified, synced in the background; after a reboot an entry
that was not yet durable is verified again before its first use, a durable one is not.

A reboot is a changed boot id (``FSSPEC_SHARDS_BOOT_ID``); a crash before the background
sync is a syncer that never ran.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import threading

import pytest

from fsspec_shards.storage.cache import ShardCache, durability, index_database, publication
from fsspec_shards.storage.cache import store as store_module
from tests.cache_objects import obj, payload, read_only_view, writer  # noqa: F401

URL = "s3://bucket/shard.tar"
SIZE = 300_000


@pytest.fixture(autouse=True)
def _boot(monkeypatch):
    monkeypatch.setenv(durability.BOOT_ID_ENV, "boot-before")


def _reboot(monkeypatch) -> None:
    monkeypatch.setenv(durability.BOOT_ID_ENV, "boot-after")


class _CrashedSyncer:
    """The machine went down before the background sync ran: nothing is synced."""

    def submit(self, path, on_durable) -> None:
        pass

    def drain(self) -> None:
        pass


@pytest.fixture
def crash_before_sync(monkeypatch):
    monkeypatch.setattr(publication, "SYNCER", _CrashedSyncer())


def _fill(cache: ShardCache, metadata: dict | None = None) -> str:
    data = payload(URL, SIZE)
    with cache.fetch(obj(URL), writer(data, metadata), expected_size=SIZE) as handle:
        return handle.name


def _pending(cache: ShardCache) -> str | None:
    return cache._index.lookup(obj(URL).key)[2]


def _damage(path: str, how: str) -> None:
    os.chmod(path, 0o600)
    with open(path, "r+b") as file:
        if how == "truncated":
            file.truncate(SIZE // 2)
        else:
            file.seek(65536)
            file.write(bytes(4096))  # a block that never reached the disk reads as zeros
    os.chmod(path, 0o400)


def _no_rehash(monkeypatch) -> None:
    def fail(*args):
        raise AssertionError("the file was hashed again")

    monkeypatch.setattr(store_module, "matches", fail)


def test_a_published_file_becomes_durable_in_the_background(tmp_path):
    cache = ShardCache(str(tmp_path / "c"), 10**9)
    _fill(cache)
    cache.flush()  # waits for this process's background syncs
    assert _pending(cache) is None


@pytest.mark.parametrize("how", ["zeroed", "truncated"])
def test_after_a_reboot_a_torn_entry_that_was_not_durable_is_never_served(
    tmp_path, monkeypatch, crash_before_sync, how
):
    cache = ShardCache(str(tmp_path / "c"), 10**9)
    path = _fill(cache)
    assert _pending(cache) == "boot-before"
    _damage(path, how)
    _reboot(monkeypatch)
    assert cache.open(obj(URL)) is None  # dropped, not served
    data = payload(URL, SIZE)
    with cache.fetch(obj(URL), writer(data), expected_size=SIZE) as handle:
        assert handle.read() == data  # downloaded again


def test_after_a_reboot_an_intact_entry_that_was_not_durable_is_verified_then_served(
    tmp_path, monkeypatch, crash_before_sync
):
    cache = ShardCache(str(tmp_path / "c"), 10**9)
    _fill(cache)
    _reboot(monkeypatch)
    handle = cache.open(obj(URL))
    assert (
        handle is not None
        and hashlib.sha256(handle.read()).digest() == hashlib.sha256(payload(URL, SIZE)).digest()
    )
    handle.close()
    assert _pending(cache) is None  # durable now: not verified again
    _no_rehash(monkeypatch)
    assert cache.get(obj(URL)) is not None


def _files_under(directory: str) -> set[str]:
    return {
        os.path.relpath(os.path.join(root, name), directory)
        for root, _, names in os.walk(directory)
        for name in names
    }


@pytest.fixture
def index_writes(monkeypatch) -> list[str]:
    """The names of the threads that wrote an index, from now on."""
    writes: list[str] = []
    write = index_database.Database.write

    def spied(database, operation, default=None):
        writes.append(threading.current_thread().name)
        return write(database, operation, default)

    monkeypatch.setattr(index_database.Database, "write", spied)
    return writes


def test_the_background_sync_writes_nothing_into_the_cache_directory(tmp_path, index_writes):
    """A caller may remove the directory as soon as its read returned (a temporary
    directory): the sync of what it filled must not create a file in it meanwhile."""
    directory = str(tmp_path / "c")
    cache = ShardCache(directory, 10**9)
    release = threading.Event()
    (tmp_path / "held").write_bytes(b"x")
    durability.SYNCER.submit(str(tmp_path / "held"), lambda: release.wait(30))  # syncer busy
    _fill(cache)
    returned = _files_under(directory)
    del index_writes[:]
    release.set()
    durability.SYNCER.drain()  # the fill's file is synced now
    assert index_writes == []
    assert _files_under(directory) == returned
    shutil.rmtree(directory)


def test_a_sync_during_the_removal_of_the_directory_leaves_nothing_behind(
    tmp_path, monkeypatch, caplog
):
    """The removal lists and unlinks the files while the syncer runs (after its fsync):
    nothing is created that would keep the directory from being removed."""
    directory = str(tmp_path / "c")
    cache = ShardCache(directory, 10**9)
    fsync = durability.fsync_file_and_directory

    def fsync_then_files_removed(path: str) -> None:
        fsync(path)
        for name in _files_under(directory):
            os.unlink(os.path.join(directory, name))

    monkeypatch.setattr(durability, "fsync_file_and_directory", fsync_then_files_removed)
    with caplog.at_level("WARNING", "fsspec_shards"):
        _fill(cache)
        durability.SYNCER.drain()
    assert _files_under(directory) == set() and caplog.records == []
    shutil.rmtree(directory)


def test_a_synced_entry_is_recorded_durable_by_the_next_index_write(tmp_path, monkeypatch):
    cache = ShardCache(str(tmp_path / "c"), 10**9)
    _fill(cache)
    durability.SYNCER.drain()
    assert _pending(cache) is None  # this process knows it is durable: no record yet
    assert cache._index.durable_unrecorded()
    cache.incr("hits")
    cache.stats()  # writes the counts, and with them the durable record
    assert not cache._index.durable_unrecorded()
    store_module._SHARED.clear()  # (as another process sees the index)
    assert ShardCache(str(tmp_path / "c"), 10**9)._index.lookup(obj(URL).key)[2] is None


def test_a_synced_entry_whose_record_was_never_written_is_verified_after_a_reboot(
    tmp_path, monkeypatch
):
    """The process ended before any index write recorded what its syncer noted: the entry
    stays published under that boot, and is verified again after a reboot."""
    _fill(ShardCache(str(tmp_path / "c"), 10**9))
    durability.SYNCER.drain()
    store_module._SHARED.clear()  # the process ended: what it noted is gone
    cache = ShardCache(str(tmp_path / "c"), 10**9)
    assert _pending(cache) == "boot-before"
    _reboot(monkeypatch)
    hashed: list[str] = []
    matches = store_module.matches
    monkeypatch.setattr(
        store_module, "matches", lambda *args: hashed.append("hashed") or matches(*args)
    )
    handle = cache.open(obj(URL))
    assert handle is not None and handle.read() == payload(URL, SIZE)
    handle.close()
    assert hashed == ["hashed"] and _pending(cache) is None


def test_after_a_reboot_a_not_durable_entry_without_a_checksum_is_dropped(
    tmp_path, monkeypatch, crash_before_sync
):
    cache = ShardCache(str(tmp_path / "c"), 10**9)
    _fill(cache, metadata={"checksum": None})
    _reboot(monkeypatch)
    assert cache.get(obj(URL)) is None


def test_a_durable_entry_is_served_after_a_reboot_without_hashing_it_again(tmp_path, monkeypatch):
    cache = ShardCache(str(tmp_path / "c"), 10**9)
    _fill(cache)
    cache.flush()
    _reboot(monkeypatch)
    _no_rehash(monkeypatch)
    assert cache.get(obj(URL)) is not None


def test_on_the_same_boot_a_not_yet_durable_entry_is_served_as_it_is(
    tmp_path, monkeypatch, crash_before_sync
):
    """A killed process loses nothing the kernel has: no reason to hash it again."""
    cache = ShardCache(str(tmp_path / "c"), 10**9)
    _fill(cache)
    _no_rehash(monkeypatch)
    assert cache.get(obj(URL)) is not None


def test_without_a_boot_id_the_file_is_durable_before_it_is_published(tmp_path, monkeypatch):
    monkeypatch.setattr(publication, "boot_id", lambda: None)
    monkeypatch.setattr(publication, "SYNCER", _CrashedSyncer())
    cache = ShardCache(str(tmp_path / "c"), 10**9)
    _fill(cache)
    assert _pending(cache) is None


def test_after_a_reboot_a_not_durable_entry_of_a_read_only_cache_is_verified_and_served(
    tmp_path,
    monkeypatch,
    crash_before_sync,
    read_only_view,  # noqa: F811
):
    # (a cache filled by a process that ended before its syncs, then mounted read-only):
    # verified, it is served; that the index cannot record it durable is no error
    _fill(ShardCache(str(tmp_path / "c"), 10**9))
    store_module._SHARED.clear()
    _reboot(monkeypatch)
    cache = ShardCache(str(read_only_view(tmp_path / "c")), 10**9)
    handle = cache.open(obj(URL))
    assert handle is not None and handle.read() == payload(URL, SIZE)
    handle.close()
    _no_rehash(monkeypatch)  # once per process: a shard is not hashed at every open
    assert cache.get(obj(URL)) is not None
