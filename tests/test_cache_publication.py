"""Publishing a download (storage/cache/publication.py): whole and verified or absent, a size
that differs from the promised one refused, and a write during the download unpublished."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fsspec_shards.errors import IntegrityError
from fsspec_shards.storage.cache import (
    ShardCache,
)
from tests.cache_objects import (
    fill,
    obj,
    writer,
)


@pytest.fixture
def cache(tmp_path: Path) -> ShardCache:
    return ShardCache(str(tmp_path / "cache"), 1000)


def test_download_exception_propagates_unchanged_and_leaves_nothing(cache: ShardCache) -> None:
    class BackendDown(ConnectionError):
        pass

    def failing(file) -> dict:
        file.write(b"partial")
        raise BackendDown("reset")

    with pytest.raises(BackendDown):
        cache.fetch(obj("s3://bucket/a"), failing, expected_size=100)
    assert cache.get(obj("s3://bucket/a")) is None
    assert os.listdir(Path(cache.directory) / "tmp") == []
    assert cache.stats()["cached_files"] == 0
    assert fill(cache, "s3://bucket/a")


def test_size_different_from_expected_is_an_integrity_error_and_not_cached(
    cache: ShardCache,
) -> None:
    with pytest.raises(IntegrityError):
        cache.fetch(obj("s3://bucket/a"), writer(b"short"), expected_size=100)
    assert cache.get(obj("s3://bucket/a")) is None
    assert cache.stats()["integrity_failures"] == 1
    assert os.listdir(Path(cache.directory) / "tmp") == []


def test_a_write_during_a_download_keeps_it_from_being_published(cache: ShardCache) -> None:
    url = "s3://bucket/a"

    def download_then_written(file) -> dict:
        file.write(b"old version")
        cache.discard(obj(url))  # the write lands while the download is in flight
        return {}

    with cache.fetch(obj(url), download_then_written) as handle:
        assert handle.read() == b"old version"  # the reader gets what it downloaded
    assert cache.get(obj(url)) is None
    assert cache.stats()["cached_files"] == 0
    assert list((Path(cache.directory) / "files").rglob("*.*")) == []
    assert os.listdir(Path(cache.directory) / "tmp") == []
