"""The backend interface (storage/backends/base.py): every registered backend satisfies it,
each protocol has one backend, an object's identity is derived from its backend's version
fields, and the retry classification knows each backend's failure names; how a backend's own
words are read: its protocol name, the ``info()`` fields naming a version, the options a
function takes, base64 digests."""

from __future__ import annotations

import base64
import hashlib

import fsspec
import pytest

from fsspec_shards.storage.backends import BACKENDS, OTHER, backend_for
from fsspec_shards.storage.backends.base import (
    Backend,
    from_base64,
    parameters,
    protocol_of,
    range_header,
)
from fsspec_shards.storage.backends.versions import VersionFields
from fsspec_shards.storage.core.integrity import Checksum
from fsspec_shards.storage.core.retry import ErrorNames, http_status, is_transient

EVERY = (*BACKENDS, OTHER)


@pytest.mark.parametrize("backend", EVERY, ids=lambda b: type(b).__name__)
def test_each_backend_satisfies_the_interface(backend):
    assert isinstance(backend, Backend)
    assert isinstance(backend.errors, ErrorNames)
    fields = backend.version_fields
    assert fields.etag or fields.version or fields.modified  # something names a version
    for algorithm, name, length in backend.checksum_fields:
        assert algorithm in ("md5", "sha256", "crc32c") and name and length in (8, 32, 64)
    for takes in backend.option_tables.values():
        assert callable(takes)
    for protocol in backend.protocols:
        assert backend_for(protocol) is backend


def test_each_protocol_has_one_backend_and_unknown_ones_the_other():
    protocols = [protocol for backend in BACKENDS for protocol in backend.protocols]
    assert len(protocols) == len(set(protocols))
    assert backend_for("memory") is backend_for("no-such-protocol") is OTHER
    assert OTHER.protocols == ()


@pytest.mark.parametrize("backend", EVERY, ids=lambda b: type(b).__name__)
def test_the_identity_is_derived_from_the_version_fields(backend):
    fields = backend.version_fields
    named = fields.version + fields.etag
    info = {name: f"v-{index}" for index, name in enumerate(named)} | {"size": 5}
    identity = backend.identity(info)
    assert identity.endswith(";size=5") or identity == "size=5"
    for name in named:  # each field that names a version changes the identity
        assert backend.identity({**info, name: "other"}) != identity
    for name in fields.modified:  # the modification time counts only without them
        assert backend.identity({**info, name: "later"}) == identity
    if fields.modified:
        first = fields.modified[0]
        assert backend.identity({first: 1.0, "size": 5}) != backend.identity(
            {first: 2.0, "size": 5}
        )
    unknown = {"not-a-version-field": "x", "size": 5}
    assert backend.identity(unknown) == backend.identity({"size": 5})


def test_identities_keep_the_spelling_cache_entries_have():
    s3, gcs, local = backend_for("s3"), backend_for("gcs"), backend_for("file")
    assert (
        s3.identity({"ETag": '"e"', "VersionId": "v1", "size": 5}) == "VersionId=v1;ETag=e;size=5"
    )
    assert s3.identity({"ETag": '"e"', "VersionId": "null", "size": 5}).startswith("VersionId=null")
    assert (
        gcs.identity({"etag": "CJ", "generation": 17, "size": 2}) == "generation=17;etag=CJ;size=2"
    )
    assert local.identity({"mtime": 1.5, "size": 3}) == "mtime=1.5;size=3"
    assert OTHER.identity({"created": 7.0, "size": 1}) == "created=7.0;size=1"  # memory files
    assert OTHER.identity({"size": None}) == "size=None"


def test_the_identity_and_the_version_read_the_same_fields(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"data")
    info = fsspec.filesystem("file").info(str(path))
    local = backend_for("file")
    _, _, modified = local.version_fields.read(info)
    assert local.identity(info) == f"mtime={modified};size=4"


def test_checksums_come_from_the_checksum_fields():
    class Digests(Backend):
        checksum_fields = (("md5", "md5Hash", 32),)

    md5 = "0123456789abcdef0123456789abcdef"
    encoded = bytes.fromhex(md5)
    assert Digests().checksums({"md5Hash": encoded}) == [Checksum("md5", md5)]
    assert Digests().checksums({"md5Hash": b"short"}) == []
    assert Backend().checksums({"md5Hash": encoded}) == []


def test_the_shortest_positive_socket_time_out_is_the_backends():
    class Sockets(Backend):
        def socket_timeouts(self, fs):
            return [None, True, 0, "9", 7, 2.5]

    assert Sockets().timeout(None) == 2.5
    assert Backend().timeout(None) is None


def test_the_defaults_say_nothing():
    backend = Backend()
    assert backend.location(None) == ""
    assert backend.passed_on() is None
    assert backend.open_range(None, "p", 0, 1, None, 1.0) is None
    assert backend.tamed_options({"a": 1}, 5.0) == {"a": 1, "skip_instance_cache": True}
    assert range_header(3, None) == "bytes=3-" and range_header(3, 10) == "bytes=3-9"


@pytest.mark.parametrize("backend", EVERY, ids=lambda b: type(b).__name__)
def test_the_retry_classification_knows_each_backends_failure_names(backend):
    for name in backend.errors.transient:
        assert is_transient(type(name, (Exception,), {})("cut")), name
    for name in backend.errors.status_code_types:
        error = type(name, (Exception,), {})("failed")
        error.code = 503
        assert http_status(error) == 503 and is_transient(error)


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
