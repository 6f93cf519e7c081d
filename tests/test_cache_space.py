"""A full disk under the cache (a real size-limited tmpfs): evict and retry once, then
stream; an error that still surfaces is an ENOSPC OSError naming the cache directory."""

from __future__ import annotations

import os
from pathlib import Path

import fsspec
import pytest

from fsspec_shards.storage.cache import ShardCache, store, trust
from fsspec_shards.units import MiB
from tests.cache_objects import SmallDisk, fill, obj, payload, small_disk

__all__ = ["small_disk"]


def test_a_cache_directory_first_used_on_a_full_disk_works_once_space_is_freed(
    small_disk: SmallDisk,
) -> None:
    directory = str(small_disk.path / "cache")
    small_disk.fill()
    with pytest.warns(UserWarning, match="reading without the cache"):
        first = ShardCache(directory, 100 * MiB)
    assert not first.writable
    small_disk.release()
    cache = ShardCache(directory, 100 * MiB)
    assert cache.writable
    path = fill(cache, "s3://bucket/a", 1000)
    assert Path(path).read_bytes() == payload("s3://bucket/a", 1000)


def test_a_half_made_directory_of_someone_else_is_still_refused(small_disk: SmallDisk) -> None:
    directory = small_disk.path / "cache"
    (directory / "files").mkdir(parents=True, mode=0o700)
    (directory / "files" / "theirs").write_bytes(b"x")
    with pytest.raises(trust.CacheDirectoryError, match="not a fsspec-shards cache"):
        ShardCache(str(directory), 100 * MiB)


def test_a_directory_an_earlier_version_left_half_made_is_adopted(tmp_path) -> None:
    directory = tmp_path / "cache"
    for name in ("files", "locks", "tmp"):
        (directory / name).mkdir(parents=True, mode=0o700)
    directory.chmod(0o700)
    cache = ShardCache(str(directory), 100 * MiB)
    assert cache.writable
    assert Path(fill(cache, "s3://bucket/a", 10)).read_bytes() == payload("s3://bucket/a", 10)


def test_a_full_disk_at_first_use_streams_then_the_same_cache_caches_once_space_is_freed(
    small_disk: SmallDisk, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store, "_SETUP_RETRY_SECONDS", 0.0)
    source = small_disk.path.parent / "data.tar"
    source.write_bytes(payload("data", 300_000))
    small_disk.fill()
    fs = fsspec.filesystem(
        "wds",
        skip_instance_cache=True,
        target_protocol="file",
        cache_dir=str(small_disk.path / "cache"),
    )
    with pytest.warns(UserWarning, match="disk is full"):
        assert fs.cat_file(str(source)) == payload("data", 300_000)
    small_disk.release()
    assert fs.cat_file(str(source)) == payload("data", 300_000)
    assert fs.cache_stats()["cached_files"] == 1


def test_a_fill_on_a_full_disk_with_nothing_to_evict_streams_with_the_warning(
    small_disk: SmallDisk,
) -> None:
    source = small_disk.path.parent / "data.tar"
    source.write_bytes(payload("data", 300_000))
    fs = fsspec.filesystem(
        "wds",
        skip_instance_cache=True,
        target_protocol="file",
        cache_dir=str(small_disk.path / "cache"),
    )
    assert fs.shard_cache.writable
    small_disk.fill()
    with pytest.warns(UserWarning, match="streaming it instead") as said:
        assert fs.cat_file(str(source)) == payload("data", 300_000)
    assert str(small_disk.path / "cache") in str(said[0].message)
    assert fs.cache_stats()["cached_files"] == 0


def test_an_index_first_opened_on_a_full_disk_reads_without_the_cache(
    small_disk: SmallDisk,
) -> None:
    directory = small_disk.path / "cache"
    ShardCache(str(directory), 100 * MiB)
    store._SHARED.clear()
    os.remove(directory / "cache.db")
    small_disk.fill()
    with pytest.warns(UserWarning, match=f"{directory}.*reading without the cache"):
        cache = ShardCache(str(directory), 100 * MiB)
    assert not cache.writable and cache.get(obj("s3://bucket/a")) is None
