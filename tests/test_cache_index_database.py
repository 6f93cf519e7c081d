"""The index's database (storage/cache/index_database.py): every commit synced on a rollback
journal, no fork inside a transaction, and a corrupt, unmade or missing index replaced or
read as an empty cache.

Its rows: only what the index wrote reads as a record,
values stay inline in the database, and a pending row names the file it is about.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import fsspec
import pytest
from diskcache.core import MODE_RAW

from fsspec_shards.storage.cache import (
    CacheWarning,
    ReadOnlyCacheError,
    ShardCache,
    layout,
)
from fsspec_shards.storage.cache.index import Index
from fsspec_shards.storage.cache.index_database import (
    Entry,
    IndexDisk,
    file_and_size,
    pending_boot,
    read_record,
)
from tests import cache_objects
from tests.cache_objects import as_a_new_process, fill, obj, payload, writer

read_only_view = cache_objects.read_only_view  # the fixture, for the tests below


@pytest.fixture(autouse=True)
def fresh_process_state() -> Iterator[None]:
    """Each test opens its caches as a new process would (no shared index from before)."""
    as_a_new_process()
    yield
    as_a_new_process()


@pytest.fixture
def cache(tmp_path: Path) -> ShardCache:
    return ShardCache(str(tmp_path / "cache"), 1000)


@pytest.fixture
def index(tmp_path) -> Index:
    return Index(str(tmp_path), True, space_lock=contextlib.nullcontext, on_reset=lambda: None)


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_a_corrupt_index_is_moved_aside_and_the_cache_starts_empty(
    tmp_path: Path, damage: str
) -> None:
    cache = ShardCache(str(tmp_path / "cache"), 1000)
    old = Path(fill(cache, "s3://bucket/a"))
    as_a_new_process()
    index = Path(cache.directory) / layout.INDEX
    if damage == "garbage":
        index.write_bytes(b"this is not a database" * 100)
    else:
        content = index.read_bytes()
        index.write_bytes(content[:100] + b"\0" * (len(content) - 100))
    with pytest.warns(CacheWarning) as caught:
        cache = ShardCache(cache.directory, 1000)
        assert cache.open(obj("s3://bucket/a")) is None
    assert any(str(index) in str(w.message) for w in caught)
    assert (Path(cache.directory) / f"{layout.INDEX}.corrupt").exists()
    assert not old.exists()  # the files the lost index described are gone with it
    assert Path(fill(cache, "s3://bucket/a")).read_bytes() == payload("s3://bucket/a", 100)
    assert cache.stats()["cached_files"] == 1


def test_an_index_corrupted_while_in_use_is_replaced_at_the_next_operation(
    tmp_path: Path,
) -> None:
    cache = ShardCache(str(tmp_path / "cache"), 1000)
    fill(cache, "s3://bucket/a")
    Path(cache.directory, layout.INDEX).write_bytes(b"\xff" * 8192)
    with pytest.warns(CacheWarning, match="corrupt"):
        assert cache.open(obj("s3://bucket/a")) is None
    assert Path(fill(cache, "s3://bucket/b")).read_bytes() == payload("s3://bucket/b", 100)


def test_a_corrupt_index_on_a_read_only_cache_streams_with_a_warning(
    tmp_path: Path, read_only_view
) -> None:
    cache = ShardCache(str(tmp_path / "cache"), 1000)
    fill(cache, "s3://bucket/a")
    as_a_new_process()
    Path(cache.directory, layout.INDEX).write_bytes(b"not a database" * 500)
    view = read_only_view(Path(cache.directory))
    with pytest.warns(CacheWarning) as caught:
        broken = ShardCache(str(view), 1000)
        assert broken.open(obj("s3://bucket/a")) is None
        with pytest.raises(ReadOnlyCacheError):
            broken.fetch(obj("s3://bucket/a"), writer(b"x"))
    assert any("corrupt" in str(w.message) and str(view) in str(w.message) for w in caught)


def test_a_read_only_cache_whose_index_was_never_set_up_is_an_empty_one(
    tmp_path: Path, read_only_view
) -> None:
    source = tmp_path / "a.bin"
    source.write_bytes(payload("a", 2000))
    cache = ShardCache(str(tmp_path / "cache"), 1000)
    os.truncate(os.path.join(cache.directory, layout.INDEX), 0)  # made, killed before set-up
    as_a_new_process()
    view = read_only_view(Path(cache.directory))
    fs = fsspec.filesystem(
        "wds", target_protocol="file", cache_dir=str(view), skip_instance_cache=True
    )
    with pytest.warns(CacheWarning, match="read-only"):
        assert fs.cat_file(str(source)) == payload("a", 2000)
    assert fs.cache_stats()["cached_files"] == 0 and fs.shard_cache.entries() == []


def test_a_read_only_cache_without_an_index_is_an_empty_one(tmp_path: Path, read_only_view) -> None:
    source = tmp_path / "a.bin"
    source.write_bytes(payload("a", 2000))
    cache = ShardCache(str(tmp_path / "cache"), 1000)
    os.remove(os.path.join(cache.directory, layout.INDEX))
    as_a_new_process()
    view = read_only_view(Path(cache.directory))
    fs = fsspec.filesystem(
        "wds", target_protocol="file", cache_dir=str(view), skip_instance_cache=True
    )
    with pytest.warns(CacheWarning, match="read-only"):
        assert fs.cat_file(str(source)) == payload("a", 2000)
    assert fs.cache_stats()["cached_files"] == 0


def test_every_commit_is_synced_full_on_a_rollback_journal(index, tmp_path):
    since = index.generation("k")
    index.publish("k", "k.bin", 10, "s3://b/k", {}, since)
    # diskcache's connection (Database.writable_cache, diskcache.Cache._con): the one that commits
    connection = index.database.writable_cache()._con
    assert connection.execute("PRAGMA synchronous").fetchone() == (2,)  # FULL
    assert connection.execute("PRAGMA journal_mode").fetchone() == ("delete",)
    # and what every other process opening the index applies to its own connection
    with sqlite3.connect(f"file:{tmp_path / 'cache.db'}?mode=ro", uri=True) as reader:
        setting = reader.execute(
            "SELECT value FROM Settings WHERE key = 'sqlite_synchronous'"
        ).fetchone()
    assert setting == (2,)


def _fetch_in_forked_child(directory: str, results) -> None:
    try:
        fill(ShardCache(directory, 1000), "s3://bucket/child")
        results.put("ok")
    except BaseException as error:  # noqa: BLE001 - reported to the parent
        results.put(repr(error))


def test_a_child_forked_while_a_thread_writes_the_index_can_use_the_cache(
    cache: ShardCache,
) -> None:
    """DataLoader workers fork while a prefetch thread updates the cache: sqlite's lock state
    of a write in flight must not be inherited (the child saw "database is locked" forever)."""
    inside = threading.Event()

    def hold_a_write(store) -> None:
        inside.set()
        threading.Event().wait(2.0)

    writer_thread = threading.Thread(target=lambda: cache._index.database.write(hold_a_write))
    writer_thread.start()
    assert inside.wait(60)
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    child = context.Process(target=_fetch_in_forked_child, args=(cache.directory, results))
    child.start()
    try:
        assert results.get(timeout=120) == "ok"
    finally:
        child.join(60)
        writer_thread.join(60)
    assert cache.get(obj("s3://bucket/child")) is not None


def test_a_record_is_what_the_index_wrote_and_anything_else_is_none():
    record = {"file": "files/ab/x", "size": 3, "shown": "s3://b/x"}
    assert read_record(Entry(record).text) == record
    for planted in ([1], b"{}", "not json", '{"file": 1, "size": 3}', '{"file": "f", "size": "3"}'):
        assert read_record(planted) is None


def test_values_stay_inside_the_database_and_an_entry_carries_its_size():
    disk = IndexDisk.__new__(IndexDisk)  # store() and fetch() use no state
    entry = Entry({"file": "files/ab/x", "size": 42})
    assert disk.store(entry, False) == (42, MODE_RAW, None, entry.text)
    assert disk.store(7, False) == (0, MODE_RAW, None, 7)
    with pytest.raises(TypeError):
        disk.store(object(), False)
    assert disk.fetch(MODE_RAW, None, "text", False) == "text"
    assert disk.fetch(4, "../../etc/passwd", None, False) is None  # a pickled row: never read


def test_a_pending_row_counts_only_for_the_file_it_names():
    value = Entry({"file": "files/ab/x", "size": 3}).text
    pending = json.dumps({"file": "files/ab/x", "boot": "b1"})
    assert file_and_size(value, pending) == ("files/ab/x", 3, "b1")
    assert pending_boot(pending, "files/ab/other") is None
    assert file_and_size(value, None) == ("files/ab/x", 3, None)
    assert file_and_size("planted", pending) is None
