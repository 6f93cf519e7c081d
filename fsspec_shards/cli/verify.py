"""``verify URL_PATTERN``: the arguments and output of :mod:`fsspec_shards.fleet.verify`.

The exit code is 1 when any row is bad, with a one-line summary on standard error.
"""

from __future__ import annotations

import argparse
from typing import Any

from fsspec_shards.cli.errors import EXIT_OK, CheckFailed
from fsspec_shards.cli.options import SharedOptions, executor_for, streaming_options
from fsspec_shards.cli.report import print_json, print_table, progress
from fsspec_shards.fleet.shards import shard_urls
from fsspec_shards.fleet.verify import verify_shards

NAME = "verify"


def add_parser(commands: Any, shared: SharedOptions) -> None:
    """Register ``verify`` and its options."""
    parser = commands.add_parser(
        NAME,
        parents=[shared.output, shared.storage, shared.jobs, shared.reading, shared.json],
        help="check every shard's checksum and tar structure",
        description="Read every shard straight from storage (not through the cache), check "
        "its checksum against a manifest (else what the backend gives, else its size), "
        "block by block against the manifest's block manifest (SHA256SUMS.blocks) when there "
        "is one beside it, and parse its tar members. One row per shard says which check it "
        "got. Exit code 1 if any shard is bad.",
    )
    parser.add_argument("url_pattern", metavar="URL_PATTERN")
    parser.add_argument(
        "--manifest", metavar="SHA256SUMS", help="sha256sum-format file (path or URL)"
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    options = streaming_options(args)
    urls = shard_urls(args.url_pattern, options)
    with progress(args, desc=NAME, unit=" shards", total=len(urls)) as bar:
        with executor_for(args) as executor:
            report = verify_shards(
                args.url_pattern,
                options,
                executor,
                args.manifest,
                args.max_member_size,
                bar.update,
                urls,
            )
    if args.json:
        print_json(report.as_dict())
    else:
        print(report.summary())
        print_table(
            ("shard", "check", "result"),
            [(row.shard, row.check, row.problem or "ok") for row in report.rows],
        )
    if report.bad:
        raise CheckFailed(report.failure_line())
    return EXIT_OK
