"""Shard URL patterns: brace expansion that keeps fsspec '::' chains and fails clearly."""

from __future__ import annotations

from pathlib import Path

import pytest

from fsspec_shards.iteration.urls import expand_urls


def test_zero_padded_ranges_expand_in_order():
    assert expand_urls("s3://b/train-{0000..0002}.tar") == [
        "s3://b/train-0000.tar",
        "s3://b/train-0001.tar",
        "s3://b/train-0002.tar",
    ]


def test_alternatives_and_several_braces_expand_as_a_product():
    assert expand_urls("/d/{a,b}-{0..1}.tar") == [
        "/d/a-0.tar",
        "/d/a-1.tar",
        "/d/b-0.tar",
        "/d/b-1.tar",
    ]


def test_fsspec_chained_urls_keep_their_double_colons():
    assert expand_urls("wds::s3://bucket/s-{0..1}.tar") == [
        "wds::s3://bucket/s-0.tar",
        "wds::s3://bucket/s-1.tar",
    ]
    assert expand_urls("simplecache::wds::gcs://b/x.tar") == ["simplecache::wds::gcs://b/x.tar"]


def test_lists_are_expanded_element_by_element_in_order(tmp_path):
    assert expand_urls(["a-{1..2}.tar", Path("/p/b.tar"), "c.tar"]) == [
        "a-1.tar",
        "a-2.tar",
        "/p/b.tar",
        "c.tar",
    ]


def test_single_path_objects_are_accepted():
    assert expand_urls(Path("/data/one.tar")) == ["/data/one.tar"]


def test_unbalanced_braces_raise_value_error_without_secrets():
    with pytest.raises(ValueError, match="unbalanced braces") as caught:
        expand_urls("https://h/s-{0..3.tar?sig=topsecret")
    assert "topsecret" not in str(caught.value)


@pytest.mark.parametrize("urls", ["", "   ", [], [""]])
def test_empty_input_raises_value_error(urls):
    with pytest.raises(ValueError):
        expand_urls(urls)


def test_non_string_entries_raise_type_error():
    with pytest.raises(TypeError, match="int"):
        expand_urls(["a.tar", 3])
