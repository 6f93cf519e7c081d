"""fsspec's private parts we use (``storage/deps/fsspec.py``): these fail when fsspec
changes them."""

from __future__ import annotations

import inspect

import fsspec
import pytest
from fsspec.implementations.http import HTTPFileSystem

from fsspec_shards.storage.deps import fsspec as deps


@pytest.mark.parametrize(
    "protocol, url, path",
    [
        ("memory", "memory://dir/a.tar", "/dir/a.tar"),
        ("file", "file:///tmp/a.tar", "/tmp/a.tar"),
        ("s3", "s3://bucket/key/a.tar", "bucket/key/a.tar"),
        ("s3", "bucket/key/a.tar", "bucket/key/a.tar"),
    ],
)
def test_strip_protocol_gives_the_backends_own_path(protocol, url, path):
    cls = fsspec.get_filesystem_class(protocol)
    assert deps.strip_protocol(cls, url) == path
    assert deps.strip_protocol(fsspec.filesystem(protocol, skip_instance_cache=True), url) == path


class _Response:
    """Only what ``_raise_not_found_for_status`` reads: the status, and raise_for_status."""

    def __init__(self, status: int) -> None:
        self.status = status
        self.raised = False

    def raise_for_status(self) -> None:
        self.raised = True


def test_the_http_status_check_raises_file_not_found_for_a_404_and_defers_the_rest():
    parameters = list(inspect.signature(HTTPFileSystem._raise_not_found_for_status).parameters)
    assert parameters == ["self", "response", "url"]
    fs = fsspec.filesystem("http", skip_instance_cache=True)
    with pytest.raises(FileNotFoundError):
        deps.raise_for_http_status(fs, _Response(404), "http://host/x")
    other = _Response(503)
    deps.raise_for_http_status(fs, other, "http://host/x")
    assert other.raised


def test_the_default_strip_protocol_on_a_class_of_ones_own_uses_its_protocols():
    class Named:
        protocol = ("x", "y")
        root_marker = "/"
        _strip_protocol = deps.default_strip_protocol()

    assert Named._strip_protocol("y://bucket/key/") == "bucket/key"
    assert Named._strip_protocol("x://") == "/"


def test_kwargs_from_url_are_what_the_url_gives_its_filesystem():
    s3 = fsspec.get_filesystem_class("s3")
    assert deps.kwargs_from_url(s3, "s3://bucket/k?versionId=1") == {"version_aware": True}
    assert deps.kwargs_from_url(s3, "s3://bucket/k") == {}
