"""Any backend not known here (memory, ssh, hdfs, a user's own, ...): located by every
option it was built with (in-memory files by their path alone), its version by the usual
field names, no checksum, time-out or retries known; the failure names of the synchronous
HTTP clients such backends (and gcsfs's authentication) use."""

from __future__ import annotations

import fsspec
from fsspec.utils import tokenize

from fsspec_shards.storage.backends import failure_names
from fsspec_shards.storage.backends.base import FSSPEC_INSTANCE_OPTIONS, Backend, protocol_of
from fsspec_shards.storage.backends.versions import VersionFields

_PATH_IS_ADDRESS = ("memory",)


class OtherBackend(Backend):
    """A backend known by its protocol only."""

    version_fields = VersionFields(
        etag=("ETag", "etag"),
        version=("generation", "VersionId", "version_id"),
        modified=("mtime", "LastModified", "last_modified", "Last-Modified", "updated", "created"),
    )
    errors = failure_names.OTHER

    def location(self, fs: fsspec.AbstractFileSystem) -> str:
        """Every option ``fs`` was built with (bar fsspec's instance options, which say
        nothing about where objects live), for a backend whose path is not the whole
        address."""
        if protocol_of(fs) in _PATH_IS_ADDRESS:
            return ""
        options = {k: v for k, v in fs.storage_options.items() if k not in FSSPEC_INSTANCE_OPTIONS}
        return "options=" + tokenize(type(fs).__name__, fs.storage_args, options)
