"""Making room in a cache (storage/cache/room.py): least-recently-used eviction, the size limit
counting bytes reserved by downloads in flight, eviction in batches, and a full disk.

Hits and counters batched in memory and written in one transaction (:class:`Usage`), over a
real index.

The files a cache made (:class:`OwnFiles`): leftovers of killed processes and
stale temp files removed, names the cache does not make left alone.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import threading
import time
from pathlib import Path

import pytest

from fsspec_shards.storage.cache import (
    CacheFullError,
    ShardCache,
    room,
)
from fsspec_shards.storage.cache.index import Index
from fsspec_shards.storage.cache.room import Usage, flush_all
from fsspec_shards.units import MiB
from tests.cache_objects import (
    SmallDisk,
    fill,
    obj,
    payload,
    small_disk,
    writer,
)

__all__ = ["small_disk"]


@pytest.fixture
def cache(tmp_path: Path) -> ShardCache:
    return ShardCache(str(tmp_path / "cache"), 1000)


def cached_urls(cache: ShardCache) -> list[str]:
    return [entry["url"] for entry in cache.entries()]


def test_evicted_file_is_deleted_from_disk(tmp_path: Path) -> None:
    cache = ShardCache(str(tmp_path / "c"), 200)
    first = fill(cache, "s3://bucket/a")
    fill(cache, "s3://bucket/b")
    fill(cache, "s3://bucket/c")
    assert not os.path.exists(first)
    files = [f for _, _, names in os.walk(tmp_path / "c" / "files") for f in names]
    assert len(files) == 2


def test_cap_holds_counting_bytes_reserved_by_downloads_in_flight(tmp_path: Path) -> None:
    cache = ShardCache(str(tmp_path / "c"), 300)
    for name in ("a", "b", "c"):
        fill(cache, f"s3://bucket/{name}")
    observed = []

    def slow_download(file) -> dict:
        # While this 200-byte download is in flight, its reservation already displaced two files.
        observed.append((cache.stats()["cached_bytes"], cached_urls(cache)))
        file.write(payload("big", 200))
        return {}

    cache.fetch(obj("s3://bucket/big"), slow_download, expected_size=200).close()
    assert observed == [(100, ["s3://bucket/c"])]
    assert cache.stats()["cached_bytes"] == 300


def test_second_download_waits_for_room_held_by_a_reservation(tmp_path: Path) -> None:
    cache = ShardCache(str(tmp_path / "c"), 250)
    first_written, release_first = threading.Event(), threading.Event()
    disk_peaks = []

    def disk_bytes() -> int:
        root = tmp_path / "c"
        files = [p for d in ("files", "tmp") for p in (root / d).rglob("*") if p.is_file()]
        return sum(p.stat().st_size for p in files)

    def held_download(file) -> dict:
        file.write(payload("one", 150))
        file.flush()
        first_written.set()
        assert release_first.wait(60)
        return {}

    def second_download(file) -> dict:
        file.write(payload("two", 150))
        file.flush()
        disk_peaks.append(disk_bytes())
        return {}

    def second() -> None:
        # Needs 150 bytes while 150 are reserved: waits for the first to publish, then evicts it.
        cache.fetch(obj("s3://bucket/two"), second_download, expected_size=150).close()

    first = threading.Thread(
        target=lambda: cache.fetch(obj("s3://bucket/one"), held_download, expected_size=150).close()
    )
    first.start()
    assert first_written.wait(60)
    thread = threading.Thread(target=second)
    thread.start()
    thread.join(1.0)
    assert thread.is_alive() and disk_peaks == []
    release_first.set()
    first.join(60)
    thread.join(60)
    assert disk_peaks == [150]
    assert cached_urls(cache) == ["s3://bucket/two"]
    assert cache.stats()["evictions"] == 1


def test_object_larger_than_the_cache_raises_cache_full_without_downloading(
    cache: ShardCache,
) -> None:
    calls = []
    with pytest.raises(CacheFullError) as raised:
        cache.fetch(obj("s3://bucket/huge"), lambda f: calls.append(f) or {}, expected_size=1001)
    assert isinstance(raised.value, OSError) and raised.value.errno == 28
    assert calls == [] and "s3://bucket/huge" in str(raised.value)


def test_cache_full_error_survives_pickling_between_processes() -> None:
    import pickle

    error = CacheFullError("https://host/a.tar?sig=SECRET", "too big")
    clone = pickle.loads(pickle.dumps(error))
    assert str(clone) == str(error) and clone.errno == error.errno == 28
    assert "SECRET" not in str(clone)


def test_download_of_unknown_size_larger_than_the_cache_raises_once_and_evicts_nothing(
    cache: ShardCache,
) -> None:
    kept = fill(cache, "s3://bucket/kept")
    calls = []

    def too_big(file) -> dict:
        calls.append(1)
        file.write(b"x" * 1001)
        return {}

    with pytest.raises(CacheFullError):
        cache.fetch(obj("s3://bucket/big"), too_big)
    assert calls == [1]
    assert cache.get(obj("s3://bucket/kept")) == kept
    assert os.listdir(Path(cache.directory) / "tmp") == []


def test_a_miss_on_a_full_disk_evicts_and_is_served_from_the_cache(
    small_disk: SmallDisk,
) -> None:
    cache = ShardCache(str(small_disk.path / "cache"), 100 * MiB)
    for number in range(4):
        fill(cache, f"s3://bucket/old-{number}", 256 * 1024)
    cache.flush()
    small_disk.fill()
    url = "s3://bucket/new"
    with cache.fetch(obj(url), writer(payload(url, 200_000)), expected_size=200_000) as handle:
        assert handle.read() == payload(url, 200_000)
    assert cache.get(obj(url)) is not None
    stats = cache.stats()
    assert stats["evictions"] >= 1 and stats["cached_files"] < 5


def test_a_full_disk_with_nothing_to_evict_is_an_enospc_cache_full_error(
    small_disk: SmallDisk,
) -> None:
    directory = str(small_disk.path / "cache")
    cache = ShardCache(directory, 100 * MiB)
    small_disk.fill()
    url = "s3://bucket/new"
    with pytest.raises(CacheFullError) as raised:
        fill(cache, url, 200_000)
    assert raised.value.errno == errno.ENOSPC and directory in str(raised.value)
    assert cache.get(obj(url)) is None
    assert not [n for n in os.listdir(os.path.join(directory, "tmp")) if n.endswith(".part")]


def test_a_write_invalidation_on_a_full_disk_evicts_and_bumps_the_generation(
    small_disk: SmallDisk,
) -> None:
    cache = ShardCache(str(small_disk.path / "cache"), 100 * MiB)
    for number in range(3):
        fill(cache, f"s3://bucket/old-{number}", 256 * 1024)
    cache.flush()
    os.remove(small_disk.path / "cache" / "index.reserve")  # the hardest case
    small_disk.fill()
    before = cache.generation(obj("s3://bucket/old-2"))
    cache.discard(obj("s3://bucket/old-2"))
    assert cache.generation(obj("s3://bucket/old-2")) == before + 1
    assert cache.get(obj("s3://bucket/old-2")) is None


def test_eviction_of_many_entries_takes_one_index_transaction_per_batch(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(room, "EVICTION_BATCH", 10)
    cache = ShardCache(str(tmp_path / "cache"), 100 * 100)
    for number in range(100):
        fill(cache, f"s3://bucket/{number}", 100)
    cache.flush()
    transactions = []
    drop = Index.drop_least_recent

    def counted(self, limit, covering=None):
        dropped = drop(self, limit, covering)
        transactions.append(len(dropped))
        return dropped

    monkeypatch.setattr(Index, "drop_least_recent", counted)
    cache.size_limit = 50 * 100 + 100
    fill(cache, "s3://bucket/new", 100)
    assert transactions == [10, 10, 10, 10, 10] and cache.stats()["cached_files"] == 51


KEY = "ab" + "0" * 62


@pytest.fixture(autouse=True)
def no_due_batch_during_a_test(monkeypatch):
    """A batch is due after a minute, not a second: a loaded box must not write a batch
    while a test looks at what is pending."""
    monkeypatch.setattr(room, "FLUSH_INTERVAL_SECONDS", 60.0)


def _index(path) -> Index:
    path.mkdir(exist_ok=True)
    return Index(str(path), True, space_lock=contextlib.nullcontext, on_reset=lambda: None)


def test_hits_and_counts_gather_in_memory_and_one_flush_writes_them(tmp_path):
    index = _index(tmp_path)
    usage = Usage(index)
    for _ in range(3):
        usage.touch(KEY)
    usage.touch(KEY, count=False)  # a use, not counted as a hit
    usage.add("misses", 2)
    assert index.counters() == {}
    assert usage.pending_counts() == {"hits": 3, "misses": 2}
    usage.flush()
    assert index.counters() == {"hits": 3, "misses": 2}
    assert usage.pending_counts() == {}
    usage.add("misses")
    usage.flush()
    assert index.counters()["misses"] == 3  # added to, not replaced


def test_the_first_use_a_flush_interval_later_writes_the_batch_and_no_thread_before(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(room, "FLUSH_INTERVAL_SECONDS", 0.2)
    index = _index(tmp_path)
    usage = Usage(index)
    usage.touch(KEY)
    usage.add("misses")
    time.sleep(0.5)
    assert index.counters() == {}  # nothing written once the uses returned
    usage.add("misses")  # finds the batch due: written before it returns
    assert index.counters() == {"hits": 1, "misses": 2}
    assert usage.pending_counts() == {}
    usage.touch(KEY)
    assert usage.pending_counts() == {"hits": 1}  # a new batch


def test_without_a_writable_index_the_counts_stay_pending_for_the_report():
    usage = Usage(None)
    usage.touch(KEY)
    usage.add("bytes_downloaded", 100)
    usage.flush()
    assert usage.pending_counts() == {"hits": 1, "bytes_downloaded": 100}


def test_forget_drops_what_is_pending(tmp_path):
    index = _index(tmp_path)
    usage = Usage(index)
    usage.touch(KEY)
    usage.forget()
    usage.flush()
    assert usage.pending_counts() == {} and index.counters() == {}


def test_flush_all_writes_every_cache_of_the_process(tmp_path):
    indexes = [_index(tmp_path / name) for name in ("one", "two")]
    usages = [Usage(index) for index in indexes]
    for amount, usage in enumerate(usages, 1):
        usage.add("retries", amount)
    flush_all()
    assert [index.counters() for index in indexes] == [{"retries": 1}, {"retries": 2}]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_starts_with_nothing_pending():
    usage = Usage(None)
    usage.add("hits", 5)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report what it finds pending, then leave at once
        try:
            os.close(read)
            os.write(write, json.dumps(usage.pending_counts()).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        child = json.loads(pipe.read())
    os.waitpid(pid, 0)
    assert child == {} and usage.pending_counts() == {"hits": 5}


def test_stale_temp_file_of_a_dead_download_is_removed(cache: ShardCache) -> None:
    key = obj("s3://bucket/a").key
    tmp = Path(cache.directory) / "tmp"
    (tmp / f"{key}.999999.deadbeef.100.part").write_bytes(b"partial")
    other = obj("s3://bucket/other").key
    (tmp / f"{other}.999999.deadbeef.900.part").write_bytes(b"partial")
    # The stale 900-byte reservation of "other" must not keep this 100-byte file out.
    path = fill(cache, "s3://bucket/a")
    assert Path(path).read_bytes() == payload("s3://bucket/a", 100)
    assert os.listdir(tmp) == []


def test_published_file_left_without_index_entry_is_removed_on_next_fetch(
    cache: ShardCache,
) -> None:
    key = obj("s3://bucket/a").key
    orphan = Path(cache.directory) / "files" / key[:2] / f"{key}.deadbeef"
    orphan.parent.mkdir(parents=True, exist_ok=True)
    orphan.write_bytes(payload("s3://bucket/a", 100))
    path = fill(cache, "s3://bucket/a")
    assert not orphan.exists() and Path(path).exists()


def test_removing_every_data_file_leaves_the_names_the_cache_does_not_make(
    cache: ShardCache,
) -> None:
    made = Path(fill(cache, "s3://bucket/a"))
    theirs = [made.parent / "notes.txt", Path(cache.directory) / "files" / "README"]
    theirs.append(Path(cache.directory) / "tmp" / "draft.part")
    for path in theirs:
        path.write_bytes(b"keep")
    room.remove_data_files(cache.directory)
    assert not made.exists()
    assert all(path.exists() for path in theirs)
    assert sorted(room.foreign_names(cache.directory)) == sorted(map(str, theirs))
