"""``fsspec-shards demo``: the README's first command."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from tests.cli.running import TIMEOUT, run_cli

HIT_RATE = re.compile(r"cache hit rate +(\d+)% of shards \((\d+) of (\d+) cached already\)")
DOWNLOADED = re.compile(r"downloaded +\S+ \S+ \((\d+) shards?\)")


def assert_cache_lines_agree(report: str) -> None:
    """The hit rate, the shards cached and the shards downloaded tell one story: cached and
    downloaded add up to the shards read, and the rate is the cached share."""
    rate, cached, shards = map(int, HIT_RATE.search(report).groups())
    (downloaded,) = map(int, DOWNLOADED.search(report).groups())
    assert cached + downloaded == shards
    assert rate == round(100 * cached / shards)
    assert "hits/misses" not in report, "the cache's lookup counters are for --json"


def test_demo_writes_a_dataset_and_streams_it_cold_then_from_cache(tmp_path, cache):
    result = run_cli("demo", str(tmp_path / "demo"), "--quiet", cache=cache)
    assert result.returncode == 0, result.stderr
    passes = result.stdout.split("pass 2: from cache")
    assert "pass 1: cold cache" in passes[0]
    assert "samples             2000" in passes[0] and "samples             2000" in passes[1]
    assert "(13.2 MiB)" in passes[0].splitlines()[0], "the dataset's size, in binary units"
    assert "cache hit rate      0% of shards (0 of 8 cached already)" in passes[0]
    assert "downloaded          13.2 MiB (8 shards)" in passes[0]
    assert "cache hit rate      100% of shards (8 of 8 cached already)" in passes[1]
    assert "downloaded          0 B (0 shards)" in passes[1]
    for report in passes:
        assert_cache_lines_agree(report)
    assert "integrity failures  0" in passes[1]
    assert len(list((tmp_path / "demo").glob("demo-*.tar"))) == 8
    assert (tmp_path / "demo" / "SHA256SUMS").read_text().count("\n") == 8
    info = run_cli("cache", "info", "--json", cache=cache)
    counters = json.loads(info.stdout)
    # Pass 1 filled 8 shards (the reader reading what its prefetch filled is no extra hit),
    # pass 2 read the 8 from the cache: cache info tells what the demo printed.
    assert (counters["misses"], counters["hits"]) == (8, 8), counters


@pytest.mark.parametrize("variable", ["FSSPEC_SHARDS_CACHE", "WDS_CACHE"])
def test_demo_uses_the_cache_the_environment_names(variable, tmp_path):
    env = {key: value for key, value in os.environ.items() if key not in ("WDS_CACHE",)}
    env.pop("FSSPEC_SHARDS_CACHE", None)
    env[variable] = str(tmp_path / "env-cache")
    result = subprocess.run(
        [sys.executable, "-m", "fsspec_shards", "demo", str(tmp_path / "demo"), "--shards", "2",
         "--samples", "5", "-q"],
        capture_output=True, text=True, timeout=TIMEOUT, env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "cache hit rate      0% of shards" in result.stdout.split("pass 2")[0]
    assert "cache hit rate      100% of shards" in result.stdout.split("pass 2")[1]
    assert f"--cache-dir {tmp_path / 'env-cache'}" in result.stdout
    assert any((tmp_path / "env-cache").iterdir())
    assert not (tmp_path / "demo" / "cache").exists()
