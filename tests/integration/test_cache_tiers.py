"""The shared cache tier across "hosts" (processes with local caches of their own and one
shared directory), against a real S3 server whose traffic the fault proxy counts; and
SIGKILL while publishing to the shared tier."""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING

from fsspec_shards.storage.cache.shared import SharedTier
from tests.cache_objects import obj, payload

if TYPE_CHECKING:  # spawned workers import this module: keep it light
    from tests.integration import servers

SPAWN = multiprocessing.get_context("spawn")
JOIN_TIMEOUT = 180


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def host_reads_every_shard(urls: list[str], options: dict, barrier, results) -> None:
    """One "host": reads every shard through wds:: and reports digests and its stats."""
    import fsspec

    barrier.wait(JOIN_TIMEOUT)
    digests = []
    for url in urls:
        with fsspec.open(f"wds::{url}", "rb", **options) as handle:
            digests.append(digest(handle.read()))
    fs, _ = fsspec.core.url_to_fs(f"wds::{urls[0]}", **options)
    results.put((digests, fs.cache_stats()))


def test_two_hosts_with_a_shared_tier_download_each_shard_once(
    s3_backend: servers.S3Backend, fault_proxy, tmp_path: Path
) -> None:
    shards = {f"tiers/train-{i:04d}.tar": payload(f"shard {i}", 400_000 + i) for i in range(6)}
    for path, data in shards.items():
        s3_backend.put(path, data)
    proxy, proxied = fault_proxy(s3_backend, bandwidth=20_000_000)
    urls = [proxied.url(path) for path in shards]
    barrier, results = SPAWN.Barrier(2), SPAWN.Queue()
    hosts = []
    for host in ("host-a", "host-b"):
        options = {
            "wds": {
                "cache_dir": str(tmp_path / host / "cache"),
                "shared_cache_dir": str(tmp_path / "shared"),
            },
            "s3": proxied.storage_options,
        }
        hosts.append(
            SPAWN.Process(target=host_reads_every_shard, args=(urls, options, barrier, results))
        )
    for process in hosts:
        process.start()
    reports = [results.get(timeout=JOIN_TIMEOUT) for _ in hosts]
    for process in hosts:
        process.join(JOIN_TIMEOUT)
        assert process.exitcode == 0

    expected = [digest(data) for data in shards.values()]
    assert [digests for digests, _ in reports] == [expected, expected]
    for path, data in shards.items():  # one download per shard, counted at the server
        assert sum(entry.body_bytes for entry in proxy.requests("GET", path)) == len(data), path
    stats = [stats for _, stats in reports]
    assert sum(s["shared_misses"] for s in stats) == len(shards)
    assert sum(s["shared_hits"] for s in stats) == len(shards)
    assert sum(s["bytes_downloaded"] for s in stats) == sum(map(len, shards.values()))
    assert all(s["cached_files"] == len(shards) for s in stats)  # each host has its own copy


def publish_forever(directory: str, size: int, started: str) -> None:
    """Publish distinct versions of ``size`` bytes to the shared tier until killed."""
    tier = SharedTier(directory, 1 << 40)
    number = 0
    while True:
        source = Path(directory).parent / f"source-{os.getpid()}"
        source.write_bytes(payload(f"version {number}", size))
        with open(source, "rb") as handle:
            Path(started).touch()
            tier.publish(SharedTier.version(obj("s3://bucket/a"), f"v{number}"), handle)
        number += 1


def test_sigkill_while_publishing_to_the_shared_tier_never_leaves_a_partial_file(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "shared"
    size = 8 * 1024 * 1024
    expected = {
        SharedTier.version(obj("s3://bucket/a"), f"v{n}"): digest(payload(f"version {n}", size))
        for n in range(200)
    }
    started = tmp_path / "started"
    for trial in range(16):
        started.unlink(missing_ok=True)
        process = SPAWN.Process(target=publish_forever, args=(str(directory), size, str(started)))
        process.start()
        deadline = time.monotonic() + JOIN_TIMEOUT
        while not started.exists():
            assert time.monotonic() < deadline and process.is_alive(), "never published"
            time.sleep(0.002)
        time.sleep(trial * 0.011)  # instants across copy, fsync, rename
        os.kill(process.pid, signal.SIGKILL)
        process.join(JOIN_TIMEOUT)
        assert process.exitcode == -signal.SIGKILL
        for path in (directory / "files").rglob("*"):
            if path.is_file():
                assert digest(path.read_bytes()) == expected[path.name], f"partial {path}"
    assert any((directory / "files").rglob("*/*")), "no publication ever completed"
