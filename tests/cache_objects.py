"""Objects, payloads and download callbacks shared by the cache tests."""

from __future__ import annotations

import hashlib

from fsspec_shards.redact import redact_url
from fsspec_shards.storage.identity import KEY_FORMAT, ObjectId


def obj(url: str) -> ObjectId:
    """The identity of ``url`` as the cache sees it: a digest key and redacted text."""
    return ObjectId(hashlib.sha256(f"{KEY_FORMAT}\0{url}".encode()).hexdigest(), redact_url(url))


def payload(name: str, size: int) -> bytes:
    """Deterministic bytes for an object name."""
    seed = hashlib.sha256(name.encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


def writer(data: bytes, metadata: dict | None = None):
    """A download callback that writes ``data`` and returns ``metadata``."""

    def download(file) -> dict:
        file.write(data)
        return dict(metadata or {"checksum": "sha256:" + hashlib.sha256(data).hexdigest()})

    return download


def fill(cache, url: str, size: int = 100) -> str:
    """Fetch ``url`` into ``cache`` (``payload(url, size)``); the cached file's path."""
    with cache.fetch(obj(url), writer(payload(url, size)), expected_size=size) as handle:
        return handle.name
