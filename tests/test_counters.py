"""The cache counters are named once, and every cache reports each of them."""

from __future__ import annotations

import fsspec

from fsspec_shards import counters
from fsspec_shards.storage import filesystem
from fsspec_shards.storage.cache import store


def test_the_cache_and_the_filesystem_count_by_the_one_definition():
    assert store.COUNTERS is counters.COUNTERS is filesystem.COUNTERS


def test_every_counter_is_reported_with_the_cache_on_and_off(tmp_path):
    path = tmp_path / "a.bin"
    path.write_bytes(b"x" * 100)
    for cache in (True, False):
        fs = fsspec.filesystem(
            "wds", target_protocol="file", cache=cache, cache_dir=str(tmp_path / "c")
        )
        fs.cat_file(str(path))
        stats = fs.cache_stats()
        assert set(counters.COUNTERS) <= set(stats)
        assert stats["bytes_downloaded"] >= 100
