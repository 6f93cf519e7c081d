"""A mass eviction's files deleted by a background thread, and lists a process left behind
taken over by the next cache opened on the directory."""

from __future__ import annotations

import os
from pathlib import Path

from fsspec_shards.storage.cache import ShardCache, deletion, store
from tests.cache_objects import as_a_new_process, fill, obj


def data_files(directory: Path) -> set[str]:
    return {p.name for p in (directory / "files").rglob("*") if p.is_file()}


def test_a_mass_eviction_leaves_its_files_to_the_deleting_thread(tmp_path: Path) -> None:
    directory = tmp_path / "cache"
    cache = ShardCache(str(directory), 200 * 100)
    for number in range(200):
        fill(cache, f"s3://bucket/{number}", 100)
    cache.flush()
    cache.size_limit = 100 * 100
    fill(cache, "s3://bucket/new", 100)
    cache.flush()  # waits for the deleting thread too
    assert cache.stats()["cached_files"] == 100
    assert len(data_files(directory)) == 100
    assert not [n for n in os.listdir(directory / "tmp") if deletion.is_list_name(n)]
    assert cache.get(obj("s3://bucket/new")) is not None


def test_a_list_left_by_a_killed_process_is_finished_by_the_next_cache(tmp_path: Path) -> None:
    directory = tmp_path / "cache"
    cache = ShardCache(str(directory), 10_000)
    paths = [fill(cache, f"s3://bucket/{number}", 100) for number in range(3)]
    cache.flush()
    dropped = cache._index.drop_least_recent(2)  # as an evicting process did before its kill
    listed = deletion.write_list(str(directory), [row.file for row in dropped])
    foreign = directory / "files" / "keep-me"
    foreign.write_bytes(b"not ours")
    with open(listed, "ab") as file:
        file.write(b"\nfiles/keep-me\n../../outside")
    as_a_new_process()
    ShardCache(str(directory), 10_000).flush()
    assert [os.path.exists(path) for path in paths] == [False, False, True]
    assert not os.path.exists(listed) and foreign.read_bytes() == b"not ours"


def test_a_list_another_process_works_through_is_left_to_it(tmp_path: Path) -> None:
    directory = tmp_path / "cache"
    cache = ShardCache(str(directory), 10_000)
    path = fill(cache, "s3://bucket/a", 100)
    cache.flush()
    dropped = cache._index.drop_least_recent(1)
    listed = deletion.write_list(str(directory), [row.file for row in dropped])
    lock = os.path.join(directory, "locks", os.path.basename(listed) + ".lock")
    with store.locks.hold(lock):
        deletion.delete_listed(str(directory), listed)
        assert os.path.exists(path) and os.path.exists(listed)
    deletion.delete_listed(str(directory), listed)
    assert not os.path.exists(path) and not os.path.exists(listed)
