"""Look-up of a shard by the trailing part of its path (:mod:`fsspec_shards.shard_names`),
shared by checksum manifests and sample counts."""

from __future__ import annotations

import pytest

from fsspec_shards.shard_names import by_trailing_path


def test_the_exact_name_wins_over_any_trailing_match():
    table = {"bucket/x/a.tar": 1, "a.tar": 2}
    assert by_trailing_path(table, "bucket/x/a.tar") == 1
    assert by_trailing_path(table, "bucket/y/a.tar") == 2


def test_the_longest_trailing_name_wins():
    table = {"a.tar": "name", "x/a.tar": "directory and name", "y/x/a.tar": "deeper"}
    assert by_trailing_path(table, "bucket/y/x/a.tar") == "deeper"
    assert by_trailing_path(table, "bucket/z/x/a.tar") == "directory and name"
    assert by_trailing_path(table, "bucket/z/w/a.tar") == "name"


@pytest.mark.parametrize("path", ["bucket/ab.tar", "bucket/a.tar/more", "bucket/a.ta", "tar"])
def test_only_whole_components_match(path):
    assert by_trailing_path({"a.tar": 1, "b.tar": 2}, path) is None


def test_a_leading_slash_of_a_name_is_ignored_for_a_trailing_match():
    assert by_trailing_path({"/shards/a.tar": 1}, "bucket/shards/a.tar") == 1
    assert by_trailing_path({"/shards/a.tar": 1}, "/shards/a.tar") == 1
    assert by_trailing_path({"/shards/a.tar": 1}, "bucket/other/a.tar") is None


def test_a_url_matches_by_host_and_path():
    table = {"host/data/a.tar": 1, "b.tar": 2}
    assert by_trailing_path(table, "https://host/data/a.tar") == 1
    assert by_trailing_path(table, "https://host/data/b.tar") == 2
    assert by_trailing_path(table, "https://other/data/a.tar") is None


def test_falsy_entries_are_found_not_skipped():
    assert by_trailing_path({"empty.tar": 0}, "bucket/empty.tar") == 0


def test_a_leading_slash_of_a_name_is_ignored_for_the_whole_path_too():
    assert by_trailing_path({"/shards/a.tar": 1}, "shards/a.tar") == 1  # was None
