"""gcsfs's private parts we use (``storage/deps/gcsfs.py``): these fail when gcsfs changes
them."""

from __future__ import annotations

import inspect

import fsspec
import gcsfs
import pytest

from fsspec_shards.storage.deps import gcsfs as deps


def _gcs(**options):
    return fsspec.filesystem("gcs", skip_instance_cache=True, token="anon", **options)


def test_the_endpoint_is_kept_where_we_read_it(monkeypatch):
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    assert deps.endpoint(_gcs()) in (None, "https://storage.googleapis.com")
    assert deps.endpoint(_gcs(endpoint_url="http://127.0.0.1:4443")) == "http://127.0.0.1:4443"
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:4444")
    assert deps.endpoint(_gcs()) == "http://127.0.0.1:4444"


def test_the_request_keeps_its_undecorated_self_for_us_to_bind():
    wrapped = gcsfs.GCSFileSystem._request.__wrapped__
    assert inspect.iscoroutinefunction(wrapped)
    fs = _gcs()
    assert deps.request_without_retries(fs)
    assert fs._request.__func__ is wrapped


@pytest.mark.parametrize(
    "name, parameters",
    [
        ("_get_object", ["self", "path"]),
        ("_get_headers", ["self", "headers"]),
        ("_get_params", ["self", "kwargs"]),
        ("_set_session", ["self"]),
    ],
)
def test_the_media_request_parts_take_what_we_give(name, parameters):
    method = getattr(gcsfs.GCSFileSystem, name)
    assert list(inspect.signature(method).parameters)[: len(parameters)] == parameters
    if name in ("_get_object", "_set_session"):
        assert inspect.iscoroutinefunction(method)


def test_headers_and_params_come_back_as_mappings():
    fs = _gcs()
    assert fs._get_headers({"Range": "bytes=0-1"})["Range"] == "bytes=0-1"
    assert isinstance(fs._get_params({}), dict)
