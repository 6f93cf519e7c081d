"""Shard URL patterns: brace expansion that keeps fsspec '::' chains and fails clearly."""

from __future__ import annotations

import ast
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


@pytest.mark.parametrize(
    ("pattern", "suggested"),
    [
        ("a.tar::b.tar", "['a.tar', 'b.tar']"),
        ("/d/a-{0..3}.tar::s3://b/c-{0..1}.tgz", "['/d/a-{0..3}.tar', 's3://b/c-{0..1}.tgz']"),
        ("a.tar::wds::s3://b/c.tar.gz", "['a.tar', 'wds::s3://b/c.tar.gz']"),
    ],
)
def test_double_colons_between_shard_patterns_say_to_give_a_list(pattern, suggested):
    with pytest.raises(ValueError, match="list") as caught:
        expand_urls(pattern)
    assert suggested in str(caught.value)
    assert expand_urls(ast.literal_eval(suggested))  # what the message suggests is accepted


def test_a_double_colon_error_shows_no_secret():
    with pytest.raises(ValueError, match="list") as caught:
        expand_urls(["ok.tar", "https://h/a.tar?sig=topsecret::https://h/b.tar?sig=topsecret"])
    assert "topsecret" not in str(caught.value)


@pytest.mark.parametrize(
    "pattern",
    ["wds::s3://b/x-{0..1}.tar", "tar://inner.tar::s3://b/outer.tar", "zip://in.tar::/d/a.zip"],
)
def test_chains_and_archive_members_are_not_joined_patterns(pattern):
    assert expand_urls(pattern)


@pytest.mark.parametrize(
    ("pattern", "example"),
    [
        ("pipe:curl -s -L https://h/x.tar?sig=topsecret", " (e.g. 'wds::https://h/x.tar?sig="),
        ("pipe:aws s3 cp s3://b/x-{0..3}.tar -", " (e.g. 'wds::s3://b/x-{0..3}.tar')"),
        ("wds::pipe:cat /d/x.tar", ""),
    ],
)
def test_pipe_urls_are_refused_with_what_to_write_instead(pattern, example):
    with pytest.raises(ValueError) as caught:
        expand_urls(pattern)
    message = str(caught.value)
    assert message.startswith("pipe: URLs are not supported; use the URL itself" + example)
    assert "topsecret" not in message
