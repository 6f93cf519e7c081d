"""Durability off the critical path (storage/cache/durability.py, publication.py, store.py):
a file is published once written and verified, synced in the background; after a reboot an entry
that was not yet durable is verified again before its first use, a durable one is not.

A reboot is a changed boot id (``FSSPEC_SHARDS_BOOT_ID``); a crash before the background
sync is a syncer that never ran.
"""

from __future__ import annotations

import hashlib
import os

import pytest

from fsspec_shards.storage.cache import ShardCache, durability, publication
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
