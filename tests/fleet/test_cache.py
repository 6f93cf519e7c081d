"""The cache directory as it stands: found, never created."""

from __future__ import annotations

import pytest

from fsspec_shards.fleet.cache import existing_cache
from fsspec_shards.fleet.errors import InputError
from fsspec_shards.storage import ShardCache


def test_no_cache_yet_is_none_and_stays_absent(tmp_path):
    assert existing_cache(str(tmp_path / "cache"), 10**6) is None
    assert not (tmp_path / "cache").exists()


def test_a_directory_that_is_no_cache_is_an_input_error_naming_it(tmp_path):
    (tmp_path / "mine.txt").write_text("not a cache")
    with pytest.raises(InputError, match=str(tmp_path)):
        existing_cache(str(tmp_path), 10**6)


def test_an_existing_cache_opens(tmp_path):
    ShardCache(str(tmp_path / "cache"), 10**6)
    assert existing_cache(str(tmp_path / "cache"), 10**6, writable=True) is not None
