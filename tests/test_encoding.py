"""Sample encoding for the writer: webdataset's encodings, and names that read back exactly."""

from __future__ import annotations

import gzip
import io
import tarfile

import numpy
import PIL.Image
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from webdataset.writer import default_handlers, encode_based_on_extension1

from fsspec_shards.errors import ShardFormatError
from fsspec_shards.iteration.encoding import encode_sample, encode_value, member_name
from fsspec_shards.iteration.samples import group_samples
from fsspec_shards.iteration.tar import iter_members

IMAGE = numpy.arange(48, dtype=numpy.uint8).reshape(4, 4, 3)

SAME_AS_WEBDATASET = [
    ("bin", b"\x00raw"),
    ("txt", "grüße"),
    ("anything", "text in any field"),
    ("cls", 7),
    ("id", numpy.int64(12)),
    ("json", {"a": [1, 2.5, None], "ü": "x"}),
    ("jsn", [1, "two"]),
    ("npy", numpy.arange(6, dtype=numpy.float32).reshape(2, 3)),
    ("pyd", {"any": ("picklable", 1)}),
    ("png", IMAGE),
    ("png", PIL.Image.fromarray(IMAGE)),
    ("jpg", IMAGE),
    ("ppm", IMAGE),
    ("tiff", IMAGE),
    ("png", IMAGE.astype(numpy.float32) / 255.0),
]


@pytest.mark.parametrize(("field", "value"), SAME_AS_WEBDATASET)
def test_values_are_encoded_as_webdatasets_writer_does(field, value):
    assert encode_value("k", field, value) == encode_based_on_extension1(
        value, field, default_handlers
    )


def test_int_fields_take_any_integer_and_read_back_as_it():
    torch = pytest.importorskip("torch")
    for value in (7, numpy.uint8(200), torch.tensor(3), True):
        assert int(encode_value("k", "cls", value)) == value


def test_bytearray_and_memoryview_are_written_as_their_bytes():
    assert encode_value("k", "bin", bytearray(b"ab")) == b"ab"
    assert encode_value("k", "seg.bin", memoryview(b"cd")) == b"cd"


def test_npz_and_gz_fields_decode_to_what_webdataset_writes():
    arrays = {"a": numpy.arange(3), "b": numpy.ones((2, 2))}
    ours = numpy.load(io.BytesIO(encode_value("k", "npz", arrays)))
    assert sorted(ours) == ["a", "b"] and (ours["b"] == arrays["b"]).all()
    theirs = encode_based_on_extension1({"x": 1}, "json.gz", default_handlers)
    assert gzip.decompress(encode_value("k", "json.gz", {"x": 1})) == gzip.decompress(theirs)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("txt", 5, "no encoding of int for the extension 'txt'"),
        ("bin", object(), "no encoding of object"),
        ("json", {1j}, "cannot encode set as 'json'"),
        ("npz", [1, 2], "cannot encode list as 'npz'"),
        ("png", numpy.zeros((2, 2, 2), numpy.uint8), "cannot encode ndarray as 'png'"),
        ("jpg", numpy.full((2, 2), 3.0), "cannot encode ndarray as 'jpg'"),
        # decode() reads int fields with int(): "7.9", "tensor([3])" would not read back
        ("cls", 7.9, "cannot encode float as 'cls'"),
        ("count", numpy.float32(2), "cannot encode float32 as 'count'"),
        ("cls", [3], "cannot encode list as 'cls'"),
    ],
)
def test_values_without_an_encoding_are_refused_naming_key_and_field(field, value, message):
    with pytest.raises(ValueError, match=message) as caught:
        encode_value("key1", field, value)
    assert f"sample 'key1' field {field!r}" in str(caught.value)


@pytest.mark.parametrize(
    ("key", "field", "message"),
    [
        ("a.b", "jpg", "reads back as key 'a', field 'b.jpg'"),
        ("dir/a.b", "jpg", "reads back as key 'dir/a'"),
        ("k", "", "empty field name"),
        ("k", "sub/jpg", "reads back as key None"),
        ("k", "JPG", "read back as 'jpg'"),
        ("__meta__/k", "json", "readers skip members"),
        ("k\0", "txt", "NUL"),
    ],
)
def test_names_the_reader_would_split_differently_are_refused(key, field, message):
    with pytest.raises(ValueError, match=message):
        member_name(key, field)


@pytest.mark.parametrize(
    ("key", "field"),
    [
        ("dir.with.dots/c", "seg.png"),
        ("ünïcode/ключ", "txt"),
        ("deep/" * 40 + "k", "json"),
        ("__meta__", "json"),
        ("k", "tar.gz"),
    ],
)
def test_unusual_but_valid_names_are_accepted(key, field):
    assert member_name(key, field) == f"{key}.{field}"


@pytest.mark.parametrize(
    ("sample", "message"),
    [
        ({"txt": "no key"}, "needs a non-empty str '__key__'"),
        ({"__key__": "", "txt": "x"}, "needs a non-empty str '__key__'"),
        ({"__key__": 3, "txt": "x"}, "needs a non-empty str '__key__'"),
        ({"__key__": "k", "__url__": "u", "_meta": "m"}, "no fields to write"),
        ({"__key__": "k", 1: b"x"}, "field names must be str"),
    ],
)
def test_samples_without_a_key_or_fields_are_refused(sample, message):
    with pytest.raises(ValueError, match=message):
        encode_sample(sample)


def test_fields_starting_with_an_underscore_are_left_out_and_the_rest_sorted():
    key, members = encode_sample({"__key__": "k", "__url__": "u", "txt": "t", "cls": 1, "_x": ""})
    assert key == "k"
    assert members == [("k.cls", b"1"), ("k.txt", b"t")]


def read_back(key: str, fields: list[str]) -> list[tuple[str, list[str]]]:
    """The (key, fields) of the samples the reader forms from one sample's members."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for field in fields:
            info = tarfile.TarInfo(f"{key}.{field}")
            archive.addfile(info, io.BytesIO(b""))
    members = iter_members(io.BytesIO(buffer.getvalue()), "t.tar")
    return [(sample.key, sorted(sample.fields)) for sample in group_samples(members, "t.tar")]


NAME_TEXT = st.text(alphabet="ab._/Ü_-", min_size=1, max_size=12)


@settings(max_examples=400, deadline=None, derandomize=True, database=None)
@given(key=NAME_TEXT, fields=st.lists(NAME_TEXT, min_size=1, max_size=3, unique=True))
def test_accepted_names_read_back_as_written_and_refused_ones_would_not(key, fields):
    try:
        for field in fields:
            member_name(key, field)
    except ValueError:
        accepted = False
    else:
        accepted = True
    try:
        samples = read_back(key, fields)
    except ShardFormatError:
        samples = None  # e.g. two fields that the reader takes for one
    assert (samples == [(key, sorted(fields))]) == accepted
