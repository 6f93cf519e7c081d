"""``stream URL_PATTERN``: iterate a dataset once and report samples/s, MB/s, hit rate, retries."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from fsspec_shards.cli.errors import EXIT_OK, UsageError, describe_error
from fsspec_shards.cli.options import (
    SharedOptions,
    non_negative_int,
    positive_int,
    storage_options_from,
)
from fsspec_shards.cli.report import STAT_KEYS, PassReport, print_json, progress, storage_stats
from fsspec_shards.cli.shards import open_filesystem, shard_urls
from fsspec_shards.errors import ShardFormatError

NAME = "stream"


def add_parser(commands: Any, shared: SharedOptions) -> None:
    """Register ``stream`` and its options."""
    parser = commands.add_parser(
        NAME,
        parents=[shared.output, shared.storage, shared.cache, shared.reading, shared.json],
        help="iterate a dataset and report samples/s, MB/s, cache hit rate, retries",
        description="Iterate the samples of URL_PATTERN (braces and globs expand; plain "
        "URLs and paths are read through wds::) and report on the throughput.",
    )
    parser.add_argument("url_pattern", metavar="URL_PATTERN")
    parser.add_argument(
        "--shuffle-shards",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="shuffle shard order by (seed, epoch) (default off)",
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
        type=non_negative_int,
        default=2,
        metavar="N",
        help="shards fetched ahead (default 2)",
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
    """Iterate a ShardDataset over ``urls`` once, with a progress bar, and report on it."""
    fs, _ = open_filesystem(urls[0], options)
    keep_torch_out()
    from fsspec_shards.iteration.dataset import ShardDataset

    before = storage_stats(fs)
    try:
        dataset = ShardDataset(urls, storage_options=options, **dataset_kwargs)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    dataset.set_epoch(epoch)
    report = PassReport(title, cache_enabled=options.get("wds", {}).get("cache") is not False)
    started = time.perf_counter()
    with progress(args, desc=title, unit=" samples", total=limit) as bar:
        for sample in dataset:
            report.samples += 1
            report.payload_bytes += sum(
                len(value) for key, value in sample.items() if not key.startswith("__")
            )
            bar.update()
            if limit is not None and report.samples >= limit:
                break
    report.seconds = time.perf_counter() - started
    after = storage_stats(fs)
    report.storage = {key: after[key] - before[key] for key in STAT_KEYS}
    stats = dataset.stats()
    for _, error in stats.get("failures", []):
        if not isinstance(error, OSError | ShardFormatError):
            raise error  # not a broken shard: a bad option or a bug, whatever the handler
    report.failed_shards = int(stats.get("shards_failed", 0))
    report.shards = int(stats.get("shards_done", 0)) + report.failed_shards
    report.failures = [(url, describe_error(error)) for url, error in stats.get("failures", [])]
    return report


def keep_torch_out() -> None:
    """Make ``import torch`` fail in this process unless it already happened.

    The command line iterates in one process, with no DataLoader, so ShardDataset needs no
    torch base class; importing torch would add seconds to every ``demo`` and ``stream``.
    """
    sys.modules.setdefault("torch", None)
