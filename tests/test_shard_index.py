"""The sample index: its JSON form, its checks, how shards are found in it and beside them."""

from __future__ import annotations

import json
from array import array

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fsspec_shards.iteration.samples import RawSample
from fsspec_shards.iteration.shard_index import (
    DEFAULT_INDEX,
    ShardIndex,
    beside,
    build_index,
    discover,
    find_index,
    format_index,
    index_of_samples,
    load_index,
    parse_index,
)


def index(size: int, *offsets: int) -> ShardIndex:
    return ShardIndex(size, array("q", offsets))


@given(
    st.lists(
        st.tuples(st.integers(0, 10), st.lists(st.integers(1, 10_000), max_size=30)), max_size=5
    )
)
def test_an_index_reads_back_as_it_was_formatted(shards):
    entries = []
    for number, (first, spans) in enumerate(shards):
        offsets = [512 * first]
        for span in spans:
            offsets.append(offsets[-1] + 512 * span)
        if not spans:
            offsets = [0]
        entries.append((f"dir/s-{number}.tar", index(number * 1000, *offsets)))
    text = format_index(entries)
    assert parse_index(text, "test") == dict(entries)
    assert list(parse_index(text, "test")) == [name for name, _ in entries]


def test_the_json_holds_block_spans_and_the_format_name():
    text = format_index([("a.tar", index(5120, 1024, 2048, 4608))])
    assert json.loads(text) == {
        "format": "fsspec-shards sample index",
        "version": 1,
        "shards": {"a.tar": {"size": 5120, "blocks": [2, 2, 5]}},
    }
    entry = parse_index(text, "x")["a.tar"]
    assert entry.samples == 2 and entry.span(0) == (1024, 2048) and entry.span(1) == (2048, 4608)


def test_index_of_samples_and_build_index_agree_and_an_empty_shard_has_no_samples():
    samples = [RawSample("a", "u", {}, 0, 1024), RawSample("b", "u", {}, 1536, 3072)]
    assert index_of_samples(9, samples) == build_index(9, [0, 1536], 3072)
    assert index_of_samples(9, samples) == index(9, 0, 1536, 3072)
    empty = index_of_samples(1024, [])
    assert empty.samples == 0 and list(empty.offsets) == [0]


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ("[1, 2", "is not JSON"),
        ('{"shards": {}}', "is not a sample index"),
        ('{"format": "fsspec-shards sample index", "version": 2, "shards": {}}', "version 2"),
        ('{"format": "fsspec-shards sample index", "version": 1, "shards": []}', '"shards"'),
        ('{"format": "fsspec-shards sample index", "version": 1, "shards": {"a": 1}}', "object"),
        (
            '{"format": "fsspec-shards sample index", "version": 1, '
            '"shards": {"a.tar": {"size": -1, "blocks": [0]}}}',
            '"size" must be a non-negative int',
        ),
        (
            '{"format": "fsspec-shards sample index", "version": 1, '
            '"shards": {"a.tar": {"size": 1, "blocks": []}}}',
            "non-empty list",
        ),
        (
            '{"format": "fsspec-shards sample index", "version": 1, '
            '"shards": {"a.tar": {"size": 1, "blocks": [0, 2, true]}}}',
            "non-empty list",
        ),
        (
            '{"format": "fsspec-shards sample index", "version": 1, '
            '"shards": {"a.tar": {"size": 1, "blocks": [0, 2, 0]}}}',
            "at least one block",
        ),
    ],
)
def test_a_broken_index_is_a_value_error_naming_where_and_the_shard(document, message):
    with pytest.raises(ValueError, match=message) as caught:
        parse_index(document, "sample index x.json")
    assert "sample index x.json" in str(caught.value)


def test_shards_are_found_by_full_url_else_by_trailing_path():
    table = {"train-0.tar": index(1, 0), "b/train-1.tar": index(2, 0), "s3://x/c.tar": index(3, 0)}
    assert find_index(table, "wds::s3://bucket/train-0.tar?sig=abc").size == 1
    assert find_index(table, "/data/b/train-1.tar").size == 2
    assert find_index(table, "s3://x/c.tar").size == 3
    assert find_index(table, "/data/a/train-1.tar") is None


def test_beside_names_the_file_in_the_shards_directory_with_the_query_of_a_url():
    assert beside("wds::s3://b/d/x.tar?sv=1&sig=2") == f"wds::s3://b/d/{DEFAULT_INDEX}?sv=1&sig=2"
    assert beside("/data/odd?name/x.tar") == f"/data/odd?name/{DEFAULT_INDEX}"
    assert beside("memory://b/x.tar", "other.json") == "memory://b/other.json"


def test_discover_reads_each_directory_once_and_skips_one_without_an_index(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / DEFAULT_INDEX).write_text(format_index([("x.tar", index(7, 0, 512))]))
    urls = [str(tmp_path / "a" / "x.tar"), str(tmp_path / "a" / "y.tar"), str(tmp_path / "b/z.tar")]
    found = discover(urls, None)
    assert found == {urls[0]: index(7, 0, 512)}
    (tmp_path / "b" / DEFAULT_INDEX).write_text("{}")
    with pytest.raises(ValueError, match=r"b/sample-index.json is not a sample index"):
        discover(urls, None)


def test_load_index_takes_a_mapping_or_a_file_and_refuses_other_values(tmp_path):
    entries = {"x.tar": index(7, 0, 512)}
    assert load_index(entries) == entries
    with pytest.raises(ValueError, match="ShardIndex"):
        load_index({"x.tar": [0, 512]})
    path = tmp_path / "i.json"
    path.write_text(format_index(entries.items()))
    assert load_index(str(path)) == entries
    with pytest.raises(FileNotFoundError, match="no sample index at"):
        load_index(str(tmp_path / "absent.json"))
