"""The ``prefetch`` chore: download every shard into the cache, verified, in parallel.

Invariants: each shard is fetched through the ``wds`` filesystem of the process doing the work,
so on dask every worker host fills its own cache (the ``cache_dir`` of the options, else its own
``FSSPEC_SHARDS_CACHE`` / default), and the worker processes of one host share it, one download
per shard. The numbers reported are the caches' counters before and after, summed over
distinct caches, so a local run and a dask run of the same work give the same report.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from fsspec_shards.counters import COUNTERS
from fsspec_shards.errors import ShardFormatError
from fsspec_shards.fleet.errors import InputError, describe_error
from fsspec_shards.fleet.executors import Executor
from fsspec_shards.fleet.report import format_bytes, shown, storage_stats
from fsspec_shards.fleet.shards import open_filesystem
from fsspec_shards.option_shapes import cache_is_off
from fsspec_shards.redact import redact_url


@dataclass
class Fetched:
    """One shard's prefetch: its size in the cache, or why it is not there."""

    url: str
    size: int = 0
    problem: str | None = None


def fetch_shard(url: str, options: dict[str, dict]) -> Fetched:
    """Make sure one shard is in this host's cache."""
    fs, path = open_filesystem(url, options)
    try:
        local = fs.prefetch(path)
    except (OSError, ShardFormatError) as exc:
        return Fetched(url, problem=describe_error(exc))
    if local is None:
        return Fetched(url, problem="does not fit in the cache")
    return Fetched(url, size=os.path.getsize(local))


def cache_counters(url: str, options: dict[str, dict]) -> tuple[tuple[str, str], dict[str, int]]:
    """(host, cache directory) and the counters of the cache a shard is fetched into here."""
    fs, _ = open_filesystem(url, options)
    cache_dir = getattr(getattr(fs, "options", None), "cache_dir", "")  # a wds filesystem's
    return (socket.gethostname(), str(cache_dir)), storage_stats(fs)


@dataclass
class PrefetchReport:
    """What a prefetch did: the shards fetched, the counters' growth and the failures."""

    shards: int
    fetched: int = 0
    bytes_fetched: int = 0
    storage: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0))
    failures: list[tuple[str, str]] = field(default_factory=list)

    def summary(self) -> str:
        downloaded = self.storage["misses"]
        return (
            f"prefetched {self.fetched} of {self.shards} shards: "
            f"{downloaded} downloaded ({format_bytes(self.storage['bytes_downloaded'])}), "
            f"{max(self.fetched - downloaded, 0)} already cached, "
            f"{self.storage['retries']} retries"
        )


def prefetch_shards(
    urls: Sequence[str],
    options: dict[str, dict],
    executor: Executor,
    advance: Callable[[Fetched], Any] = lambda fetched: None,
) -> PrefetchReport:
    """Fetch every shard into the cache of the host that does the work; ``advance`` sees
    each shard's outcome as it finishes. Shards that cannot be fetched are the report's
    ``failures``; with the cache off, or URLs not read through ``wds::``, an
    :class:`InputError` before any work."""
    if cache_is_off(options):
        raise InputError("prefetch fills the cache: it cannot run with the cache off")
    fs, _ = open_filesystem(urls[0], options)
    if not hasattr(fs, "prefetch"):
        raise InputError(f"prefetch needs wds:: URLs, not {redact_url(urls[0])}")
    counters = partial(cache_counters, urls[0], options)
    before = dict(executor.on_each_host(counters))
    report = PrefetchReport(len(urls))
    for fetched in executor.map(partial(fetch_shard, options=options), list(urls)):
        if fetched.problem is None:
            report.fetched += 1
            report.bytes_fetched += fetched.size
        else:
            report.failures.append((shown(fetched.url), fetched.problem))
        advance(fetched)
    for place, after in dict(executor.on_each_host(counters)).items():
        earlier = before.get(place, dict.fromkeys(COUNTERS, 0))
        for key in COUNTERS:
            report.storage[key] += after[key] - earlier[key]
    return report
