"""Local files (fsspec's ``file``): the path is the whole address; the modification time
names a version; no checksum comes for free, no time-out, no retries to tame."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import fsspec

from fsspec_shards.storage.backends.fields import VersionFields
from fsspec_shards.storage.core.integrity import Checksum

PROTOCOLS = ("file", "local")
VERSION_FIELDS = VersionFields(etag=("ETag", "etag"), modified=("mtime", "LastModified", "updated"))


def location(fs: fsspec.AbstractFileSystem) -> str:
    """Nothing beyond the path."""
    return ""


def passed_on() -> set[str]:
    """Nothing: the backend takes its own parameters only."""
    return set()


OPTION_TABLES: dict = {}


def checksums(info: Mapping[str, Any]) -> list[Checksum]:
    """None: a local ``info()`` carries no digest."""
    return []


def socket_timeouts(fs: fsspec.AbstractFileSystem) -> list[Any]:
    """None: no sockets."""
    return []


def tamed_options(options: dict[str, Any], timeout: float) -> dict[str, Any]:
    """Unchanged: nothing to tame."""
    return options


def tame_instance(fs: fsspec.AbstractFileSystem) -> None:
    """Nothing to tame."""
