"""``fsspec-shards prefetch``: filling the cache, resumably."""

from __future__ import annotations

from tests.cli.running import run_cli


def test_prefetch_fills_the_cache_and_skips_cached_shards_on_rerun(dataset, cache):
    first = run_cli("prefetch", dataset.pattern, "--cache-dir", str(cache), "-j", "3", cache=cache)
    assert first.returncode == 0, first.stderr
    assert "prefetched 4 of 4 shards: 4 downloaded" in first.stdout
    second = run_cli("prefetch", dataset.pattern, "--cache-dir", str(cache), "-q", cache=cache)
    assert second.returncode == 0, second.stderr
    assert "0 downloaded" in second.stdout and "4 already cached" in second.stdout
