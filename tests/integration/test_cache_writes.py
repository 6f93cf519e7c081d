"""Writes through ``wds`` against the cache, on a real S3 server: a write invalidates
downloads in flight in other processes, and ``invalidate_cache`` drops poisoned copies."""

from __future__ import annotations

import hashlib
import multiprocessing
import time
from pathlib import Path
from typing import TYPE_CHECKING

import fsspec

from fsspec_shards.storage.cache import ShardCache
from tests.cache_objects import payload
from tests.integration.fault_proxy import Stall

if TYPE_CHECKING:  # spawned workers import this module: keep it light
    from tests.integration import servers

SPAWN = multiprocessing.get_context("spawn")
JOIN_TIMEOUT = 120


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read_through_wds(url: str, options: dict, results) -> None:
    try:
        with fsspec.open(f"wds::{url}", "rb", **options) as handle:
            results.put(digest(handle.read()))
    except OSError as error:
        results.put(f"error: {error}")


def test_a_write_during_another_processs_download_is_what_every_later_read_returns(
    s3_backend: servers.S3Backend, fault_proxy, tmp_path: Path
) -> None:
    path = "writes/shard-0000.tar"
    old, new = payload("old version", 300_000), payload("new version", 200_000)
    s3_backend.put(path, old)
    proxy, proxied = fault_proxy(s3_backend)
    proxy.add(Stall(seconds=4, after_bytes=64 * 1024), method="GET", path=path, times=1)
    wds = {"cache_dir": str(tmp_path / "cache"), "cache_size": "16MB", "timeout": 30}
    options = {"wds": wds, "s3": proxied.storage_options}
    results = SPAWN.Queue()
    reader = SPAWN.Process(target=read_through_wds, args=(proxied.url(path), options, results))
    reader.start()
    deadline = time.monotonic() + JOIN_TIMEOUT
    while not proxy.requests("GET", path):
        assert time.monotonic() < deadline and reader.is_alive(), "the download never started"
        time.sleep(0.02)

    writer = fsspec.filesystem(
        "wds", target_protocol="s3", target_options=proxied.storage_options, **wds
    )
    writer.pipe_file(proxied.url(path), new)  # lands while the reader's download is stalled
    first = results.get(timeout=JOIN_TIMEOUT)
    reader.join(JOIN_TIMEOUT)
    assert first in (digest(old), digest(new)) or first.startswith("error: "), first

    for _ in range(2):  # a fresh process, then this one: both see only the new version
        again = SPAWN.Process(target=read_through_wds, args=(proxied.url(path), options, results))
        again.start()
        assert results.get(timeout=JOIN_TIMEOUT) == digest(new)
        again.join(JOIN_TIMEOUT)
    assert writer.cat_file(proxied.url(path)) == new
    entries = ShardCache.existing(wds["cache_dir"]).entries()
    assert [entry["size"] for entry in entries] == [len(new)]


def test_invalidate_cache_drops_the_cached_copy_and_the_backend_listing(
    s3_backend: servers.S3Backend, tmp_path: Path
) -> None:
    url = s3_backend.put("poisoned/shard.tar", b"<html>maintenance</html>")
    fs = fsspec.filesystem(
        "wds",
        target_protocol="s3",
        target_options=s3_backend.storage_options,
        cache_dir=str(tmp_path / "cache"),
        skip_instance_cache=True,
    )
    assert fs.cat_file(url) == b"<html>maintenance</html>"
    assert fs.ls(s3_backend.url("poisoned"), detail=False) == [url.split("://", 1)[1]]
    s3_backend.put("poisoned/shard.tar", b"the real shard bytes")  # behind wds's back
    s3_backend.put("poisoned/other.tar", b"x")
    assert fs.cat_file(url) == b"<html>maintenance</html>"  # the cached copy, as promised

    fs.invalidate_cache(url)
    assert fs.cat_file(url) == b"the real shard bytes"
    fs.invalidate_cache(s3_backend.url("poisoned"))
    assert len(fs.ls(s3_backend.url("poisoned"), detail=False)) == 2


def test_invalidate_cache_reaches_through_fsspec_for_chained_urls(
    s3_backend: servers.S3Backend, tmp_path: Path
) -> None:
    """The dataset calls it through fsspec only (no storage import): ``url_to_fs`` + path."""
    url = s3_backend.put("chained/shard.tar", b"first")
    options = {"wds": {"cache_dir": str(tmp_path / "cache")}, "s3": s3_backend.storage_options}
    fs, path = fsspec.core.url_to_fs(f"wds::{url}", **options)
    assert fs.cat_file(path) == b"first"
    s3_backend.put("chained/shard.tar", b"second")
    fs.invalidate_cache(path)
    with fsspec.open(f"wds::{url}", "rb", **options) as handle:
        assert handle.read() == b"second"
