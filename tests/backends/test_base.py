"""The backend interface (storage/backends/base.py): every registered backend satisfies it,
each protocol has one backend, an object's identity is derived from its backend's version
fields; how a backend's own
words are read: its protocol name, the ``info()`` fields naming a version, the options a
function takes, base64 digests.

What the obstore mappings are written with: options consumed one by one, the first of several
sources taken, what is left refused by name; and on real backend options, the obstore config
those rules make.
"""

from __future__ import annotations

import base64
import hashlib

import fsspec
import pytest

from fsspec_shards.storage.backends import MODULES, OTHER, backend_for
from fsspec_shards.storage.backends.base import (
    IGNORED_COMMON,
    Backend,
    Options,
    Refused,
    StoreSpec,
    as_bool,
    from_base64,
    http_endpoint,
    parameters,
    protocol_of,
    range_header,
    tls,
)
from fsspec_shards.storage.backends.obstore_options import Unmappable, map_options
from fsspec_shards.storage.backends.versions import VersionFields
from fsspec_shards.storage.core.integrity import Checksum
from fsspec_shards.storage.core.retry import ErrorNames
from tests.obstore_helpers import no_ambient_credentials  # noqa: F401 - the fixture

EVERY = (*dict.fromkeys(backend_for(protocol) for protocol in MODULES), OTHER)


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
    protocols = [protocol for backend in EVERY for protocol in backend.protocols]
    assert sorted(protocols) == sorted(MODULES)  # the table names each backend's protocols
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


def test_pick_takes_the_first_source_given_and_consumes_every_option_source(monkeypatch):
    monkeypatch.setenv("MAPPING_TEST_REGION", "from-env")
    options = Options({"region": None, "client_kwargs": {"region_name": "nested"}, "zone": "z"})
    assert options.pick("region", "client_kwargs.region_name", "zone", "$MAPPING_TEST_REGION") == (
        "nested"
    )
    assert options.remaining() == []  # "zone" too, and the table (taken as a whole)
    assert options.nested("client_kwargs").remaining() == []
    assert Options({}).pick("a", "$MAPPING_TEST_REGION") == "from-env"
    assert Options({}).pick("a", "$MAPPING_TEST_UNSET", default=3) == 3


def test_what_is_left_is_refused_by_its_full_name_unless_ignored():
    options = Options({"key": "k", "block_size": 5, "client_kwargs": {"endpoint": "h"}})
    options.take("key")
    nested = options.nested("client_kwargs")
    with pytest.raises(Refused) as refused:
        nested.finish()
    assert refused.value.option == "client_kwargs.endpoint"
    assert refused.value.reason == "has no obstore equivalent"
    options.finish(IGNORED_COMMON)  # block_size changes no GET; the table was taken
    with pytest.raises(Refused, match="block_size"):
        Options({"block_size": 5}).finish()


def test_a_table_option_that_is_not_a_mapping_is_refused_by_name():
    with pytest.raises(Refused) as refused:
        Options({"client_kwargs": ["endpoint_url"]}).nested("client_kwargs")
    assert refused.value.option == "client_kwargs"


@pytest.mark.parametrize(("value", "expected"), [(True, True), ("false", False), ("1", True)])
def test_booleans_are_read_from_words(value, expected):
    assert as_bool(Options({}), "anon", value) is expected


def test_a_value_that_is_no_boolean_is_refused_naming_the_option():
    with pytest.raises(Refused) as refused:
        as_bool(Options({}, "client_kwargs."), "use_ssl", 2)
    assert refused.value.option == "client_kwargs.use_ssl"
    assert "expected a boolean" in refused.value.reason


def test_tls_reads_a_ca_bundle_file_and_refuses_one_it_cannot_read(tmp_path):
    bundle = tmp_path / "ca.pem"
    bundle.write_bytes(b"-----BEGIN CERTIFICATE-----\n")
    options = Options({})
    assert tls(options, "verify", str(bundle)) == {"root_certificate": bundle.read_bytes()}
    assert tls(options, "verify", bundle) == {"root_certificate": bundle.read_bytes()}
    assert tls(options, "verify", False) == {"allow_invalid_certificates": True}
    assert tls(options, "verify", True) == tls(options, "verify", None) == {}
    with pytest.raises(Refused, match="cannot read the CA bundle"):
        tls(options, "verify", str(tmp_path / "missing.pem"))
    with pytest.raises(Refused, match="a int is not a CA bundle path"):
        tls(options, "verify", 3)


def test_only_a_plain_http_endpoint_allows_http():
    assert http_endpoint("HTTP://127.0.0.1:9000") == {"allow_http": True}
    assert http_endpoint("https://s3.example.com") == {}


@pytest.mark.usefixtures("no_ambient_credentials")
def test_real_s3_options_become_obstore_config(tmp_path):
    bundle = tmp_path / "ca.pem"
    bundle.write_bytes(b"pem")
    spec = map_options(
        "s3",
        {
            "key": "AKIDEXAMPLE",
            "secret": "s3cr3t",
            "default_block_size": 2**20,  # ignored: it changes no GET
            "client_kwargs": {"endpoint_url": "http://127.0.0.1:9000", "verify": str(bundle)},
        },
    )
    assert isinstance(spec, StoreSpec) and spec.kind == "s3"
    assert spec.client["allow_http"] is True and spec.client["root_certificate"] == b"pem"
    assert "s3cr3t" in spec.secrets
    assert "s3cr3t" not in repr(spec) and "s3cr3t" not in spec.shown


@pytest.mark.usefixtures("no_ambient_credentials")
def test_a_real_option_left_unmapped_is_named_and_a_bad_boolean_too():
    assert map_options("s3", {"anon": True, "client_kwargs": {"endpoint": "h"}}) == Unmappable(
        "client_kwargs.endpoint", "has no obstore equivalent"
    )
    assert map_options("s3", {"anon": [1]}).option == "anon"


def test_equal_configurations_share_a_key_and_secrets_are_never_shown():
    one = StoreSpec("s3", {"region": "r", "secret": "x"}, {"allow_http": True}, secrets=("x",))
    same = StoreSpec("s3", {"secret": "x", "region": "r"}, {"allow_http": True}, secrets=("x",))
    other = StoreSpec("s3", {"region": "r", "secret": "y"}, {"allow_http": True})
    assert one.key == same.key != other.key
    assert "'x'" not in repr(one) and "x" not in one.shown
