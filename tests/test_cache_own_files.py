"""The files a cache made (storage/cache/own_files.py): leftovers of killed processes and
stale temp files removed, names the cache does not make left alone."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fsspec_shards.storage.cache import ShardCache, own_files
from tests.cache_objects import (
    fill,
    obj,
    payload,
)


@pytest.fixture
def cache(tmp_path: Path) -> ShardCache:
    return ShardCache(str(tmp_path / "cache"), 1000)


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
    own_files.remove_data_files(cache.directory)
    assert not made.exists()
    assert all(path.exists() for path in theirs)
    assert sorted(own_files.foreign_names(cache.directory)) == sorted(map(str, theirs))
