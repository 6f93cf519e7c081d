"""What the wds layer needs to know about each backend: one :class:`~.base.Backend` per
backend (``local``, ``http``, ``s3``, ``gcs``, ``azure``, and ``other`` for any backend not
known here), each in its module; :func:`backend_for` picks the one of a protocol, importing
its module on first ask (:data:`MODULES`: a process reading S3 imports no Azure, GCS or HTTP
code), and :func:`object_id` names an object: the identity behind every cache key.

- Taming: every backend library retries on its own (botocore x s3fs make 25 GETs over ~40 s
  on a 503 burst, gcsfs 6 tries over ~33 s, the Azure SDK waits 15 s before its first retry).
  Nested under our own retries those attempts multiply and stalls go unnoticed, so the
  backend is built with its own retries turned down to one attempt, unless the user set
  them explicitly.
- Listings never go stale: the private instance is built with its listing cache off, so
  ``info()`` before a download asks the server.
- Calls with a time-out, so that a stalled request becomes a retryable ``TimeoutError``;
  the shortest socket time-out the user gave the backend (``Backend.timeout``) bounds
  the layer's own streaming too.
- One metadata request before a download: gcsfs's ``info()`` asks for the object and lists
  its prefix at once (to recognise a directory); ``Backend.file_info`` asks for the object
  only and leaves directories and missing paths to ``info()``.
- The identity of an object (to notice a cached copy went stale) and the checksums that
  come for free in its ``info()``.
- Failure names: every backend's (``Backend.errors``, all in ``failure_names.py``, which
  imports no backend module) are taught to the retry classification (``core/retry.py``)
  when this package is imported, before any backend is asked for: a failure is classified
  with every name known, whichever backend modules are imported.

Object identity. Invariants:

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
import importlib
import os
import threading
from dataclasses import dataclass

import fsspec

from fsspec_shards.redact import redact_url, without_signing
from fsspec_shards.storage.backends import failure_names
from fsspec_shards.storage.backends.base import Backend, protocol_of
from fsspec_shards.storage.backends.local import LocalBackend
from fsspec_shards.storage.backends.other import OtherBackend
from fsspec_shards.storage.core import retry

MODULES: dict[str, tuple[str, str]] = {
    "s3": ("s3", "S3Backend"),
    "s3a": ("s3", "S3Backend"),
    "gs": ("gcs", "GcsBackend"),
    "gcs": ("gcs", "GcsBackend"),
    "az": ("azure", "AzureBackend"),
    "abfs": ("azure", "AzureBackend"),
    "abfss": ("azure", "AzureBackend"),
    "adl": ("azure", "AzureBackend"),
    "http": ("http", "HttpBackend"),
    "https": ("http", "HttpBackend"),
    "file": ("local", "LocalBackend"),
    "local": ("local", "LocalBackend"),
}
"""Every protocol known here: the module (in this package) and class of its backend."""
OTHER = OtherBackend()
_made: dict[tuple[str, str], Backend] = {}
_made_lock = threading.Lock()

retry.learn(failure_names.EVERY)


def backend_for(protocol: str) -> Backend:
    """The backend of ``protocol`` (:data:`OTHER` when not known here), its module imported
    on the first ask; one instance per backend."""
    place = MODULES.get(protocol)
    if place is None:
        return OTHER
    backend = _made.get(place)
    if backend is not None:
        return backend
    with _made_lock:
        backend = _made.get(place)
        if backend is None:
            module = importlib.import_module(f"{__name__}.{place[0]}")
            backend = _made[place] = getattr(module, place[1])()
        return backend


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
