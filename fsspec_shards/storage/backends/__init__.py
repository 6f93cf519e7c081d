"""What the wds layer needs to know about each backend.

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
"""

from __future__ import annotations

import base64
import binascii
import logging
import re
import types
from typing import Any

import fsspec
from fsspec.asyn import sync

from fsspec_shards.storage.backends import http
from fsspec_shards.storage.integrity import Checksum

logger = logging.getLogger("fsspec_shards.storage.backends")

S3_PROTOCOLS = ("s3", "s3a")
GCS_PROTOCOLS = ("gs", "gcs")
AZURE_PROTOCOLS = ("az", "abfs", "abfss", "adl")
HTTP_PROTOCOLS = ("http", "https")
FSSPEC_INSTANCE_OPTIONS = frozenset(
    {
        "skip_instance_cache",
        "use_listings_cache",
        "listings_expiry_time",
        "max_paths",
        "asynchronous",
        "loop",
    }
)
"""Options every fsspec filesystem takes: its instance cache, listing cache and async mode."""
_MODIFIED_KEYS = ("mtime", "LastModified", "last_modified", "Last-Modified", "updated", "created")
_PLAIN_MD5_ETAG = re.compile(r"^[0-9a-fA-F]{32}$")


def tamed_target_options(protocol: str, options: dict[str, Any], timeout: float) -> dict[str, Any]:
    """``options`` for building the backend, with its own retries at one attempt, its socket
    time-outs at ``timeout`` and its listing cache off; whatever the user set explicitly for
    retries and time-outs is kept."""
    options = dict(options)
    # a private instance (it is adjusted after it is built, see tame_instance: a user's own
    # instance of the same backend keeps its behaviour) whose listings are never stale
    options["skip_instance_cache"] = True
    if protocol in S3_PROTOCOLS + GCS_PROTOCOLS + AZURE_PROTOCOLS + HTTP_PROTOCOLS:
        options["use_listings_cache"] = False
    if protocol in S3_PROTOCOLS:
        config = dict(options.get("config_kwargs") or {})
        config.setdefault("retries", {"max_attempts": 1, "mode": "standard"})
        config.setdefault("connect_timeout", timeout)
        config.setdefault("read_timeout", timeout)
        options["config_kwargs"] = config
    elif protocol in HTTP_PROTOCOLS:
        options["client_kwargs"] = http.tamed_client_kwargs(
            options.get("client_kwargs") or {}, timeout
        )
    return options


def backend_timeout(fs: fsspec.AbstractFileSystem) -> float | None:
    """The shortest socket time-out configured on backend ``fs`` (botocore
    ``connect_timeout``/``read_timeout``, gcsfs ``requests_timeout``, adlfs
    ``connection_timeout``/``read_timeout``, aiohttp ``ClientTimeout`` socket fields), or None."""
    protocol = protocol_of(fs)
    values: list[Any] = []
    if protocol in S3_PROTOCOLS:
        config = getattr(fs, "config_kwargs", None) or {}
        values += [config.get("connect_timeout"), config.get("read_timeout")]
    elif protocol in GCS_PROTOCOLS:
        values.append(getattr(fs, "requests_timeout", None))
    elif protocol in AZURE_PROTOCOLS:
        given = getattr(fs, "_timeout_kwargs", None) or {}
        values += [given.get("connection_timeout"), given.get("read_timeout")]
    elif protocol in HTTP_PROTOCOLS:
        client_timeout = (getattr(fs, "client_kwargs", None) or {}).get("timeout")
        for field in ("sock_read", "sock_connect", "connect"):
            values.append(getattr(client_timeout, field, None))
    numbers = [
        float(value)
        for value in values
        if isinstance(value, int | float) and not isinstance(value, bool) and value > 0
    ]
    return min(numbers) if numbers else None


def tame_instance(fs: fsspec.AbstractFileSystem, protocol: str) -> None:
    """Turn down the retries that a backend only exposes on the built instance."""
    if protocol in S3_PROTOCOLS:
        fs.retries = 1  # s3fs's own _error_wrapper loop around every call
    elif protocol in GCS_PROTOCOLS:
        _tame_gcsfs(fs)
    elif protocol in AZURE_PROTOCOLS:
        _tame_adlfs(fs)


def _tame_gcsfs(fs: Any) -> None:
    # gcsfs binds its retries (6) into the decorator of _request at class definition, and
    # logs every give-up at ERROR with a traceback; the undecorated request is bound instead,
    # so a failure reaches our retry layer at once and quietly.
    request = getattr(type(fs)._request, "__wrapped__", None)
    if request is None:
        logger.warning("gcsfs changed: cannot turn down its own retries")
        return
    fs._request = types.MethodType(request, fs)


def _tame_adlfs(fs: Any) -> None:
    config = getattr(getattr(fs, "service_client", None), "_config", None)
    policy = getattr(config, "retry_policy", None)
    if policy is None or not hasattr(policy, "total_retries"):
        logger.warning("adlfs changed: cannot turn down the Azure SDK's own retries")
        return
    for attribute in ("total_retries", "connect_retries", "read_retries", "status_retries"):
        setattr(policy, attribute, 0)


def protocol_of(fs: fsspec.AbstractFileSystem) -> str:
    """The backend's main protocol name."""
    protocol = fs.protocol
    return protocol[0] if isinstance(protocol, tuple | list) else protocol


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
    get_object = getattr(fs, "_get_object", None)
    if protocol_of(fs) in GCS_PROTOCOLS and get_object and not fs.asynchronous:
        try:
            return sync(fs.loop, get_object, path, timeout=timeout)
        except FileNotFoundError:
            pass
    return call(fs, "info", path, timeout=timeout)


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


def _from_base64(value: Any) -> str | None:
    if isinstance(value, bytes | bytearray):
        return bytes(value).hex()
    if not isinstance(value, str) or not value:
        return None
    try:
        return base64.b64decode(value, validate=True).hex()
    except (binascii.Error, ValueError):
        return None


def backend_checksums(protocol: str, info: dict[str, Any]) -> list[Checksum]:
    """Checksums the backend already knows for the object, from its ``info()``."""
    found: list[Checksum] = []

    def add(algorithm: str, hexdigest: str | None, length: int) -> None:
        if hexdigest and len(hexdigest) == length:
            found.append(Checksum(algorithm, hexdigest.lower()))

    if protocol in S3_PROTOCOLS:
        etag = str(info.get("ETag") or "").strip('"')
        encrypted = info.get("ServerSideEncryption") == "aws:kms" or info.get(
            "SSECustomerAlgorithm"
        )
        if _PLAIN_MD5_ETAG.match(etag) and not encrypted:
            add("md5", etag, 32)
        add("sha256", _from_base64(info.get("ChecksumSHA256")), 64)
        add("crc32c", _from_base64(info.get("ChecksumCRC32C")), 8)
    elif protocol in GCS_PROTOCOLS:
        add("md5", _from_base64(info.get("md5Hash")), 32)
        add("crc32c", _from_base64(info.get("crc32c")), 8)
    elif protocol in AZURE_PROTOCOLS:
        settings = info.get("content_settings") or {}
        md5 = (
            settings.get("content_md5")
            if isinstance(settings, dict)
            else getattr(settings, "content_md5", None)
        )
        add("md5", _from_base64(md5), 32)
    elif protocol in HTTP_PROTOCOLS:
        add("md5", _from_base64(info.get("Content-MD5")), 32)
    return found
