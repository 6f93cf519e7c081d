"""How a backend's own words are read (storage/backends/fields.py): its protocol name, the
``info()`` fields naming a version, the options a function takes, base64 digests."""

from __future__ import annotations

import base64
import hashlib

import fsspec
import pytest

from fsspec_shards.storage.backends.fields import (
    VersionFields,
    from_base64,
    parameters,
    protocol_of,
)


def test_the_main_protocol_is_the_first_of_a_backends_names_or_its_only_one():
    assert fsspec.filesystem("file").protocol == ("file", "local")
    assert protocol_of(fsspec.filesystem("file")) == "file"
    assert protocol_of(fsspec.filesystem("memory")) == "memory"

    class Listed(fsspec.AbstractFileSystem):
        protocol = ["first", "second"]

    class Plain(fsspec.AbstractFileSystem):
        protocol = "plain"

    assert protocol_of(Listed(skip_instance_cache=True)) == "first"
    assert protocol_of(Plain(skip_instance_cache=True)) == "plain"


FIELDS = VersionFields(
    etag=("ETag", "etag"), version=("VersionId", "version_id"), modified=("LastModified",)
)


def test_each_version_field_is_the_first_of_its_names_present():
    info = {"etag": "late", "ETag": '"early"', "version_id": 7, "LastModified": 12.5}
    assert FIELDS.read(info) == ('"early"', "7", 12.5)  # the version id as text
    assert FIELDS.read({"etag": "e"}) == ("e", None, None)
    assert FIELDS.read({}) == (None, None, None)


@pytest.mark.parametrize("version", ["", "null"])
def test_a_version_id_that_names_none_is_none(version):
    fields = VersionFields(version=("VersionId",), no_version=("", "null"))
    assert fields.read({"VersionId": version}) == (None, None, None)
    assert fields.read({"VersionId": "v1"}) == (None, "v1", None)
    assert VersionFields(version=("VersionId",)).read({"VersionId": "null"})[1] == "null"


def test_the_parameters_of_a_function_are_its_named_ones_only():
    class Client:
        def __init__(self, a, b=1, *args, c, d=2, **kwargs): ...

    def positional_only(x, /, y): ...

    assert parameters(Client.__init__) == {"a", "b", "c", "d"}
    assert parameters(positional_only) == {"y"}


def test_a_base64_digest_and_raw_digest_bytes_read_as_hex():
    digest = hashlib.md5(b"shard").digest()
    assert from_base64(base64.b64encode(digest).decode()) == digest.hex()
    assert from_base64(digest) == from_base64(bytearray(digest)) == digest.hex()


@pytest.mark.parametrize("value", [None, "", "not base64!", "abc", 42])
def test_what_is_not_a_base64_digest_is_none(value):
    assert from_base64(value) is None
