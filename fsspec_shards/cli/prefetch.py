"""``prefetch URL_PATTERN``: the arguments, progress bar and output of
:mod:`fsspec_shards.fleet.prefetch`.

The bar counts shards and shows the bytes fetched and their rate in the units of the summary
(:func:`~fsspec_shards.fleet.report.format_bytes`), so the two never disagree.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from fsspec_shards.cli.errors import EXIT_INTERRUPTED, EXIT_OK, PROGRAM, UsageError
from fsspec_shards.cli.options import SharedOptions, executor_for, storage_options_from
from fsspec_shards.cli.report import print_table, progress
from fsspec_shards.fleet.errors import ShardsFailed
from fsspec_shards.fleet.prefetch import Fetched, prefetch_shards
from fsspec_shards.fleet.report import format_bytes
from fsspec_shards.fleet.shards import shard_urls
from fsspec_shards.option_shapes import cache_is_off

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


def bytes_postfix(fetched_bytes: int, seconds: float) -> str:
    """The bar's postfix: bytes in the cache so far and their rate, in the summary's units."""
    rate = fetched_bytes / seconds if seconds > 0 else 0.0
    return f"{format_bytes(fetched_bytes)}, {format_bytes(rate)}/s"


def run(args: argparse.Namespace) -> int:
    options = storage_options_from(args)
    if cache_is_off(options):
        raise UsageError("prefetch fills the cache: it cannot run with --no-cache")
    urls = shard_urls(args.url_pattern, options)
    done = 0
    try:
        with progress(args, desc=NAME, unit=" shards", total=len(urls)) as bar:
            fetched_bytes = 0
            bar.set_postfix_str(bytes_postfix(0, 0.0))

            def advance(fetched: Fetched) -> None:
                nonlocal done, fetched_bytes
                done += 1
                fetched_bytes += fetched.size
                bar.set_postfix_str(bytes_postfix(fetched_bytes, bar.format_dict["elapsed"]), False)
                bar.update()

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
        rows = sorted(report.failures)
        print_table(("shard", "problem"), rows)
        shard, problem = report.failures[0]
        raise ShardsFailed(
            f"{len(report.failures)} shards could not be fetched, first {shard}: {problem}", rows
        )
    return EXIT_OK
