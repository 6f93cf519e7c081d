"""ShardSource: sample ranges found by header scans, the error policy, the sample dicts."""

from __future__ import annotations

import logging
import os

import pytest
from fsspec.implementations.local import LocalFileSystem

from fsspec_shards.iteration.lengths import SampleCountError
from fsspec_shards.iteration.order import Consumer
from fsspec_shards.iteration.plan import Segment
from fsspec_shards.iteration.reader import ShardReader
from fsspec_shards.iteration.source import ShardSource
from tests.shardmaker import write_shards


@pytest.fixture
def source(tmp_path):
    return ShardSource(write_shards(tmp_path, 2, [5, 3]), ShardReader({}), handler="warn")


def test_a_sample_range_is_found_by_its_headers_and_kept(source):
    url = source.urls[0]
    offsets = [sample.offset for sample in source.samples(url, headers_only=True)]
    assert source.byte_range(url, Segment(0, skip=1, count=2)) == (offsets[1], offsets[3])
    assert source.byte_range(url, Segment(0, skip=4)) == (offsets[4], None)
    assert source.byte_range(url, Segment(0, 512, 1024)) == (512, 1024)  # no scan needed
    assert len(source._ranges) == 2


def test_a_count_above_what_the_shard_holds_is_a_sample_count_error(source):
    with pytest.raises(SampleCountError, match="holds 5 samples from byte 0, but its count says"):
        source.byte_range(source.urls[0], Segment(0, skip=2, count=4))


def test_a_plain_shards_size_comes_from_its_open_file(tmp_path, monkeypatch):
    """Through the cache, the cached copy's size: no ``info`` request to the backend (a
    resumed worker's cursor check); elsewhere the file's size."""
    paths = write_shards(tmp_path, 1, 4)
    plain = ShardSource(paths, ShardReader({}))
    assert plain.plain_size(paths[0]) == os.path.getsize(paths[0])
    options = {"wds": {"cache_dir": str(tmp_path / "cache")}}
    cached = ShardSource([f"wds::file://{paths[0]}"], ShardReader(options))
    assert len(list(cached.samples(cached.urls[0]))) == 4  # now in the cache
    asked = []
    real_info = LocalFileSystem.info
    monkeypatch.setattr(
        LocalFileSystem,
        "info",
        lambda fs, path, **kw: asked.append(path) or real_info(fs, path, **kw),
    )
    assert cached.plain_size(cached.urls[0]) == os.path.getsize(paths[0])
    assert asked == []


def test_the_policy_raises_or_counts_a_broken_shard(source, caplog):
    with caplog.at_level(logging.WARNING, logger="fsspec_shards"):
        source.shard_failed(source.urls[1], OSError("gone"))
    assert "leaving out shard" in caplog.text and source.counters().shards_failed == 1
    source.handler = "raise"
    with pytest.raises(OSError, match="gone"):
        source.shard_failed(source.urls[1], OSError("gone"))


def test_a_sample_dict_carries_its_consumer_when_annotated(tmp_path):
    urls = write_shards(tmp_path, 1, 2)
    source = ShardSource(urls, ShardReader({}), annotate=True, transforms=[lambda s: s])
    sample = next(source.samples(urls[0]))
    result = source.prepare(sample, Consumer(0, 1, 3, 4), 7)
    assert (result["__worker__"], result["__index__"], result["__key__"]) == (3, 7, sample.key)
