"""Which object a path names: the identity behind every cache key.

Invariants:

- Two different objects never share a key. The key covers the protocol, the backend's
  location (S3 endpoint as botocore resolves it, :func:`.backends.s3.location`, or profile
  and region on AWS; GCS endpoint; Azure account
  endpoint; HTTP scheme+host+port, in the URL itself; for any other backend every option it
  was built with), the path, and the whole query string except signing parameters
  (:func:`fsspec_shards.redact.without_signing`): ``?key=shard-1`` and ``?key=shard-2`` are
  two objects, a URL signed again is the same one.
- A key is a SHA-256 hex digest: it can name files and index rows, and shows no secret.
  :data:`KEY_FORMAT` is hashed in, so keys of another format never match (old cache
  entries become misses).
- ``shown`` is the only text of an identity meant for people: redacted.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import fsspec
from fsspec.utils import tokenize

from fsspec_shards.redact import redact_url, without_signing
from fsspec_shards.storage.backends import s3

KEY_FORMAT = "fsspec-shards-key-v3"  # v3: S3 endpoints from config files, as botocore
_PATH_IS_ADDRESS = frozenset({"http", "https", "file", "local", "memory"})
# options of every fsspec filesystem that say nothing about where its objects live
_NOT_LOCATION = frozenset(
    {
        "skip_instance_cache",
        "use_listings_cache",
        "listings_expiry_time",
        "max_paths",
        "loop",
        "asynchronous",
    }
)


@dataclass(frozen=True)
class ObjectId:
    """One object: ``key`` for the cache (secret-free digest), ``shown`` for display."""

    key: str
    shown: str

    def __str__(self) -> str:
        return self.shown


def backend_location(fs: fsspec.AbstractFileSystem) -> str:
    """Where the backend's objects live, beyond what the path says: the service endpoint
    (S3-compatible servers, GCS emulators, Azure accounts), or, for backends not known here,
    every option the backend was built with. Empty where the path is the whole address
    (http URLs, local and in-memory files)."""
    protocol = fs.protocol[0] if isinstance(fs.protocol, tuple | list) else fs.protocol
    if protocol in ("s3", "s3a"):
        return str(s3.location_of(fs))
    if protocol in ("gs", "gcs"):
        return f"endpoint={getattr(fs, '_location', None) or 'https://storage.googleapis.com'}"
    if protocol in ("az", "abfs", "abfss", "adl"):
        client = getattr(fs, "service_client", None)
        url = getattr(client, "url", None) or getattr(fs, "account_url", None) or ""
        account = getattr(fs, "account_name", None) or ""
        return f"account={account};endpoint={url.split('?', 1)[0].rstrip('/')}"
    if protocol in _PATH_IS_ADDRESS:
        return ""
    options = {k: v for k, v in fs.storage_options.items() if k not in _NOT_LOCATION}
    return "options=" + tokenize(type(fs).__name__, fs.storage_args, options)


def object_id(fs: fsspec.AbstractFileSystem, path: str, location: str | None = None) -> ObjectId:
    """The identity of ``path`` (a backend path) on backend ``fs``; ``location`` as
    :func:`backend_location` gives it, when the caller keeps it."""
    url = fs.unstrip_protocol(path)
    protocol = fs.protocol[0] if isinstance(fs.protocol, tuple | list) else fs.protocol
    where = backend_location(fs) if location is None else location
    text = "\0".join((KEY_FORMAT, protocol, where, without_signing(url)))
    return ObjectId(hashlib.sha256(text.encode("utf-8")).hexdigest(), redact_url(url))
