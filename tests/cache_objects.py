"""Objects, payloads and download callbacks shared by the cache tests."""

from __future__ import annotations

import hashlib
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

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


@pytest.fixture
def read_only_view(tmp_path: Path) -> Iterator[Callable[[Path], Path]]:
    """``view(directory)``: a read-only bind mount of ``directory`` (skips where mounting
    is not permitted). Import it into a test module to use it."""
    mounts: list[Path] = []

    def view(directory: Path) -> Path:
        target = tmp_path / f"ro-{len(mounts)}"
        target.mkdir()
        bound = subprocess.run(
            ["mount", "--bind", str(directory), str(target)], capture_output=True, check=False
        )
        if bound.returncode != 0:
            pytest.skip(f"cannot bind-mount: {bound.stderr.decode().strip()}")
        mounts.append(target)
        sealed = subprocess.run(
            ["mount", "-o", "remount,bind,ro", str(target)], capture_output=True, check=False
        )
        if sealed.returncode != 0:
            pytest.skip(f"cannot make a mount read-only: {sealed.stderr.decode().strip()}")
        return target

    yield view
    for target in reversed(mounts):
        subprocess.run(["umount", "-l", str(target)], check=False)
