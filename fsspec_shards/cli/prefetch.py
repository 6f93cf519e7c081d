"""``prefetch URL_PATTERN``: download every shard into the cache, verified, in parallel."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any

from fsspec_shards.cli.errors import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    StorageFailure,
    UsageError,
    describe_error,
)
from fsspec_shards.cli.options import SharedOptions, storage_options_from
from fsspec_shards.cli.parallel import Outcome, run_parallel
from fsspec_shards.cli.report import format_bytes, print_failures, progress, storage_stats
from fsspec_shards.cli.shards import open_filesystem, shard_urls
from fsspec_shards.redact import redact_url

NAME = "prefetch"
PROGRAM = "fsspec-shards"

logger = logging.getLogger("fsspec_shards.cli")


def add_parser(commands: Any, shared: SharedOptions) -> None:
    """Register ``prefetch`` and its options."""
    parser = commands.add_parser(
        NAME,
        parents=[shared.output, shared.storage, shared.cache, shared.jobs],
        help="fill the cache with every shard, in parallel",
        description="Download every shard of URL_PATTERN into the cache, verified. "
        "Interrupt with Ctrl-C and run again to resume: cached shards are skipped.",
    )
    parser.add_argument("url_pattern", metavar="URL_PATTERN")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    options = storage_options_from(args)
    if options["wds"].get("cache") is False:
        raise UsageError("prefetch fills the cache: it cannot run with --no-cache")
    urls = shard_urls(args.url_pattern, options)
    fs, _ = open_filesystem(urls[0], options)
    if not hasattr(fs, "prefetch"):
        raise UsageError(f"prefetch needs wds:: URLs, not {redact_url(urls[0])}")
    before = storage_stats(fs)

    def fetch(url: str) -> int:
        shard_fs, path = open_filesystem(url, options)
        local = shard_fs.prefetch(path)
        if local is None:
            raise StorageFailure(f"{redact_url(url)} does not fit in the cache")
        return os.path.getsize(local)

    failures: list[Outcome] = []
    done = 0
    try:
        with progress(args, desc="prefetch", unit="B", unit_scale=True, unit_divisor=1024) as bar:
            bar.set_postfix_str(f"0/{len(urls)} shards")
            for outcome in run_parallel(fetch, urls, args.jobs):
                done += 1
                if outcome.error is not None:
                    failures.append(outcome)
                    logger.debug("prefetch of %s failed", redact_url(outcome.item))
                else:
                    bar.update(outcome.result)
                bar.set_postfix_str(f"{done}/{len(urls)} shards")
    except KeyboardInterrupt:
        print(
            f"{PROGRAM} prefetch: interrupted after {done} of {len(urls)} shards; "
            "run the same command again to fetch the rest",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
    stats = {key: value - before[key] for key, value in storage_stats(fs).items()}
    fetched = len(urls) - len(failures)
    print(
        f"prefetched {fetched} of {len(urls)} shards: "
        f"{stats['misses']} downloaded ({format_bytes(stats['bytes_downloaded'])}), "
        f"{max(fetched - stats['misses'], 0)} already cached, {stats['retries']} retries"
    )
    if failures:
        print_failures((o.item, o.error) for o in failures)
        first = failures[0]
        raise StorageFailure(
            f"{len(failures)} shards could not be fetched, first "
            f"{redact_url(first.item)}: {describe_error(first.error)}"
        )
    return EXIT_OK
