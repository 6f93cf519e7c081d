"""What the wds layer needs to know about each backend: one :class:`~.base.Backend` per
backend (``local``, ``http``, ``s3``, ``gcs``, ``azure``, and ``other`` for any backend not
known here), each in its module; :func:`backend_for` picks the one of a protocol.

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
- Failure names: each backend's (``Backend.errors``) are taught to the retry
  classification (``core/retry.py``) when this package is imported.
"""

from __future__ import annotations

from fsspec_shards.storage.backends.azure import AzureBackend
from fsspec_shards.storage.backends.base import Backend
from fsspec_shards.storage.backends.gcs import GcsBackend
from fsspec_shards.storage.backends.http import HttpBackend
from fsspec_shards.storage.backends.local import LocalBackend
from fsspec_shards.storage.backends.other import OtherBackend
from fsspec_shards.storage.backends.s3 import S3Backend
from fsspec_shards.storage.core import retry

BACKENDS: tuple[Backend, ...] = (
    S3Backend(),
    GcsBackend(),
    AzureBackend(),
    HttpBackend(),
    LocalBackend(),
)
"""Every backend known here."""
OTHER = OtherBackend()
_BY_PROTOCOL = {protocol: backend for backend in BACKENDS for protocol in backend.protocols}

for _backend in (*BACKENDS, OTHER):
    retry.learn(_backend.errors)


def backend_for(protocol: str) -> Backend:
    """The backend of ``protocol`` (:data:`OTHER` when not known here)."""
    return _BY_PROTOCOL.get(protocol, OTHER)
