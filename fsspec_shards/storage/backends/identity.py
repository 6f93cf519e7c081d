"""Which object a path names: the identity behind every cache key.

Invariants:

- Two different objects never share a key. The key covers the protocol, the backend's
  location (each backend's ``location``: S3 endpoint as botocore resolves it, or
  profile and region on AWS; GCS endpoint; Azure account endpoint; HTTP scheme+host+port,
  in the URL itself; for any other backend every option it was built with), the path,
  and the whole query string except signing parameters
  (:func:`fsspec_shards.redact.without_signing`): ``?key=shard-1`` and ``?key=shard-2`` are
  two objects, a URL signed again is the same one.
- One object, one key, however its path is spelled where the backend resolves spellings:
  a local path is keyed as :func:`os.path.realpath` gives it (``.``, ``..``, ``//`` and
  symlinks resolved, as the OS resolves them), so a write under one spelling drops what a
  read cached under another. Any other backend's path is keyed as its own
  ``_strip_protocol`` gives it: on object stores ``a//b`` and ``a/./b`` are other objects.
- A key is a SHA-256 hex digest: it can name files and index rows, and shows no secret.
  :data:`KEY_FORMAT` is hashed in, so keys of another format never match (old cache
  entries become misses).
- ``shown`` is the only text of an identity meant for people: redacted.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass

import fsspec

from fsspec_shards.redact import redact_url, without_signing
from fsspec_shards.storage.backends import backend_for
from fsspec_shards.storage.backends.fields import protocol_of
from fsspec_shards.storage.backends.local import LocalBackend

KEY_FORMAT = "fsspec-shards-key-v3"  # v3: S3 endpoints from config files, as botocore


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
    (http URLs, local and in-memory files). Each backend says (``Backend.location``)."""
    return backend_for(protocol_of(fs)).location(fs)


def keyed_path(fs: fsspec.AbstractFileSystem, path: str) -> str:
    """``path`` (a backend path) as its key names it: a local path resolved, so that every
    spelling of one file is one object; any other backend's path unchanged."""
    if protocol_of(fs) in LocalBackend.protocols:
        return os.path.realpath(path)
    return path


def object_id(fs: fsspec.AbstractFileSystem, path: str) -> ObjectId:
    """The identity of ``path`` (a backend path) on backend ``fs``; ``shown`` keeps the
    spelling the caller used."""
    url = fs.unstrip_protocol(keyed_path(fs, path))
    text = "\0".join((KEY_FORMAT, protocol_of(fs), backend_location(fs), without_signing(url)))
    return ObjectId(
        hashlib.sha256(text.encode("utf-8")).hexdigest(), redact_url(fs.unstrip_protocol(path))
    )
