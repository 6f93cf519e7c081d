"""Local files (fsspec's ``file``): the path is the whole address; the modification time
names a version; no checksum comes for free, no time-out, no retries to tame."""

from __future__ import annotations

from fsspec_shards.storage.backends.base import Backend
from fsspec_shards.storage.backends.versions import VersionFields


class LocalBackend(Backend):
    """fsspec's local files."""

    protocols = ("file", "local")
    version_fields = VersionFields(
        etag=("ETag", "etag"), modified=("mtime", "LastModified", "updated")
    )

    def passed_on(self) -> set[str]:
        """Nothing: the backend takes its own parameters only."""
        return set()
