"""URL patterns to the wds:: URLs of shards, and the filesystems that read them."""

from __future__ import annotations

import pytest

from fsspec_shards.fleet.errors import InputError
from fsspec_shards.fleet.shards import (
    comparable,
    expand_braces,
    has_glob,
    open_filesystem,
    plain_url,
    shard_urls,
    wds_url,
    write_text,
)


def test_urls_are_read_through_wds_unless_chained_already(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert wds_url("s3://b/k.tar") == "wds::s3://b/k.tar"
    assert wds_url("simplecache::s3://b/k.tar") == "simplecache::s3://b/k.tar"
    assert wds_url("shards/a.tar") == f"wds::file://{tmp_path}/shards/a.tar"
    assert plain_url("wds::s3://b/k.tar") == "s3://b/k.tar"
    assert comparable("wds::file:///d/a.tar") == "/d/a.tar"
    assert comparable("wds::s3://b/k.tar") == "s3://b/k.tar"


def test_globs_are_found_in_paths_but_not_in_http_query_strings():
    assert has_glob("s3://b/train-*.tar") and has_glob("/d/shard-00[0-3].tar")
    assert not has_glob("https://host/a.tar?sig=a*b") and not has_glob("s3://b/k.tar")


def test_braces_and_globs_expand_in_order_to_wds_urls(dataset):
    directory = dataset.directory
    expected = ["wds::file://" + str(path) for path in dataset.shards]
    assert shard_urls(dataset.pattern, {}) == expected
    assert shard_urls(f"{directory}/demo-*.tar", {}) == expected
    assert shard_urls([str(dataset.shards[2]), str(dataset.shards[0])], {}) == [
        expected[2], expected[0]
    ]  # fmt: skip


def test_a_pattern_matching_nothing_or_malformed_is_an_input_error(tmp_path):
    with pytest.raises(InputError, match="no shards match"):
        shard_urls(f"{tmp_path}/absent-*.tar", {})
    with pytest.raises(InputError):
        expand_braces("/d/shard-{0000..0003.tar")


def test_an_unknown_protocol_is_an_input_error_naming_the_url_without_its_secret():
    with pytest.raises(InputError, match="cannot open") as raised:
        open_filesystem("wds::nosuchproto://host/a.tar?X-Amz-Signature=secret", {})
    assert "secret" not in str(raised.value)


def test_text_is_written_to_local_paths_and_urls(tmp_path):
    write_text(str(tmp_path / "a.txt"), "one\n", {})
    write_text(f"file://{tmp_path}/b.txt", "two\n", {})
    assert (tmp_path / "a.txt").read_text() == "one\n"
    assert (tmp_path / "b.txt").read_text() == "two\n"
