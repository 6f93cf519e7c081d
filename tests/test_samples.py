"""Sample grouping by the webdataset convention, and equality with webdataset 1.0.2 itself."""

from __future__ import annotations

import gzip
import io
import tarfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fsspec_shards.errors import ShardFormatError
from fsspec_shards.iteration.samples import (
    RawSample,
    group_samples,
    is_meta_member,
    split_key,
    to_dict,
)
from fsspec_shards.iteration.tar import TarMember, iter_members, open_shard_stream, parse_members
from tests.shardmaker import make_tar, regular, special

URL = "s3://bucket/train-0000.tar"


def members(*names_and_data: tuple[str, bytes]) -> list[TarMember]:
    """Members laid out as in a tar: one header block plus data blocks each."""
    result, offset = [], 0
    for name, data in names_and_data:
        end = offset + 512 + -(-len(data) // 512) * 512
        result.append(TarMember(name, data, offset, end))
        offset = end
    return result


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("a.jpg", ("a", "jpg")),
        ("a.seg.PNG", ("a", "seg.PNG")),
        ("dir.with.dots/key.txt", ("dir.with.dots/key", "txt")),
        ("a/b.c/d.e.f", ("a/b.c/d", "e.f")),
        ("noextension", (None, None)),
        ("dir.x/noextension", (None, None)),
        (".hidden", (None, None)),
        ("dir/.hidden", ("dir/", "hidden")),
        ("trailing.", ("trailing", "")),
    ],
)
def test_split_key_follows_webdatasets_base_plus_ext(name, expected):
    from webdataset.tariterators import base_plus_ext

    assert split_key(name) == expected == base_plus_ext(name)


@pytest.mark.parametrize(
    ("name", "meta"),
    [
        ("__index__", True),
        ("__meta__/info.json", True),
        ("___", True),
        ("__key__.txt", False),
        ("dir/__index__", False),
        ("a.txt", False),
    ],
)
def test_meta_members_are_recognised_as_webdataset_does(name, meta):
    assert is_meta_member(name) is meta


def test_consecutive_members_with_one_key_form_one_sample_with_offsets():
    stream = members(("a.jpg", b"J"), ("a.cls", b"1"), ("b.jpg", b"K"), ("b.cls", b"2"))
    first, second = group_samples(stream, URL)
    assert first == RawSample("a", URL, {"jpg": b"J", "cls": b"1"}, 0, 2048)
    assert second == RawSample("b", URL, {"jpg": b"K", "cls": b"2"}, 2048, 4096)


def test_a_key_seen_again_later_starts_a_new_sample():
    stream = members(("a.jpg", b"1"), ("b.jpg", b"2"), ("a.cls", b"3"))
    assert [sample.key for sample in group_samples(stream, URL)] == ["a", "b", "a"]


def test_extensions_are_lower_cased_and_keys_are_not():
    (sample,) = group_samples(members(("Key.JPG", b"1"), ("Key.Seg.PNG", b"2")), URL)
    assert (sample.key, list(sample.fields)) == ("Key", ["jpg", "seg.png"])


def test_repeated_extension_raises_naming_shard_key_and_offset():
    stream = members(("a.jpg", b"1"), ("a.cls", b"2"), ("a.JPG", b"3"))
    with pytest.raises(ShardFormatError) as caught:
        list(group_samples(stream, URL))
    assert caught.value.offset == 2048
    assert "'a'" in str(caught.value) and "'jpg'" in str(caught.value)
    assert URL in str(caught.value)


def test_reserved_field_names_raise():
    with pytest.raises(ShardFormatError, match="reserved"):
        list(group_samples(members(("a.__url__", b"x")), URL))


def test_members_without_key_and_meta_members_are_skipped_without_splitting_samples():
    stream = members(
        ("__index__", b"i"), ("a.jpg", b"1"), ("README", b"r"), ("a.cls", b"2"), ("b.jpg", b"3")
    )
    first, second = group_samples(stream, URL)
    assert first.fields == {"jpg": b"1", "cls": b"2"}
    assert (first.offset, first.end, second.offset) == (1024, 4096, 4096)


def test_to_dict_is_webdatasets_form():
    sample = RawSample("k", URL, {"jpg": b"1", "cls": b"2"}, 0, 2048)
    assert list(to_dict(sample).items()) == [
        ("__key__", "k"),
        ("__url__", URL),
        ("jpg", b"1"),
        ("cls", b"2"),
    ]


def test_a_sample_reread_from_its_byte_range_is_the_same_sample():
    raw = make_tar([regular(f"{key}.{ext}", key.encode() * 300) for key in "abc" for ext in "xy"])
    samples = list(group_samples(iter_members(io.BytesIO(raw), URL), URL))
    for sample in samples:
        reread = parse_members(raw[sample.offset : sample.end], URL, sample.offset)
        assert list(group_samples(reread, URL)) == [sample]


# Equality with webdataset 1.0.2 on a tricky corpus.


def tricky_entries(shard: int) -> list:
    entries = []
    for index in range(6):
        key = f"s{shard}-{index:03d}"
        entries += [
            regular(f"{key}.jpg", bytes([index]) * (index * 300)),
            regular(f"{key}.cls", b"%d" % index),
        ]
    entries += [
        regular("__index__", b"meta"),
        regular("__meta__/info.json", b"{}"),
        regular("Upper.JPG", b"upper"),
        regular("Upper.Seg.PNG", b"seg"),
        regular("dir.with.dots/k1.txt", b"dotted dir"),
        regular("dir.with.dots/k1.multi.part.ext", b"multi"),
        regular("no_extension", b"skipped"),
        special("a_directory", tarfile.DIRTYPE),
        special("a_symlink.txt", tarfile.SYMTYPE, linkname="Upper.JPG"),
        regular("d" * 120 + "/long.txt", b"long name"),
        regular("ключ.txt", "юникод".encode()),
        regular("empty.bin", b""),
        regular("empty.txt", b""),
        regular("again.txt", b"1"),
        regular("other.txt", b"2"),
        regular("again.cls", b"3"),
        regular("dir/.hidden", b"hidden"),
    ]
    return entries


@pytest.fixture
def tricky_shards(tmp_path):
    paths = []
    for shard, (tar_format, compress) in enumerate(
        [
            (tarfile.PAX_FORMAT, False),
            (tarfile.GNU_FORMAT, True),
            (tarfile.GNU_FORMAT, False),
            (tarfile.PAX_FORMAT, True),
        ]
    ):
        raw = make_tar(tricky_entries(shard), tar_format)
        path = tmp_path / (f"shard-{shard}.tar.gz" if compress else f"shard-{shard}.tar")
        path.write_bytes(gzip.compress(raw, mtime=0) if compress else raw)
        paths.append(str(path))
    ustar = [regular(f"{'u' * 80}/{'v' * 60}/k{index}.txt", b"u") for index in range(3)]
    path = tmp_path / "shard-ustar.tar"
    path.write_bytes(make_tar(ustar, tarfile.USTAR_FORMAT))
    paths.append(str(path))
    return paths


def our_samples(paths: list[str]) -> list[dict]:
    result = []
    for path in paths:
        with open(path, "rb") as fileobj:
            stream = open_shard_stream(fileobj, path)
            result += [
                to_dict(sample) for sample in group_samples(iter_members(stream, path), path)
            ]
    return result


def test_stream_equals_webdatasets_pipeline_functions(tricky_shards):
    from webdataset.tariterators import group_by_keys, tar_file_expander

    expected = []
    for path in tricky_shards:
        with open(path, "rb") as stream:
            expected += list(group_by_keys(tar_file_expander([{"url": path, "stream": stream}])))
    assert our_samples(tricky_shards) == expected
    assert len(expected) > 40


def test_stream_equals_webdataset_dataset_without_shuffling(tricky_shards):
    import webdataset as wds

    # webdataset adds the local file path of local shards; the rest must be equal.
    expected = [
        {name: value for name, value in sample.items() if name != "__local_path__"}
        for sample in wds.WebDataset(tricky_shards, shardshuffle=False)
    ]
    ours = our_samples(tricky_shards)
    assert [sample["__key__"] for sample in ours] == [sample["__key__"] for sample in expected]
    assert ours == expected


NAME_CHARACTERS = "ab._/A"


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(
    names=st.lists(st.text(NAME_CHARACTERS, min_size=1, max_size=8), min_size=0, max_size=12),
    long_prefix=st.booleans(),
    tar_format=st.sampled_from([tarfile.GNU_FORMAT, tarfile.PAX_FORMAT]),
)
def test_random_layouts_group_exactly_like_webdataset(names, long_prefix, tar_format):
    from webdataset.tariterators import group_by_keys, tar_file_expander

    prefix = "p" * 101 + "/" if long_prefix else ""
    entries = [regular(prefix + name, b"%d" % index) for index, name in enumerate(names)]
    raw = make_tar(entries, tar_format)
    try:
        expected = list(group_by_keys(tar_file_expander([{"url": URL, "stream": io.BytesIO(raw)}])))
    except ValueError:
        expected = ValueError
    try:
        ours = [to_dict(s) for s in group_samples(iter_members(io.BytesIO(raw), URL), URL)]
    except ShardFormatError:
        ours = ValueError
    assert ours == expected
