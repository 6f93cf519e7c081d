"""The transport choice (auto/obstore/fsspec), paths, stores and errors of the obstore
transport. Requests against real servers are in tests/integration/test_obstore_transport.py.
"""

from __future__ import annotations

import logging
import pickle
import threading
import time

import pytest

from fsspec_shards.storage.backends.versions import VersionMismatch
from fsspec_shards.storage.core.retry import is_transient
from fsspec_shards.storage.transfer.obstore_transport import (
    HttpStatusError,
    ObstoreTransport,
    choose_transport,
)
from tests.obstore_helpers import (
    AZ_KEY,
    AZURITE_CS,
    S3_ENDPOINT,
    SAS,
    SERVICE_ACCOUNT,
    basic_auth,
    no_ambient_credentials,  # noqa: F401 - the fixture
    refusal_of,
    spec_of,
)

pytest.importorskip("obstore")
pytestmark = pytest.mark.usefixtures("no_ambient_credentials")


# --------------------------------------------------------------------------- choice


@pytest.mark.parametrize("protocol", ["file", "memory", "ftp", "hf"])
def test_protocols_without_an_obstore_store_are_refused(protocol):
    assert refusal_of(protocol, {}).option == "target_protocol"


def test_transport_fsspec_never_uses_obstore():
    assert choose_transport("s3", {"anon": True}, "fsspec") is None


def test_transport_auto_uses_obstore_when_the_options_map():
    assert isinstance(choose_transport("s3", {"anon": True}, "auto"), ObstoreTransport)


def test_transport_auto_falls_back_to_fsspec_and_says_why_at_debug(caplog):
    with caplog.at_level(logging.DEBUG, logger="fsspec_shards.storage.transfer.obstore_transport"):
        assert choose_transport("s3", {"anon": True, "session": object()}, "auto") is None
    assert "session" in caplog.text


def test_transport_obstore_raises_naming_the_option():
    with pytest.raises(ValueError, match="'client_kwargs.connector'"):
        choose_transport("http", {"client_kwargs": {"connector": object()}}, "obstore")


def test_an_unknown_transport_is_refused():
    with pytest.raises(ValueError, match="transport must be one of auto, obstore, fsspec"):
        choose_transport("s3", {}, "rust")


@pytest.mark.parametrize(
    ("protocol", "options", "secret"),
    [
        ("s3", {"key": "AKID", "secret": "s3cr3tvalue", **S3_ENDPOINT}, "s3cr3tvalue"),
        ("az", {"connection_string": AZURITE_CS}, AZ_KEY),
        ("az", {"account_name": "acct", "sas_token": SAS}, "S1gnatur3"),
        ("gcs", {"token": SERVICE_ACCOUNT}, "PRIVATE"),
        ("http", {"client_kwargs": {"auth": basic_auth("u", "pa55word")}}, "pa55word"),
    ],
)
def test_no_secret_shows_in_a_spec_or_a_transport(protocol, options, secret):
    spec = spec_of(protocol, options)
    transport = ObstoreTransport(protocol, spec)
    for text in (repr(spec), str(spec), spec.shown, repr(transport), spec.key):
        assert secret not in text


def test_a_refusal_shows_no_secret():
    refusal = refusal_of("az", {"connection_string": AZURITE_CS, "surprise": "x"})
    assert AZ_KEY not in str(refusal)


# --------------------------------------------------------------------------- paths


@pytest.mark.parametrize(
    ("protocol", "options", "path", "reason"),
    [
        ("http", {}, "http://h/a?sig=x", "query"),
        ("http", {}, "http://user:pw@h/a", "credentials"),
        ("s3", {"anon": True}, "bucket/a//b", "cannot address"),
        ("s3", {"anon": True}, "bucket/", "cannot address"),
        ("gcs", {"token": "anon"}, "bucket/a#123", "query or fragment"),
        ("az", {"account_name": "a", "anon": True}, "container/a/../b", "cannot address"),
    ],
)
def test_paths_obstore_cannot_address_are_left_to_fsspec(protocol, options, path, reason):
    transport = ObstoreTransport(protocol, spec_of(protocol, options))
    assert reason in transport.unserved_reason(path)
    assert "pw" not in transport.unserved_reason(path)


@pytest.mark.parametrize(
    ("protocol", "options", "path", "located"),
    [
        ("s3", {"anon": True}, "bucket/a/b.tar", ("bucket", "a/b.tar", None)),
        ("s3", {"anon": True}, "s3://bucket/a/b.tar", ("bucket", "a/b.tar", None)),
        ("s3", {"anon": True}, "bucket/a.tar?versionId=v7", ("bucket", "a.tar", "v7")),
        ("http", {}, "http://h:81/d/a%20b.tar", ("http://h:81", "d/a b.tar", None)),
        ("az", {"account_name": "a", "anon": True}, "c/x.tar", ("c", "x.tar", None)),
    ],
)
def test_paths_split_into_store_and_key(protocol, options, path, located):
    transport = ObstoreTransport(protocol, spec_of(protocol, options))
    assert transport.unserved_reason(path) is None
    assert transport._locate(path) == located


def test_equal_options_share_stores_and_other_keys_do_not():
    options = {"key": "AKID", "secret": "one", **S3_ENDPOINT}
    assert spec_of("s3", options).key == spec_of("s3", dict(options)).key
    assert spec_of("s3", options).key != spec_of("s3", {**options, "secret": "two"}).key


def test_threads_asking_for_one_store_at_once_build_it_once():
    """A worker's first HEAD and its manifest's GETs ask for the same store together: one
    build (about 5 ms under the GIL each), the other waits for it."""
    transport = ObstoreTransport("s3", spec_of("s3", {"key": "AKID", "secret": "s", **S3_ENDPOINT}))
    real_build, built = transport._build, []
    both_asked = threading.Barrier(2)

    def slow_build(origin, timeout):
        built.append(origin)
        time.sleep(0.2)  # the other thread asks meanwhile
        return real_build(origin, timeout)

    transport._build = slow_build
    stores = []

    def ask():
        both_asked.wait()
        stores.append(transport._store("one-bucket", 7.0))

    threads = [threading.Thread(target=ask) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert built == ["one-bucket"]
    assert stores[0] is stores[1]
    assert transport._store("one-bucket", 7.0) is stores[0]


def test_errors_keep_their_status_across_processes():
    """Failures cross process boundaries (dask, multiprocessing) and must stay classified."""
    for error in (HttpStatusError(503, "GET x: 503"), VersionMismatch(116, "x changed")):
        copy = pickle.loads(pickle.dumps(error))
        assert (type(copy), str(copy)) == (type(error), str(error))
        assert getattr(copy, "status", None) == getattr(error, "status", None)
        assert is_transient(copy) is is_transient(error)
