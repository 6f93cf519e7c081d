"""``manifest URL_PATTERN -o SHA256SUMS``: hash every shard and write a checksum manifest."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from fsspec_shards.cli.checks import check_all
from fsspec_shards.cli.errors import EXIT_OK, StorageFailure, UsageError
from fsspec_shards.cli.options import SharedOptions, streaming_options
from fsspec_shards.cli.report import print_failures
from fsspec_shards.cli.shards import comparable, shard_urls, write_text
from fsspec_shards.redact import redact_url

NAME = "manifest"


def add_parser(commands: Any, shared: SharedOptions) -> None:
    """Register ``manifest`` and its options."""
    parser = commands.add_parser(
        NAME,
        parents=[shared.output, shared.storage, shared.jobs],
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
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    options = streaming_options(args)
    urls = shard_urls(args.url_pattern, options)
    output = args.output if "://" in args.output else os.path.abspath(args.output)
    manifest_dir = comparable(output).rsplit("/", 1)[0]
    checks, failures = check_all(args, urls, options, "manifest")
    if failures:
        print_failures((o.item, o.error) for o in failures)
        raise StorageFailure(f"{len(failures)} shards could not be read; no manifest written")
    names = [manifest_name(check.url, manifest_dir) for check in checks]
    bad_names = [name for name in names if "\n" in name or "\\" in name]
    if bad_names:
        raise UsageError(f"shard name {bad_names[0]!r} cannot be written in sha256sum format")
    lines = [f"{check.sha256}  {name}\n" for check, name in zip(checks, names, strict=True)]
    write_text(output, "".join(lines), options)
    print(f"wrote {len(checks)} checksums to {redact_url(output)}")
    if args.sample_counts:
        keys = count_keys(names)
        counts = {key: check.samples for key, check in zip(keys, checks, strict=True)}
        write_text(args.sample_counts, json.dumps(counts, indent=1) + "\n", options)
        print(f"wrote {sum(counts.values())} samples in counts to {args.sample_counts}")
    return EXIT_OK


def manifest_name(url: str, manifest_dir: str) -> str:
    """The name of a shard in a manifest in ``manifest_dir``: relative when below it."""
    name = comparable(url)
    if name.startswith(manifest_dir.rstrip("/") + "/"):
        return name[len(manifest_dir.rstrip("/")) + 1 :]
    return name


def count_keys(names: list[str]) -> list[str]:
    """Keys of the sample-counts sidecar, in shard order: file names when they are unique
    (ShardDataset's ``samples_per_shard`` finds shards by file name), else manifest names."""
    basenames = [name.rsplit("/", 1)[-1] for name in names]
    return basenames if len(set(basenames)) == len(basenames) else names
