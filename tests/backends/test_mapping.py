"""What the obstore mappings are written with (storage/backends/mapping.py): options consumed
one by one, the first of several sources taken, what is left refused by name; and on real
backend options, the obstore config those rules make."""

from __future__ import annotations

import pytest

from fsspec_shards.storage.backends.mapping import (
    IGNORED_COMMON,
    Options,
    Refused,
    StoreSpec,
    as_bool,
    http_endpoint,
    tls,
)
from fsspec_shards.storage.backends.obstore_options import Unmappable, map_options
from tests.obstore_helpers import no_ambient_credentials  # noqa: F401 - the fixture


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
