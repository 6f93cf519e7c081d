"""``manifest URL_PATTERN -o SHA256SUMS``: the arguments and output of
:mod:`fsspec_shards.fleet.manifest`."""

from __future__ import annotations

import argparse
from typing import Any

from fsspec_shards.checksums import DEFAULT_BLOCK_SIZE, block_manifest_name, check_block_size
from fsspec_shards.cli.errors import EXIT_OK
from fsspec_shards.cli.options import SharedOptions, executor_for, streaming_options
from fsspec_shards.cli.report import print_table, progress
from fsspec_shards.config import parse_size
from fsspec_shards.fleet.errors import ShardsFailed
from fsspec_shards.fleet.manifest import index_location, make_manifest, manifest_location
from fsspec_shards.fleet.shards import shard_urls
from fsspec_shards.redact import redact_url

NAME = "manifest"


def add_parser(commands: Any, shared: SharedOptions) -> None:
    """Register ``manifest`` and its options."""
    parser = commands.add_parser(
        NAME,
        parents=[shared.output, shared.storage, shared.jobs, shared.reading],
        help="write a sha256sum-format checksum manifest",
        description="Hash every shard of URL_PATTERN and write a manifest that "
        "`sha256sum -c` accepts; names are relative to the manifest's directory when the "
        "shards lie below it, else full URLs.",
    )
    parser.add_argument("url_pattern", metavar="URL_PATTERN")
    parser.add_argument(
        "-o", "--output", required=True, metavar="SHA256SUMS", help="manifest path or URL"
    )
    parser.add_argument(
        "--sample-counts",
        metavar="JSON",
        help="also write {shard name: sample count} to this file",
    )
    parser.add_argument(
        "--index",
        nargs="?",
        const="",
        metavar="JSON",
        help="also write the sample index (where each sample starts, for IndexedShardDataset) "
        "to this file; default: sample-index.json beside the manifest",
    )
    parser.add_argument(
        "--blocks",
        action="store_true",
        help="also write the block manifest SHA256SUMS.blocks beside it (a sha256 per block, "
        "so readers get each block of a cold shard as soon as it is verified)",
    )
    parser.add_argument(
        "--block-size",
        type=parse_block_size,
        default=DEFAULT_BLOCK_SIZE,
        metavar="SIZE",
        help="bytes per block of --blocks (default 2MiB; at least 4KiB)",
    )
    parser.set_defaults(run=run)


def parse_block_size(text: str) -> int:
    """``--block-size``: a size like ``4MiB`` (argparse names the option when it fails)."""
    try:
        return check_block_size(parse_size(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def run(args: argparse.Namespace) -> int:
    options = streaming_options(args)
    urls = shard_urls(args.url_pattern, options)
    output = manifest_location(args.output)
    try:
        with progress(args, desc=NAME, unit=" shards", total=len(urls)) as bar:
            with executor_for(args) as executor:
                made = make_manifest(
                    urls,
                    output,
                    options,
                    executor,
                    args.max_member_size,
                    bar.update,
                    args.sample_counts,
                    args.block_size if args.blocks else None,
                    args.index,
                )
    except ShardsFailed as failed:
        print_table(("shard", "problem"), failed.failures)
        raise
    print(f"wrote {len(urls)} checksums to {redact_url(output)}")
    if made.blocks is not None:
        print(f"wrote their blocks to {redact_url(block_manifest_name(output))}")
    if args.sample_counts:
        print(
            f"wrote {sum(made.counts.values())} samples in counts to "
            f"{redact_url(args.sample_counts)}"
        )
    if args.index is not None:
        where = redact_url(index_location(output, args.index))
        print(f"wrote the sample index of {len(urls)} shards to {where}")
    return EXIT_OK
