"""What a read through ``wds`` verifies of a file no manifest names: every checksum its
backend gives (under ``verify="auto"``), else only the size."""

from __future__ import annotations

from fsspec_shards.storage.backends import backend_for
from fsspec_shards.storage.backends.base import protocol_of
from fsspec_shards.storage.core.verification import expected
from fsspec_shards.storage.filesystem import WdsFileSystem


def backend_checks(fs: WdsFileSystem, path: str) -> tuple[str, ...]:
    """The checksum algorithms a read of ``path`` through ``fs`` verifies without a
    manifest; empty when only the size is checked (local files, most HTTP, verify off)."""
    found = backend_for(protocol_of(fs.fs)).checksums(fs.info(path))
    return expected((), found, fs.options.verify).algorithms
