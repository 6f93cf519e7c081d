"""Any backend not known here (storage/backends/other.py): located by every option it was
built with (memory files by their path alone), versioned by the usual field names."""

from __future__ import annotations

import fsspec
import pytest
from fsspec.implementations.memory import MemoryFileSystem

from fsspec_shards.storage.backends import backend_for
from fsspec_shards.storage.backends.other import OtherBackend
from fsspec_shards.storage.transfer.streams import CatFileTransport, transport_for


class Remote(fsspec.AbstractFileSystem):
    """A user's own backend: where its objects live is in its options."""

    protocol = "remote-of-mine"

    def __init__(self, host: str = "a", **kwargs) -> None:
        super().__init__(host=host, **kwargs)


@pytest.mark.parametrize("protocol", ["memory", "sftp", "hdfs", "remote-of-mine"])
def test_a_protocol_not_known_here_falls_back_to_other(protocol):
    assert isinstance(backend_for(protocol), OtherBackend)


other = backend_for("remote-of-mine")
location = other.location


def test_a_backend_built_with_other_options_is_elsewhere():
    one = location(Remote(host="a", skip_instance_cache=True))
    assert one.startswith("options=")
    assert one == location(Remote(host="a", skip_instance_cache=True))
    assert one != location(Remote(host="b", skip_instance_cache=True))


def test_fsspecs_instance_options_say_nothing_about_where_objects_live():
    plain = location(Remote(host="a", skip_instance_cache=True))
    cached = Remote(host="a", skip_instance_cache=True, use_listings_cache=False)
    assert location(cached) == plain


def test_memory_files_are_located_by_their_path_alone():
    assert location(MemoryFileSystem()) == ""


def test_the_usual_version_fields_and_nothing_tamed():
    assert other.version_fields.read({"ETag": '"e"', "mtime": 3.0}) == ('"e"', None, 3.0)
    assert other.version_fields.read({"updated": "2024-01-01"}) == (None, None, "2024-01-01")
    fs = Remote(skip_instance_cache=True)
    assert other.checksums({"md5": "00"}) == [] and other.socket_timeouts(fs) == []
    assert backend_for("remote-of-mine").tamed_options({"host": "a"}, 1.0) == {
        "host": "a",
        "skip_instance_cache": True,
    }
    assert isinstance(transport_for(fs), CatFileTransport)  # no streaming transport known
