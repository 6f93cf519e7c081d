"""Unit tests of ShardCache: counting, least-recently-used order, self-healing, hits without
write transactions, and write generations (the size cap: test_cache_room.py; failure clean-up:
test_cache_publication.py)."""

from __future__ import annotations

import multiprocessing
import os
import stat
import threading
import time
from pathlib import Path

import pytest

from fsspec_shards.storage.backends import KEY_FORMAT
from fsspec_shards.storage.cache import ShardCache, WrittenWhileReadingError, layout, room
from tests.cache_objects import (
    as_a_new_process,
    fill,
    index_query,
    index_value,
    indexed_entries,
    obj,
    payload,
    writer,
)


def cached_urls(cache: ShardCache) -> list[str]:
    return [entry["url"] for entry in cache.entries()]


def index_header_change_counter(cache: ShardCache) -> bytes:
    """SQLite's file change counter (header bytes 24-27): it moves with every write."""
    with open(os.path.join(cache.directory, layout.INDEX), "rb") as file:
        return file.read(28)[24:28]


def hits_in_index(cache: ShardCache):
    return index_value(cache.directory, "counter:hits")


@pytest.fixture
def cache(tmp_path: Path) -> ShardCache:
    return ShardCache(str(tmp_path / "cache"), 1000)


@pytest.fixture
def slow_flushes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Batched usage waits an hour: only explicit flushes (and exits) write it."""
    monkeypatch.setattr(room, "FLUSH_INTERVAL_SECONDS", 3600.0)


def test_fetch_returns_whole_file_and_counts_a_miss_then_hits(cache: ShardCache) -> None:
    url = "s3://bucket/a.tar"
    path = fill(cache, url)
    assert Path(path).read_bytes() == payload(url, 100)
    assert cache.get(obj(url)) == path
    with cache.fetch(obj(url), writer(b"never written")) as handle:
        assert handle.name == path and handle.read() == payload(url, 100)
    stats = cache.stats()
    assert (stats["misses"], stats["hits"]) == (1, 2)
    assert (stats["cached_files"], stats["cached_bytes"]) == (1, 100)


def test_get_of_uncached_object_returns_none_and_counts_nothing(cache: ShardCache) -> None:
    assert cache.get(obj("s3://bucket/absent")) is None
    assert cache.stats()["misses"] == 0 and cache.stats()["hits"] == 0


def test_hits_write_nothing_to_the_index_until_the_batch_is_flushed(
    cache: ShardCache, slow_flushes: None
) -> None:
    url = "s3://bucket/a.tar"
    fill(cache, url)
    cache.flush()
    before = index_header_change_counter(cache)
    [(_, _, accessed_before)] = indexed_entries(cache.directory)
    for _ in range(200):
        with cache.open(obj(url)) as handle:
            assert handle.read(4) == payload(url, 4)
    assert index_header_change_counter(cache) == before
    cache.flush()
    assert index_header_change_counter(cache) != before
    [(_, _, accessed_after)] = indexed_entries(cache.directory)
    assert accessed_after > accessed_before
    assert hits_in_index(cache) == 200


def test_batched_hits_reach_the_index_with_the_first_use_a_flush_interval_later(
    cache: ShardCache, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Written by a use, never by a thread of its own after the calls returned (the caller
    may be removing the directory by then)."""
    monkeypatch.setattr(room, "FLUSH_INTERVAL_SECONDS", 0.2)
    url = "s3://bucket/a.tar"
    fill(cache, url)
    cache.flush()
    before = index_header_change_counter(cache)
    cache.get(obj(url))
    time.sleep(0.6)
    assert index_header_change_counter(cache) == before
    cache.get(obj(url))  # finds the batch due: writes it before it returns
    assert hits_in_index(cache) == 2


def _hit_in_child(directory: str, url: str, results) -> None:
    cache = ShardCache(directory, 1000)
    results.put(cache.get(obj(url)) is not None)


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_hits_of_a_child_process_are_written_when_it_exits(
    cache: ShardCache, slow_flushes: None, start_method: str
) -> None:
    """A forked worker exits without atexit handlers (multiprocessing's own exit runs)."""
    url = "s3://bucket/a.tar"
    fill(cache, url)
    context = multiprocessing.get_context(start_method)
    results = context.Queue()
    children = [
        context.Process(target=_hit_in_child, args=(cache.directory, url, results))
        for _ in range(3)
    ]
    for child in children:
        child.start()
    assert [results.get(timeout=120) for _ in children] == [True] * 3
    for child in children:
        child.join(120)
        assert child.exitcode == 0
    assert cache.stats()["hits"] == 3


@pytest.mark.parametrize("damage", ["missing", "short", "directory"])
def test_entry_whose_file_is_missing_short_or_not_a_file_is_a_miss_and_heals(
    cache: ShardCache, damage: str
) -> None:
    url = "s3://bucket/a"
    path = Path(fill(cache, url))
    path.unlink()
    if damage == "short":
        path.write_bytes(b"short")
    elif damage == "directory":
        path.mkdir()
    assert cache.open(obj(url)) is None
    assert cache.stats()["cached_files"] == 0
    assert Path(fill(cache, url)).read_bytes() == payload(url, 100)
    assert cache.get(obj(url)) is not None
    if damage == "directory":
        assert path.is_dir()  # not a file the cache made: left where it is


def test_clear_removes_files_entries_and_counters(cache: ShardCache) -> None:
    paths = [fill(cache, f"s3://bucket/{n}") for n in "abc"]
    cache.clear()
    assert cache.entries() == []
    assert not any(os.path.exists(p) for p in paths)
    stats = cache.stats()
    assert (stats["cached_files"], stats["cached_bytes"], stats["misses"]) == (0, 0, 0)


def test_entries_list_urls_sizes_and_times_least_recent_first(cache: ShardCache) -> None:
    fill(cache, "s3://bucket/a", 10)
    fill(cache, "gs://bucket/b", 20)
    entries = cache.entries()
    assert [(e["url"], e["size"]) for e in entries] == [
        ("s3://bucket/a", 10),
        ("gs://bucket/b", 20),
    ]
    assert all(e["stored_at"] <= e["accessed_at"] for e in entries)


def test_stats_report_every_required_counter(cache: ShardCache) -> None:
    cache.incr("retries", 3)
    cache.incr("bytes_downloaded", 1234)
    stats = cache.stats()
    for name in ("hits", "misses", "bytes_downloaded", "retries", "integrity_failures"):
        assert name in stats
    assert (stats["retries"], stats["bytes_downloaded"]) == (3, 1234)
    assert stats["evictions"] == 0 and stats["size_limit"] == 1000
    assert stats["directory"] == cache.directory


def test_counters_are_shared_by_two_instances_on_one_directory(tmp_path: Path) -> None:
    one = ShardCache(str(tmp_path / "c"), 1000)
    two = ShardCache(str(tmp_path / "c"), 1000)
    one.incr("retries")
    two.incr("retries")
    fill(one, "s3://bucket/a")
    assert two.get(obj("s3://bucket/a")) is not None
    assert one.stats()["retries"] == 2 and one.stats()["hits"] == 1


def test_objects_are_kept_apart_by_their_keys(cache: ShardCache) -> None:
    urls = ["s3://one/train-0000.tar", "s3://two/train-0000.tar", "gs://one/train-0000.tar"]
    for url in urls:
        fill(cache, url)
    for url in urls:
        assert Path(cache.get(obj(url))).read_bytes() == payload(url, 100)


def test_a_key_that_is_not_a_digest_is_refused(cache: ShardCache) -> None:
    from fsspec_shards.storage.backends import ObjectId

    with pytest.raises(ValueError, match="not a cache key"):
        cache.fetch(ObjectId("../../etc/passwd", "x"), writer(b"x"))


def test_no_secret_reaches_any_file_under_the_cache(cache: ShardCache) -> None:
    import fsspec

    from fsspec_shards.storage.backends import object_id

    http = fsspec.filesystem("https")
    signed = "https://user:SECRETPW@host/bucket/a.tar?X-Amz-Signature=SECRETSIG&token=SECRETTOK"
    identity = object_id(http, signed)
    cache.fetch(identity, writer(b"b", {"source": signed, "identity": "etag-1"})).close()
    cache.flush()
    assert "REDACTED" in cache.entries()[0]["url"]
    recorded = repr(cache.entries()) + repr(cache.metadata(identity)) + repr(cache.stats())
    names = [n for _, dirs, files in os.walk(cache.directory) for n in dirs + files]
    contents = b"".join(p.read_bytes() for p in Path(cache.directory).rglob("*") if p.is_file())
    for secret in ("SECRETSIG", "SECRETTOK", "SECRETPW"):
        assert not any(secret in n for n in names)
        assert secret not in recorded
        assert secret.encode() not in contents


def test_metadata_returns_download_result_with_times_and_validation(cache: ShardCache) -> None:
    url = "s3://bucket/a"
    cache.fetch(obj(url), writer(b"x" * 5, {"identity": "etag-7", "checksum": "md5:00"})).close()
    meta = cache.metadata(obj(url))
    assert meta["identity"] == "etag-7" and meta["checksum"] == "md5:00" and meta["size"] == 5
    assert meta["validated_at"] == meta["stored_at"]
    time.sleep(0.01)
    cache.touch_validated(obj(url))
    assert cache.metadata(obj(url))["validated_at"] > meta["stored_at"]
    assert cache.metadata(obj("s3://bucket/none")) is None


def test_discard_drops_entry_and_file(cache: ShardCache) -> None:
    path = fill(cache, "s3://bucket/a")
    cache.discard(obj("s3://bucket/a"))
    assert cache.get(obj("s3://bucket/a")) is None and not os.path.exists(path)


def test_a_fetch_whose_object_was_written_since_it_looked_does_not_download(
    cache: ShardCache,
) -> None:
    url = "s3://bucket/a"
    since = cache.generation(obj(url))
    cache.discard(obj(url))  # a write through wds
    calls = []
    with pytest.raises(WrittenWhileReadingError, match="s3://bucket/a"):
        cache.fetch(obj(url), lambda f: calls.append(f) or {}, since=since)
    assert calls == []
    with cache.fetch(obj(url), writer(b"new"), since=cache.generation(obj(url))) as handle:
        assert handle.read() == b"new"
    assert cache.get(obj(url)) is not None


def test_no_interleaving_of_writes_and_downloads_leaves_an_old_version_cached(
    cache: ShardCache,
) -> None:
    """Readers fetch while a writer bumps the version over and over; after the last write,
    the cached copy (if any) is the last version."""
    url = "s3://bucket/racy"
    version = [0]
    stop = threading.Event()
    errors = []

    def read() -> None:
        while not stop.is_set():
            since = cache.generation(obj(url))
            data = f"version {version[0]}".encode()  # what the backend says right now
            try:
                cache.fetch(obj(url), writer(data), since=since).close()
            except WrittenWhileReadingError:
                pass
            except BaseException as error:  # noqa: BLE001 - reported to the test
                errors.append(error)

    readers = [threading.Thread(target=read) for _ in range(3)]
    for thread in readers:
        thread.start()
    for number in range(1, 60):
        version[0] = number  # the backend changes ...
        cache.discard(obj(url))  # ... then the write drops the cached copy
        time.sleep(0.002)
    stop.set()
    for thread in readers:
        thread.join(60)
    assert errors == []
    handle = cache.open(obj(url))
    if handle is not None:
        with handle:
            assert handle.read() == b"version 59"


def test_open_file_stays_readable_after_eviction(tmp_path: Path) -> None:
    cache = ShardCache(str(tmp_path / "c"), 200)
    url = "s3://bucket/a"
    fill(cache, url)
    with cache.open(obj(url)) as reader:
        head = reader.read(10)
        fill(cache, "s3://bucket/b")
        fill(cache, "s3://bucket/c")
        assert cache.get(obj(url)) is None
        assert head + reader.read() == payload(url, 100)


def test_open_returns_a_readable_handle_or_none(cache: ShardCache) -> None:
    assert cache.open(obj("s3://bucket/a")) is None
    fill(cache, "s3://bucket/a")
    with cache.open(obj("s3://bucket/a")) as reader:
        assert reader.read() == payload("s3://bucket/a", 100)


def test_cache_directory_and_its_files_are_private(tmp_path: Path) -> None:
    cache = ShardCache(str(tmp_path / "new" / "cache"), 1000)
    path = fill(cache, "s3://bucket/a")
    root = Path(cache.directory)
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o400
    for name in (layout.INDEX, layout.MARKER):
        assert stat.S_IMODE((root / name).stat().st_mode) == 0o600, name
    for lock in (root / "locks").iterdir():
        assert stat.S_IMODE(lock.stat().st_mode) == 0o600, lock
    for sub in layout.SUBDIRECTORIES:
        assert stat.S_IMODE((root / sub).stat().st_mode) == 0o700, sub


def test_cache_pickles_to_the_same_directory(cache: ShardCache) -> None:
    import pickle

    fill(cache, "s3://bucket/a")
    clone = pickle.loads(pickle.dumps(cache))
    assert clone.get(obj("s3://bucket/a")) == cache.get(obj("s3://bucket/a"))


def test_threads_fetching_one_object_download_it_once(cache: ShardCache) -> None:
    calls = []
    barrier = threading.Barrier(6)

    def download(file) -> dict:
        calls.append(1)
        file.write(payload("shared", 100))
        return {}

    results = []

    def reader() -> None:
        barrier.wait(60)
        with cache.fetch(obj("s3://bucket/shared"), download, 100) as handle:
            results.append(handle.read())

    threads = [threading.Thread(target=reader) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(calls) == 1
    assert results == [payload("shared", 100)] * 6


def test_verbose_cache_logs_downloads_and_evictions_at_info_without_secrets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("WDS_VERBOSE_CACHE", "1")
    cache = ShardCache(str(tmp_path / "c"), 100)
    with caplog.at_level("INFO", logger="fsspec_shards.storage.cache"):
        fill(cache, "https://host/a.tar?X-Amz-Signature=SECRETSIG")
        fill(cache, "https://host/b.tar?X-Amz-Signature=SECRETSIG")
    infos = [r.getMessage() for r in caplog.records if r.levelname == "INFO"]
    assert any(m.startswith("cached https://host/a.tar") for m in infos)
    assert any(m.startswith("evicted https://host/a.tar") for m in infos)
    assert not any("SECRETSIG" in m for m in infos)


def test_verbose_cache_adds_no_handler_and_sets_no_level(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A library adds no logging handler: showing INFO records is the application's choice."""
    import logging

    monkeypatch.setenv("WDS_VERBOSE_CACHE", "1")
    cache_logger = logging.getLogger("fsspec_shards.storage.cache")
    monkeypatch.setattr(cache_logger, "handlers", [])
    monkeypatch.setattr(cache_logger, "level", logging.NOTSET)
    ShardCache(str(tmp_path / "c"), 100)
    assert cache_logger.handlers == [] and cache_logger.level == logging.NOTSET


def test_entries_of_another_key_format_are_dropped_with_their_files(tmp_path: Path) -> None:
    cache = ShardCache(str(tmp_path / "c"), 1000)
    path = fill(cache, "s3://bucket/a")
    index_query(
        cache.directory, "UPDATE Cache SET value = 'fsspec-shards-key-v1' WHERE key = 'key_format'"
    )
    as_a_new_process()
    again = ShardCache(str(tmp_path / "c"), 1000)
    assert again.entries() == [] and not os.path.exists(path)
    assert index_value(again.directory, "key_format") == KEY_FORMAT


def _discard_and_publish_in_child(directory: str, gone: str, new: str) -> None:
    cache = ShardCache(directory, 1000)
    cache.discard(obj(gone))
    cache.fetch(obj(new), writer(b"published by the child")).close()


def test_a_hit_never_serves_what_another_process_dropped_or_misses_what_it_published(
    cache: ShardCache,
) -> None:
    """Hits answer from memory while the index file is unchanged: any write, in any
    process, must be seen by the next lookup."""
    fill(cache, "s3://bucket/gone")
    for _ in range(3):  # remembered answers: a hit, and a miss
        assert cache.get(obj("s3://bucket/gone")) is not None
        assert cache.get(obj("s3://bucket/new")) is None
    child = multiprocessing.get_context("spawn").Process(
        target=_discard_and_publish_in_child,
        args=(cache.directory, "s3://bucket/gone", "s3://bucket/new"),
    )
    child.start()
    child.join(120)
    assert child.exitcode == 0
    assert cache.open(obj("s3://bucket/gone")) is None
    with cache.open(obj("s3://bucket/new")) as handle:
        assert handle.read() == b"published by the child"


def _use_cache_in_child(directory: str, url: str) -> None:
    import warnings

    warnings.simplefilter("ignore")
    cache = ShardCache(directory, 1000)
    cache.get(obj("s3://bucket/old"))  # finds the index corrupt: set aside, started empty
    cache.fetch(obj(url), writer(b"after the rebuild")).close()


def test_an_index_rebuilt_by_another_process_is_the_one_this_process_uses_next(
    cache: ShardCache,
) -> None:
    fill(cache, "s3://bucket/old")
    assert cache.get(obj("s3://bucket/old")) is not None
    cache.flush()  # nothing pending: this process does not touch the index until the child ran
    with open(os.path.join(cache.directory, layout.INDEX), "r+b") as index:
        index.write(b"not a database any more" * 200)
    child = multiprocessing.get_context("spawn").Process(
        target=_use_cache_in_child, args=(cache.directory, "s3://bucket/new")
    )
    child.start()
    child.join(120)
    assert child.exitcode == 0
    assert cache.open(obj("s3://bucket/old")) is None
    with cache.open(obj("s3://bucket/new")) as handle:
        assert handle.read() == b"after the rebuild"
    fill(cache, "s3://bucket/third")
    assert sorted(e["url"] for e in cache.entries()) == ["s3://bucket/new", "s3://bucket/third"]


def test_least_recently_used_file_is_evicted_first_and_touching_protects_it(
    tmp_path: Path, slow_flushes: None
) -> None:
    cache = ShardCache(str(tmp_path / "c"), 300)
    for name in ("a", "b", "c"):
        fill(cache, f"s3://bucket/{name}")
    assert cache.get(obj("s3://bucket/a")) is not None  # batched, not yet written
    fill(cache, "s3://bucket/d")  # its eviction writes this process's batch first
    assert cached_urls(cache) == ["s3://bucket/c", "s3://bucket/a", "s3://bucket/d"]
    assert cache.get(obj("s3://bucket/b")) is None
    assert cache.stats()["evictions"] == 1
