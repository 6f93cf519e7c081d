"""``demo [DIR]``: write a small seeded dataset and stream it through the cache twice."""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

from fsspec_shards.cli.errors import EXIT_OK
from fsspec_shards.cli.options import SharedOptions, positive_int
from fsspec_shards.cli.stream import stream_pass
from fsspec_shards.fleet.report import format_bytes
from fsspec_shards.fleet.shards import shard_urls
from fsspec_shards.option_shapes import LAYER
from fsspec_shards.storage import default_of

NAME = "demo"
DEFAULT_DEMO_DIR = "fsspec-shards-demo"
CACHE_VARIABLES = ("FSSPEC_SHARDS_CACHE", "WDS_CACHE")


def add_parser(commands: Any, shared: SharedOptions) -> None:
    """Register ``demo`` and its options."""
    parser = commands.add_parser(
        NAME,
        parents=[shared.output],
        help="make a small dataset on local disk and stream it through the cache",
        description="Write a seeded sample dataset (tar shards of .jpg/.cls/.json samples "
        "and a SHA256SUMS manifest) into DIR, then stream it through wds:: twice: with a "
        "cold cache, then from the cache. Needs no network.",
    )
    parser.add_argument(
        "directory", nargs="?", metavar="DIR", help=f"where to write (default ./{DEFAULT_DEMO_DIR})"
    )
    parser.add_argument(
        "--cache-dir",
        metavar="DIR",
        help="cache directory (default: FSSPEC_SHARDS_CACHE, then WDS_CACHE, else DIR/cache)",
    )
    parser.add_argument("--shards", type=positive_int, default=8, help="number of shards")
    parser.add_argument("--samples", type=positive_int, default=250, help="samples per shard")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from fsspec_shards.fleet.demo import make_cold, make_demo_dataset

    directory = Path(args.directory or DEFAULT_DEMO_DIR).expanduser().resolve()
    started = time.perf_counter()
    demo = make_demo_dataset(directory, shards=args.shards, samples_per_shard=args.samples)
    print(
        f"wrote {len(demo.shards)} shards x {demo.samples_per_shard} samples "
        f"({format_bytes(sum(p.stat().st_size for p in demo.shards))}) and "
        f"{demo.manifest.name} to {directory} in {time.perf_counter() - started:.2f} s"
    )
    cache_dir = demo_cache_dir(args, directory)
    options = {LAYER: {"cache_dir": cache_dir, "checksums": str(demo.manifest)}}
    urls = shard_urls(demo.pattern, {})
    make_cold(urls, options, own_cache=cache_dir == str(directory / "cache"))
    kwargs = {"shuffle_shards": False, "split_by_node": False, "split_by_worker": False}
    for title in ("pass 1: cold cache", "pass 2: from cache"):
        report = stream_pass(args, title, urls, options, kwargs)
        print("\n".join(report.lines()))
        if report.samples != demo.total_samples:
            raise RuntimeError(f"expected {demo.total_samples} samples, got {report.samples}")
    print(
        "\nnext: fsspec-shards verify '"
        + demo.pattern
        + f"' --manifest {demo.manifest}\n      fsspec-shards cache info --cache-dir {cache_dir}"
    )
    return EXIT_OK


def demo_cache_dir(args: argparse.Namespace, directory: Path) -> str:
    """--cache-dir, else the user's cache (FSSPEC_SHARDS_CACHE / WDS_CACHE) when set, else a
    cache inside the demo's own directory, so that a first try leaves nothing elsewhere."""
    if args.cache_dir:
        return os.path.abspath(os.path.expanduser(args.cache_dir))
    if any(os.environ.get(name) for name in CACHE_VARIABLES):
        return os.path.abspath(default_of("cache_dir"))
    return str(directory / "cache")
