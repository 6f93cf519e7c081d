"""``cache info | ls | clear``: look at and empty a cache directory."""

from __future__ import annotations

import argparse
import os
from typing import Any

from fsspec_shards.cli.errors import EXIT_OK
from fsspec_shards.cli.options import SharedOptions, size_argument
from fsspec_shards.cli.report import STAT_KEYS, format_bytes
from fsspec_shards.config import default_cache_dir, default_cache_size
from fsspec_shards.redact import redact_url

NAME = "cache"


def add_parser(commands: Any, shared: SharedOptions) -> None:
    """Register ``cache`` and its actions ``info``, ``ls`` and ``clear``."""
    parser = commands.add_parser(
        NAME,
        help="look at or empty the cache",
        description="Look at or empty a shard cache directory.",
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    for name, run, text in (
        ("info", run_info, "directory, files, bytes and counters"),
        ("ls", run_ls, "one line per cached file: size and URL"),
        ("clear", run_clear, "remove every cached file"),
    ):
        action = actions.add_parser(name, parents=[shared.output], help=text, description=text)
        action.add_argument(
            "--cache-dir", metavar="DIR", help="cache directory (default: FSSPEC_SHARDS_CACHE, ...)"
        )
        action.add_argument("--cache-size", metavar="SIZE", help=argparse.SUPPRESS)
        action.set_defaults(run=run)


def cache_directory(args: argparse.Namespace) -> str:
    return os.path.abspath(os.path.expanduser(args.cache_dir or default_cache_dir()))


def open_cache(args: argparse.Namespace):
    """The ShardCache of --cache-dir (or the default), or None when there is none yet."""
    from fsspec_shards.storage.cache import ShardCache

    directory = cache_directory(args)
    if not os.path.isdir(directory):
        return None
    size = size_argument(args.cache_size) if args.cache_size else default_cache_size()
    return ShardCache(directory, size)


def run_info(args: argparse.Namespace) -> int:
    cache = open_cache(args)
    print(f"{'directory':<19} {cache_directory(args)}")
    if cache is None:
        print(f"{'cached files':<19} 0 (no cache yet)")
        return EXIT_OK
    stats = cache.stats()
    for key in ("cached_files", "cached_bytes", "size_limit", *STAT_KEYS, "evictions"):
        value = stats.get(key, 0)
        shown = format_bytes(value) if key.endswith(("_bytes", "_limit", "_downloaded")) else value
        print(f"{key.replace('_', ' '):<19} {shown}")
    return EXIT_OK


def run_ls(args: argparse.Namespace) -> int:
    cache = open_cache(args)
    if cache is None:
        return EXIT_OK
    for entry in cache.entries():
        print(f"{format_bytes(entry['size']):>10}  {redact_url(entry['url'])}")
    return EXIT_OK


def run_clear(args: argparse.Namespace) -> int:
    cache = open_cache(args)
    before = cache.stats() if cache is not None else {}
    if cache is not None:
        cache.clear()
    print(
        f"removed {before.get('cached_files', 0)} files "
        f"({format_bytes(before.get('cached_bytes', 0))}) from {cache_directory(args)}"
    )
    return EXIT_OK
