"""Any backend not known here (memory, ssh, hdfs, a user's own, ...): located by every
option it was built with (in-memory files by their path alone), its version by the usual
field names, no checksum, time-out or retries known."""

from __future__ import annotations

import fsspec
from fsspec.utils import tokenize

from fsspec_shards.storage.backends.fields import VersionFields, protocol_of
from fsspec_shards.storage.backends.local import (
    checksums,
    socket_timeouts,
    tame_instance,
    tamed_options,
)
from fsspec_shards.storage.backends.mapping import FSSPEC_INSTANCE_OPTIONS

__all__ = ["checksums", "socket_timeouts", "tame_instance", "tamed_options"]

PROTOCOLS: tuple[str, ...] = ()
VERSION_FIELDS = VersionFields(etag=("ETag", "etag"), modified=("mtime", "LastModified", "updated"))
_PATH_IS_ADDRESS = ("memory",)


def location(fs: fsspec.AbstractFileSystem) -> str:
    """Every option ``fs`` was built with (bar fsspec's instance options, which say
    nothing about where objects live), for a backend whose path is not the whole address."""
    if protocol_of(fs) in _PATH_IS_ADDRESS:
        return ""
    options = {k: v for k, v in fs.storage_options.items() if k not in FSSPEC_INSTANCE_OPTIONS}
    return "options=" + tokenize(type(fs).__name__, fs.storage_args, options)
