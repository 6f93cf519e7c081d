"""The stream chore: one pass over a dataset, its cache numbers per shard."""

from __future__ import annotations

from fsspec_shards.fleet.shards import shard_urls
from fsspec_shards.fleet.stream import PassReport, stream_pass

ONE_PROCESS = {"split_by_node": False, "split_by_worker": False, "shuffle_shards": False}


def test_a_cold_pass_with_prefetch_is_0_percent_and_counts_no_hit(dataset, cache):
    urls = shard_urls(dataset.pattern, {})
    options = {"wds": {"cache_dir": str(cache)}}
    kwargs = {**ONE_PROCESS, "prefetch": 2}
    cold = stream_pass("cold", urls, options, kwargs)
    assert (cold.samples, cold.shards, cold.downloaded_shards) == (120, 4, 4)
    # The reader opening what the prefetcher fetched is the same lookup: no hit of its own.
    assert (cold.storage["misses"], cold.storage["hits"]) == (4, 0)
    assert cold.hit_fraction() == 0.0
    assert cold.shard_hit_rate() == "0% of shards (0 of 4 cached already)"
    warm = stream_pass("warm", urls, options, kwargs)
    assert (warm.downloaded_shards, warm.hit_fraction()) == (0, 1.0)
    assert warm.shard_hit_rate() == "100% of shards (4 of 4 cached already)"
    assert (warm.storage["misses"], warm.storage["hits"]) == (0, 4)
    assert warm.downloaded() == "0 B (0 shards)"


def test_advance_is_called_per_sample_and_the_limit_stops_the_pass(dataset, cache):
    urls = shard_urls(dataset.pattern, {})
    calls = []
    report = stream_pass(
        "limited",
        urls,
        {"wds": {"cache": False}},
        ONE_PROCESS,
        limit=45,
        advance=lambda: calls.append(1),
    )
    assert report.samples == 45 == len(calls)
    assert report.shard_hit_rate() == "cache off" and report.as_dict()["downloaded_shards"] is None


def test_the_report_lines_tell_one_story_in_binary_units():
    report = PassReport("t", shards=8, samples=2000, payload_bytes=3 * 1024**2, seconds=1.0)
    report.storage.update(hits=7, misses=8, bytes_downloaded=138_800_000)
    lines = dict(line.strip().split(None, 1) for line in report.lines()[1:3])
    text = "\n".join(report.lines())
    assert "cache hit rate      0% of shards (0 of 8 cached already)" in text
    assert "downloaded          132.4 MiB (8 shards)" in text
    assert "MiB/s               3.0" in text and "MB/s" not in text
    assert "hits" not in text
    assert lines == {"samples": "2000", "time": "1.00 s"}
