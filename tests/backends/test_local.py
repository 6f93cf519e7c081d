"""Local files (storage/backends/local.py): the path is the whole address, the modification
time names the version; no checksum, socket time-out or retries to tame."""

from __future__ import annotations

import fsspec

from fsspec_shards.storage.backends import backend_for
from fsspec_shards.storage.backends.local import LocalBackend
from fsspec_shards.storage.backends.versions import expected_version

local = backend_for("file")


def test_both_names_of_fsspecs_local_filesystem_are_this_backend():
    assert backend_for("file") is backend_for("local")
    assert isinstance(local, LocalBackend)
    assert set(local.protocols) == set(fsspec.filesystem("file").protocol)


def test_a_local_files_version_is_its_modification_time(tmp_path):
    path = tmp_path / "shard.tar"
    path.write_bytes(b"x" * 10)
    info = fsspec.filesystem("file").info(str(path))
    etag, version, modified = local.version_fields.read(info)
    assert (etag, version, modified) == (None, None, info["mtime"])
    expected = expected_version(local.version_fields, info)
    assert expected.size == 10 and expected.modified == int(info["mtime"])


def test_the_path_is_the_whole_address_whatever_the_options(tmp_path):
    fs = fsspec.filesystem("file", auto_mkdir=True, skip_instance_cache=True)
    assert local.location(fs) == ""
    assert local.location(fsspec.filesystem("file")) == ""


def test_nothing_is_passed_on_checksummed_or_tamed(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"data")
    fs = fsspec.filesystem("file")
    assert local.checksums(fs.info(str(path))) == []
    assert local.socket_timeouts(fs) == []
    assert local.passed_on() == set() and local.option_tables == {}
    options = {"auto_mkdir": True}
    assert local.tamed_options(options, 5.0) == {
        "auto_mkdir": True,
        "skip_instance_cache": True,  # a private instance, no listing cache to turn off
    }
