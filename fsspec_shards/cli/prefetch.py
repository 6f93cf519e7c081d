"""``prefetch URL_PATTERN``: download every shard into the cache, verified, in parallel.

Invariants: each shard is fetched through the ``wds`` filesystem of the process doing the work,
so with ``--dask`` every worker host fills its own cache (its ``--cache-dir``, else its own
``FSSPEC_SHARDS_CACHE`` / default), and the worker processes of one host share it, one download
per shard. The numbers reported are the caches' counters before and after, summed over
distinct caches, so a local run and a dask run of the same work print the same report.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from fsspec_shards.cli.errors import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    PROGRAM,
    StorageFailure,
    UsageError,
    describe_error,
)
from fsspec_shards.cli.options import SharedOptions, executor_for, storage_options_from
from fsspec_shards.cli.parallel import Executor
from fsspec_shards.cli.report import (
    STAT_KEYS,
    format_bytes,
    print_table,
    progress,
    shown,
    storage_stats,
)
from fsspec_shards.cli.shards import open_filesystem, shard_urls
from fsspec_shards.errors import ShardFormatError
from fsspec_shards.redact import redact_url

NAME = "prefetch"


def add_parser(commands: Any, shared: SharedOptions) -> None:
    """Register ``prefetch`` and its options."""
    parser = commands.add_parser(
        NAME,
        parents=[shared.output, shared.storage, shared.cache, shared.jobs],
        help="fill the cache with every shard, in parallel",
        description="Download every shard of URL_PATTERN into the cache, verified. "
        "Interrupt with Ctrl-C and run again to resume: cached shards are skipped. With "
        "--dask, every worker host fills its own cache.",
    )
    parser.add_argument("url_pattern", metavar="URL_PATTERN")
    parser.set_defaults(run=run)


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
    return (socket.gethostname(), str(getattr(fs, "cache_dir", ""))), storage_stats(fs)


@dataclass
class PrefetchReport:
    """What a prefetch did: the shards fetched, the counters' growth and the failures."""

    shards: int
    fetched: int = 0
    bytes_fetched: int = 0
    storage: dict[str, int] = field(default_factory=lambda: dict.fromkeys(STAT_KEYS, 0))
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
    each shard's outcome as it finishes."""
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
        earlier = before.get(place, dict.fromkeys(STAT_KEYS, 0))
        for key in STAT_KEYS:
            report.storage[key] += after[key] - earlier[key]
    return report


def run(args: argparse.Namespace) -> int:
    options = storage_options_from(args)
    if options["wds"].get("cache") is False:
        raise UsageError("prefetch fills the cache: it cannot run with --no-cache")
    urls = shard_urls(args.url_pattern, options)
    fs, _ = open_filesystem(urls[0], options)
    if not hasattr(fs, "prefetch"):
        raise UsageError(f"prefetch needs wds:: URLs, not {redact_url(urls[0])}")
    done = 0
    try:
        with progress(args, desc=NAME, unit="B", unit_scale=True, unit_divisor=1024) as bar:
            bar.set_postfix_str(f"0/{len(urls)} shards")

            def advance(fetched: Fetched) -> None:
                nonlocal done
                done += 1
                bar.update(fetched.size)
                bar.set_postfix_str(f"{done}/{len(urls)} shards")

            with executor_for(args) as executor:
                report = prefetch_shards(urls, options, executor, advance)
    except KeyboardInterrupt:
        print(
            f"{PROGRAM} {NAME}: interrupted after {done} of {len(urls)} shards; "
            "run the same command again to fetch the rest",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
    print(report.summary())
    if report.failures:
        print_table(("shard", "problem"), sorted(report.failures))
        shard, problem = report.failures[0]
        raise StorageFailure(
            f"{len(report.failures)} shards could not be fetched, first {shard}: {problem}"
        )
    return EXIT_OK
