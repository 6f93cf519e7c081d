"""What the wds layer needs to know about each backend: one module per backend (``local``,
``http``, ``s3``, ``gcs``, ``azure``, and ``other`` for any backend not known here), each
holding that backend's facts; this package picks the module of a protocol and applies it.

- Taming: every backend library retries on its own (botocore x s3fs make 25 GETs over ~40 s
  on a 503 burst, gcsfs 6 tries over ~33 s, the Azure SDK waits 15 s before its first retry).
  Nested under our own retries those attempts multiply and stalls go unnoticed, so the
  backend is built with its own retries turned down to one attempt, unless the user set
  them explicitly.
- Listings never go stale: the private instance is built with its listing cache off, so
  ``info()`` before a download asks the server.
- Calls with a time-out, so that a stalled request becomes a retryable ``TimeoutError``;
  the shortest socket time-out the user gave the backend (:func:`backend_timeout`) bounds
  the layer's own streaming too.
- One metadata request before a download: gcsfs's ``info()`` asks for the object and lists
  its prefix at once (to recognise a directory); :func:`file_info` asks for the object only
  and leaves directories and missing paths to ``info()``.
- The identity of an object (to notice a cached copy went stale) and the checksums that
  come for free in its ``info()``.

A backend module has: ``PROTOCOLS``; ``location(fs)`` (for the cache key);
``VERSION_FIELDS``; ``checksums(info)``; ``socket_timeouts(fs)``;
``tamed_options(options, timeout)``; ``tame_instance(fs)``; where its options can be
checked, ``passed_on()`` and ``OPTION_TABLES`` (``backend_options`` applies them); and,
where obstore has a store for it, ``obstore_store(options)`` (``obstore_options``); and,
where obstore's HEAD carries every field of its ``info()`` that the layer reads,
``info_from_head(meta, name)``.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import fsspec
from fsspec.asyn import sync

from fsspec_shards.storage.backends import azure, gcs, http, local, other, s3
from fsspec_shards.storage.backends.fields import protocol_of
from fsspec_shards.storage.backends.mapping import FSSPEC_INSTANCE_OPTIONS
from fsspec_shards.storage.core.integrity import Checksum

__all__ = ["FSSPEC_INSTANCE_OPTIONS", "protocol_of"]  # for the filesystem and the chores

_KNOWN = (s3, gcs, azure, http, local)
_BY_PROTOCOL = {protocol: module for module in _KNOWN for protocol in module.PROTOCOLS}
REMOTE_PROTOCOLS = s3.PROTOCOLS + gcs.PROTOCOLS + azure.PROTOCOLS + http.PROTOCOLS


def backend_of(protocol: str) -> types.ModuleType:
    """The module holding the facts of backend ``protocol`` (``other`` when not known)."""
    return _BY_PROTOCOL.get(protocol, other)


def tamed_target_options(protocol: str, options: dict[str, Any], timeout: float) -> dict[str, Any]:
    """``options`` for building the backend, with its own retries at one attempt, its socket
    time-outs at ``timeout`` and its listing cache off; whatever the user set explicitly for
    retries and time-outs is kept."""
    options = dict(options)
    # a private instance (it is adjusted after it is built, see tame_instance: a user's own
    # instance of the same backend keeps its behaviour) whose listings are never stale
    options["skip_instance_cache"] = True
    if protocol in REMOTE_PROTOCOLS:
        options["use_listings_cache"] = False
    return backend_of(protocol).tamed_options(options, timeout)


def backend_timeout(fs: fsspec.AbstractFileSystem) -> float | None:
    """The shortest socket time-out configured on backend ``fs`` (each backend module's
    ``socket_timeouts``), or None."""
    numbers = [
        float(value)
        for value in backend_of(protocol_of(fs)).socket_timeouts(fs)
        if isinstance(value, int | float) and not isinstance(value, bool) and value > 0
    ]
    return min(numbers) if numbers else None


def tame_instance(fs: fsspec.AbstractFileSystem, protocol: str) -> None:
    """Turn down the retries that a backend only exposes on the built instance."""
    backend_of(protocol).tame_instance(fs)


def location(fs: fsspec.AbstractFileSystem) -> str:
    """Where backend ``fs``'s objects live beyond what the path says (for the cache key)."""
    return backend_of(protocol_of(fs)).location(fs)


def call(fs: fsspec.AbstractFileSystem, method: str, *args: Any, timeout: float | None, **kwargs):
    """``fs.<method>(*args, **kwargs)``; for async backends bounded by ``timeout`` seconds, so a
    stalled request raises ``fsspec.exceptions.FSTimeoutError`` (a ``TimeoutError``)."""
    coroutine = getattr(fs, "_" + method, None)
    if (
        timeout
        and getattr(fs, "async_impl", False)
        and not getattr(fs, "asynchronous", False)
        and coroutine is not None
    ):
        return sync(fs.loop, coroutine, *args, timeout=timeout, **kwargs)
    return getattr(fs, method)(*args, **kwargs)


def file_info(fs: fsspec.AbstractFileSystem, path: str, timeout: float | None) -> dict[str, Any]:
    """``fs.info(path)`` for a path about to be read as a file, in one request on gcsfs (whose
    ``info`` also lists the prefix); when that finds no object, ``info`` says what is there
    (a directory, or nothing)."""
    if protocol_of(fs) in gcs.PROTOCOLS and not fs.asynchronous:
        from fsspec_shards.storage.deps import gcsfs as gcsfs_deps

        try:
            return sync(fs.loop, gcsfs_deps.get_object, fs, path, timeout=timeout)
        except FileNotFoundError:
            pass
    return call(fs, "info", path, timeout=timeout)


def info_from_head(protocol: str) -> Callable[[dict[str, Any], str], dict[str, Any]] | None:
    """How the backend's ``info()`` of an object (its name: ``bucket/key``) is made from
    obstore's answer to a HEAD of it, where that answer carries every field of the backend's
    ``info()`` that the version and checksum rules read (its module's ``info_from_head``:
    S3); None elsewhere (GCS's and Azure's ``info()`` carry checksums that obstore's answer
    does not)."""
    return getattr(backend_of(protocol), "info_from_head", None)


def object_identity(info: dict[str, Any]) -> str:
    """A string that changes when the object is replaced: generation / version / ETag, else
    modification time; always with the size."""
    parts = []
    for key in ("generation", "VersionId", "version_id", "ETag", "etag"):
        value = info.get(key)
        if value:
            parts.append(f"{key}={str(value).strip(chr(34))}")
    if not parts:
        for key in (
            "mtime",
            "LastModified",
            "last_modified",
            "Last-Modified",
            "updated",
            "created",
        ):
            value = info.get(key)
            if value:
                parts.append(f"{key}={value}")
                break
    parts.append(f"size={info.get('size')}")
    return ";".join(parts)


def backend_checksums(protocol: str, info: dict[str, Any]) -> list[Checksum]:
    """Checksums the backend already knows for the object, from its ``info()``."""
    return backend_of(protocol).checksums(info)
