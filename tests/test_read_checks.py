"""What a read through ``wds`` verifies of a file no manifest names."""

from __future__ import annotations

import base64
import hashlib

import fsspec
from fsspec.implementations.local import LocalFileSystem

from fsspec_shards.storage import backend_checks


class GcsLikeFileSystem(LocalFileSystem):
    """Local files described as gcs describes objects: with their md5 in ``info()``."""

    protocol = ("gcs",)

    def info(self, path, **kwargs):
        info = super().info(path, **kwargs)
        with open(info["name"], "rb") as file:
            digest = hashlib.md5(file.read()).digest()
        return {**info, "md5Hash": base64.b64encode(digest).decode()}


def test_a_backend_without_checksums_is_checked_by_size_only(tmp_path):
    (tmp_path / "a.tar").write_bytes(b"x" * 10)
    fs = fsspec.filesystem("wds", target_protocol="file", cache_dir=str(tmp_path / "cache"))
    assert backend_checks(fs, str(tmp_path / "a.tar")) == ()


def test_the_checksums_a_backend_gives_are_verified_unless_verify_says_size(tmp_path):
    (tmp_path / "a.tar").write_bytes(b"x" * 10)
    path = str(tmp_path / "a.tar")
    checked = fsspec.filesystem(
        "wds", fs=GcsLikeFileSystem(), cache=False, skip_instance_cache=True
    )
    sized = fsspec.filesystem(
        "wds", fs=GcsLikeFileSystem(), cache=False, verify="size", skip_instance_cache=True
    )
    assert backend_checks(checked, path) == ("md5",)
    assert backend_checks(sized, path) == ()
