"""``cache info | ls | clear``: look at and empty a cache directory."""

from __future__ import annotations

import argparse
import os
from typing import Any

from fsspec_shards.cli.errors import EXIT_OK
from fsspec_shards.cli.options import SharedOptions, size_argument
from fsspec_shards.cli.report import print_json
from fsspec_shards.counters import COUNTERS
from fsspec_shards.fleet.cache import existing_cache
from fsspec_shards.fleet.report import format_bytes
from fsspec_shards.redact import redact_url
from fsspec_shards.storage import default_of

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
        parents = [shared.output, shared.json] if name == "info" else [shared.output]
        action = actions.add_parser(name, parents=parents, help=text, description=text)
        action.add_argument(
            "--cache-dir", metavar="DIR", help="cache directory (default: FSSPEC_SHARDS_CACHE, ...)"
        )
        action.add_argument("--cache-size", metavar="SIZE", help=argparse.SUPPRESS)
        action.set_defaults(run=run)


def cache_directory(args: argparse.Namespace) -> str:
    return os.path.abspath(os.path.expanduser(args.cache_dir or default_of("cache_dir")))


def open_cache(args: argparse.Namespace, *, writable: bool = False) -> Any:
    """The existing cache of --cache-dir (or the default), read-only unless ``writable``;
    None when there is none yet. Never creates one; a directory that is not a cache (or
    not a safe one) is a usage error naming it."""
    size = size_argument(args.cache_size) if args.cache_size else default_of("cache_size")
    return existing_cache(cache_directory(args), size, writable=writable)


INFO_KEYS = ("cached_files", "cached_bytes", "size_limit", *COUNTERS)


def run_info(args: argparse.Namespace) -> int:
    cache = open_cache(args)
    stats = cache.stats() if cache is not None else {}
    numbers = {key: int(stats.get(key, 0)) for key in INFO_KEYS}
    recorded = cache.recorded_size_limit() if cache is not None else None
    if recorded is not None:  # the limit the cache is used with, not this command's default
        numbers["size_limit"] = recorded
        given = size_argument(args.cache_size) if args.cache_size else None
        if given is not None and given != recorded:
            items = list(numbers.items())
            items.insert(list(numbers).index("size_limit") + 1, ("size_limit_given", given))
            numbers = dict(items)
    if args.json:
        report = {"command": "cache info", "directory": cache_directory(args)}
        print_json({**report, "exists": cache is not None, **numbers})
        return EXIT_OK
    print(f"{'directory':<19} {cache_directory(args)}")
    if cache is None:
        print(f"{'cached files':<19} 0 (no cache yet)")
        return EXIT_OK
    for key, value in numbers.items():
        shown = value
        if key.endswith(("_bytes", "_limit", "_downloaded", "_given")):
            shown = format_bytes(value)
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
    cache = open_cache(args, writable=True)
    before = cache.stats() if cache is not None else {}
    if cache is not None:
        cache.clear()
    print(
        f"removed {before.get('cached_files', 0)} files "
        f"({format_bytes(before.get('cached_bytes', 0))}) from {cache_directory(args)}"
    )
    return EXIT_OK
