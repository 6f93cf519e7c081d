"""What every chore report shares: byte counts in binary units, the counters, shard names."""

from __future__ import annotations

import fsspec

from fsspec_shards.config import DEFAULT_CACHE_SIZE, DEFAULT_MAX_MEMBER_SIZE
from fsspec_shards.counters import COUNTERS
from fsspec_shards.fleet.report import format_bytes, shown, storage_stats


def test_sizes_are_binary_and_the_defaults_read_as_they_are_documented():
    assert format_bytes(DEFAULT_CACHE_SIZE) == "20 GiB"
    assert format_bytes(DEFAULT_MAX_MEMBER_SIZE) == "1 GiB"
    assert format_bytes(0) == "0 B" and format_bytes(1023) == "1023 B"
    assert format_bytes(1536) == "1.5 KiB"
    assert format_bytes(138_800_000) == "132.4 MiB"
    assert format_bytes(5 * 1024**5) == "5 PiB" and format_bytes(3 * 1024**6) == "3072 PiB"


def test_storage_stats_are_the_cache_counters_and_zeros_elsewhere(tmp_path):
    wds = fsspec.filesystem("wds", target_protocol="file", cache_dir=str(tmp_path / "c"))
    assert tuple(storage_stats(wds)) == COUNTERS
    assert storage_stats(fsspec.filesystem("file")) == dict.fromkeys(COUNTERS, 0)


def test_shards_are_shown_plain_and_redacted():
    assert shown("wds::file:///d/a.tar") == "/d/a.tar"
    assert shown("wds::https://h/a.tar?sig=s3cr3t") == "https://h/a.tar?sig=REDACTED"
