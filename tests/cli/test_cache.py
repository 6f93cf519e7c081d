"""``fsspec-shards cache info|ls|clear``."""

from __future__ import annotations

from tests.cli.running import run_cli


def test_cache_info_ls_and_clear(dataset, cache):
    assert run_cli("prefetch", dataset.pattern, "-q", cache=cache).returncode == 0
    info = run_cli("cache", "info", cache=cache)
    assert info.returncode == 0, info.stderr
    assert "cached files" in info.stdout and str(cache) in info.stdout
    listing = run_cli("cache", "ls", "--cache-dir", str(cache), cache=cache)
    assert listing.returncode == 0, listing.stderr
    assert sorted(line.rsplit("/", 1)[1] for line in listing.stdout.splitlines()) == [
        path.name for path in dataset.shards
    ]
    cleared = run_cli("cache", "clear", cache=cache)
    assert cleared.returncode == 0 and "removed 4 files" in cleared.stdout
    assert run_cli("cache", "ls", cache=cache).stdout == ""
