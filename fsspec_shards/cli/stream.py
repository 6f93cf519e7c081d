"""``stream URL_PATTERN``: the arguments and output of :mod:`fsspec_shards.fleet.stream`
(one pass over a dataset: samples/s, MiB/s, cache hit rate, retries)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from fsspec_shards.cli.errors import EXIT_OK
from fsspec_shards.cli.options import (
    SharedOptions,
    non_negative_int,
    positive_int,
    prefetch_depth,
    storage_options_from,
)
from fsspec_shards.cli.report import print_json, progress
from fsspec_shards.fleet.shards import shard_urls
from fsspec_shards.fleet.stream import PassReport
from fsspec_shards.fleet.stream import stream_pass as measure_pass

NAME = "stream"


def add_parser(commands: Any, shared: SharedOptions) -> None:
    """Register ``stream`` and its options."""
    parser = commands.add_parser(
        NAME,
        parents=[shared.output, shared.storage, shared.cache, shared.reading, shared.json],
        help="iterate a dataset and report samples/s, MiB/s, cache hit rate, retries",
        description="Iterate the samples of URL_PATTERN (braces and globs expand; plain "
        "URLs and paths are read through wds::) and report on the throughput.",
    )
    parser.add_argument("url_pattern", metavar="URL_PATTERN")
    parser.add_argument(
        "--shuffle-shards",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="shuffle shard order by (seed, epoch), as ShardDataset does (default on)",
    )
    parser.add_argument(
        "--shuffle-buffer",
        type=non_negative_int,
        default=0,
        metavar="N",
        help="sample shuffle buffer (default 0: none)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epoch", type=non_negative_int, default=0)
    parser.add_argument(
        "--handler",
        choices=("raise", "warn", "skip"),
        default="raise",
        help="what a broken shard does (default raise)",
    )
    parser.add_argument(
        "--prefetch",
        type=prefetch_depth,
        default="auto",
        metavar="N",
        help='shards fetched ahead: an int, or "auto" (default: 2, 8 once the reader catches up '
        "with the fetches)",
    )
    parser.add_argument("--limit", type=positive_int, metavar="N", help="stop after N samples")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    options = storage_options_from(args)
    urls = shard_urls(args.url_pattern, options)
    report = stream_pass(
        args, f"{len(urls)} shards", urls, options, dataset_arguments(args), args.limit, args.epoch
    )
    if args.json:
        print_json({"command": NAME, **report.as_dict()})
    else:
        print("\n".join(report.lines()))
    return EXIT_OK


def dataset_arguments(args: argparse.Namespace) -> dict[str, Any]:
    """ShardDataset keywords from the options: one process reads everything, no split."""
    return {
        "shuffle_shards": args.shuffle_shards,
        "shuffle_buffer": args.shuffle_buffer,
        "seed": args.seed,
        "handler": args.handler,
        "prefetch": args.prefetch,
        "max_member_size": args.max_member_size,
        "split_by_node": False,
        "split_by_worker": False,
    }


def stream_pass(
    args: argparse.Namespace,
    title: str,
    urls: list[str],
    options: dict[str, dict],
    dataset_kwargs: dict[str, Any],
    limit: int | None = None,
    epoch: int = 0,
) -> PassReport:
    """One pass of :func:`fsspec_shards.fleet.stream.stream_pass`, with a progress bar."""
    keep_torch_out()
    with progress(args, desc=title, unit=" samples", total=limit) as bar:
        return measure_pass(title, urls, options, dataset_kwargs, limit, epoch, bar.update)


def keep_torch_out() -> None:
    """Make ``import torch`` fail in this process unless it already happened.

    The command line iterates in one process, with no DataLoader, so ShardDataset needs no
    torch base class; importing torch would add seconds to every ``demo`` and ``stream``.
    """
    sys.modules.setdefault("torch", None)
