"""Objects, payloads, download callbacks and views of the index shared by the cache tests."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fsspec_shards.redact import redact_url
from fsspec_shards.storage.backends import KEY_FORMAT, ObjectId
from fsspec_shards.storage.cache import layout, store
from fsspec_shards.storage.cache.durability import SYNCER


def obj(url: str) -> ObjectId:
    """The identity of ``url`` as the cache sees it: a digest key and redacted text."""
    return ObjectId(hashlib.sha256(f"{KEY_FORMAT}\0{url}".encode()).hexdigest(), redact_url(url))


def as_a_new_process() -> None:
    """Let the next cache opened see its directory as a new process would: this process's
    background syncs are done and its shared indexes (with what the syncs noted in them)
    are forgotten."""
    SYNCER.drain()
    store._SHARED.clear()


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


# -- the index as another program sees it: diskcache's Cache table in cache.db ---------------


def index_query(directory: str, sql: str, *args) -> list[tuple]:
    """Rows of ``sql`` run (and committed) on the cache's index database: diskcache's
    tables, as another program sees them."""
    connection = sqlite3.connect(layout.index_path(directory))
    try:
        rows = connection.execute(sql, args).fetchall()
        connection.commit()
        return rows
    finally:
        connection.close()


def index_value(directory: str, name: str):
    """The value diskcache keeps under ``name`` (``entry:<key>``, ``counter:<name>``, ...)."""
    found = index_query(directory, "SELECT value FROM Cache WHERE key = ?", name)
    return found[0][0] if found else None


def indexed_entries(directory: str) -> list[tuple[str, dict, float]]:
    """``(key, record, store time)`` of every entry, least recently used first."""
    rows = index_query(
        directory,
        "SELECT key, value, store_time FROM Cache WHERE key LIKE 'entry:%' ORDER BY store_time",
    )
    return [(key[len("entry:") :], json.loads(value), stored) for key, value, stored in rows]


def plant_row(
    directory: str,
    name: str,
    value,
    size: int,
    stored_at: float = 0,
    mode: int = 1,
    filename: str | None = None,
) -> None:
    """Insert a row into diskcache's table the way another program would: straight into the
    database (``mode`` 1 is diskcache's raw value, 4 a pickle; ``filename`` its value file)."""
    connection = sqlite3.connect(layout.index_path(directory))
    connection.execute(
        "INSERT INTO Cache (key, raw, store_time, expire_time, access_time, access_count, tag, "
        "size, mode, filename, value) VALUES (?, 1, ?, NULL, ?, 0, NULL, ?, ?, ?, ?)",
        (name, stored_at, stored_at, size, mode, filename, value),
    )
    connection.commit()
    connection.close()


def tree(directory: Path) -> dict[str, bytes | None]:
    """Every path under ``directory`` with its bytes (None for directories)."""
    return {
        str(p.relative_to(directory)): (None if p.is_dir() else p.read_bytes())
        for p in sorted(directory.rglob("*"))
    }


# -- a real small filesystem ---------------------------------------------------------------


class SmallDisk:
    """A size-limited tmpfs mounted for one test: ``fill()`` takes every free byte (a file
    the test may ``release()``), so the cache meets a 100%-full disk."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._ballast = path / "ballast"

    def free_bytes(self) -> int:
        usage = os.statvfs(self.path)
        return usage.f_bavail * usage.f_frsize

    def fill(self) -> None:
        """Write until the disk refuses one more byte."""
        with open(self._ballast, "ab") as file:
            chunk = b"\0" * 65536
            while True:
                try:
                    file.write(chunk)
                    file.flush()
                except OSError:
                    break
            file.seek(0, os.SEEK_END)
            try:
                while True:
                    os.write(file.fileno(), b"\0")
            except OSError:
                pass
        assert self.free_bytes() == 0

    def release(self) -> None:
        """Give back what :meth:`fill` took."""
        if self._ballast.exists():
            self._ballast.unlink()


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[SmallDisk]:
    """A 4 MiB tmpfs (skips, saying why, where one cannot be mounted); unmounted after."""
    target = tmp_path / "small-disk"
    target.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m,mode=0700", "tmpfs", str(target)],
        capture_output=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a size-limited tmpfs: {mounted.stderr.decode().strip()}")
    try:
        yield SmallDisk(target)
    finally:
        SYNCER.drain()
        store._SHARED.clear()
        subprocess.run(["umount", "-l", str(target)], check=False)
