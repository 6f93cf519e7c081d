"""``manifest URL_PATTERN -o SHA256SUMS``: hash every shard and write a checksum manifest.

Invariants: the manifest lists the shards in pattern order, in ``sha256sum`` format
(:func:`~fsspec_shards.checksums.format_sums`, the writer ``ShardWriter`` uses too), names
relative to its own directory when the shards lie below it; it is written only when every
shard was read, so the same shards give the same bytes wherever the hashing ran.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from fsspec_shards.checksums import format_sums, parse_checksum
from fsspec_shards.cli.checks import check_shards
from fsspec_shards.cli.errors import EXIT_OK, StorageFailure, UsageError
from fsspec_shards.cli.options import (
    DEFAULT_MAX_MEMBER_SIZE,
    SharedOptions,
    executor_for,
    streaming_options,
)
from fsspec_shards.cli.parallel import Executor
from fsspec_shards.cli.report import print_table, progress, shown
from fsspec_shards.cli.shards import comparable, shard_urls, write_text
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
    parser.set_defaults(run=run)


@dataclass
class ManifestText:
    """A manifest ready to write, and the sample counts of its shards by sidecar key."""

    text: str
    counts: dict[str, int]


def build_manifest(
    urls: Sequence[str],
    output: str,
    options: dict[str, dict],
    executor: Executor,
    max_member_size: int = DEFAULT_MAX_MEMBER_SIZE,
    advance: Callable[[int], Any] = lambda count: None,
    on_failures: Callable[[list[tuple[str, str]]], Any] = lambda rows: None,
) -> ManifestText:
    """Hash ``urls`` on ``executor`` into the text of a manifest to be written at ``output``.

    When shards cannot be read, ``on_failures`` gets their (shard, problem) rows and
    :class:`StorageFailure` is raised: no manifest with holes."""
    manifest_dir = comparable(output).rsplit("/", 1)[0]
    checks = check_shards(list(urls), options, executor, ("sha256",), max_member_size, advance)
    failures = [(shown(check.url), check.problem) for check in checks if check.problem]
    if failures:
        on_failures(failures)
        raise StorageFailure(f"{len(failures)} shards could not be read; no manifest written")
    names = [manifest_name(check.url, manifest_dir) for check in checks]
    checksums = [parse_checksum(check.checksums["sha256"]) for check in checks]
    try:
        text = format_sums(zip(names, checksums, strict=True))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    counts = {key: check.samples for key, check in zip(count_keys(names), checks, strict=True)}
    return ManifestText(text, counts)


def run(args: argparse.Namespace) -> int:
    options = streaming_options(args)
    urls = shard_urls(args.url_pattern, options)
    output = manifest_location(args.output)
    with progress(args, desc=NAME, unit=" shards", total=len(urls)) as bar:
        with executor_for(args) as executor:
            made = build_manifest(
                urls,
                output,
                options,
                executor,
                args.max_member_size,
                bar.update,
                lambda rows: print_table(("shard", "problem"), sorted(rows)),
            )
    write_text(output, made.text, options)
    print(f"wrote {len(urls)} checksums to {redact_url(output)}")
    if args.sample_counts:
        write_text(args.sample_counts, json.dumps(made.counts, indent=1) + "\n", options)
        print(
            f"wrote {sum(made.counts.values())} samples in counts to "
            f"{redact_url(args.sample_counts)}"
        )
    return EXIT_OK


def manifest_location(output: str) -> str:
    """Where a manifest goes: a URL as given, a local path made absolute."""
    return output if "://" in output else os.path.abspath(os.path.expanduser(output))


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
