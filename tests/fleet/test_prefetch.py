"""The prefetch chore: every shard into the cache once, counted by the caches' counters."""

from __future__ import annotations

import pytest

from fsspec_shards.fleet.errors import InputError
from fsspec_shards.fleet.executors import ThreadExecutor
from fsspec_shards.fleet.prefetch import prefetch_shards
from fsspec_shards.fleet.shards import shard_urls


def test_prefetch_downloads_each_shard_once_and_a_rerun_downloads_none(dataset, cache):
    urls = shard_urls(dataset.pattern, {})
    options = {"wds": {"cache_dir": str(cache)}}
    seen = []
    first = prefetch_shards(urls, options, ThreadExecutor(3), seen.append)
    total = sum(path.stat().st_size for path in dataset.shards)
    assert (first.fetched, first.bytes_fetched, first.failures) == (4, total, [])
    assert first.storage["misses"] == 4 and first.storage["bytes_downloaded"] == total
    assert sorted(fetched.url for fetched in seen) == sorted(urls)
    again = prefetch_shards(urls, options, ThreadExecutor(3))
    assert (again.fetched, again.storage["misses"], again.storage["bytes_downloaded"]) == (4, 0, 0)
    assert (
        again.summary()
        == "prefetched 4 of 4 shards: 0 downloaded (0 B), 4 already cached, 0 retries"
    )


def test_a_missing_shard_is_a_failure_of_the_report(dataset, cache, tmp_path):
    urls = shard_urls([str(dataset.shards[0]), str(tmp_path / "absent.tar")], {})
    report = prefetch_shards(urls, {"wds": {"cache_dir": str(cache)}}, ThreadExecutor(2))
    assert report.fetched == 1
    assert [shard for shard, _ in report.failures] == [str(tmp_path / "absent.tar")]
    assert report.failures[0][1].startswith("not found")


def test_prefetch_with_the_cache_off_or_without_wds_is_an_input_error(dataset, cache):
    urls = shard_urls(dataset.pattern, {})
    with pytest.raises(InputError, match="cache off"):
        prefetch_shards(urls, {"wds": {"cache": False}}, ThreadExecutor(1))
    with pytest.raises(InputError, match="needs wds:: URLs"):
        prefetch_shards([f"file://{dataset.shards[0]}"], {}, ThreadExecutor(1))
