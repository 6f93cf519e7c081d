"""The ``fsspec-shards`` command line: demo, stream, prefetch, verify, manifest and cache.

The one place that uses both towers: the storage layer (the ``wds`` filesystem and its cache)
and the iteration module (shard patterns, the tar reader, ``ShardDataset``). One module per
subcommand, each with ``NAME``, ``add_parser(commands, shared)`` and a ``run(args)`` it sets as
the parser's default; shared options live in :mod:`.options`, output in :mod:`.report`.

Exit codes (:mod:`.errors`): 0 success; 1 a check failed (``verify`` found a bad shard); 2
usage error (bad argument, option or URL pattern); 3 storage or data error (not found, denied,
integrity, malformed shard); 4 unexpected internal error; 130 interrupted (Ctrl-C); 141 the
reader of standard output went away (``| head``).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Iterable

from fsspec_shards import __version__
from fsspec_shards.cli import cache, demo, manifest, prefetch, stream, verify
from fsspec_shards.cli.errors import (
    EXIT_BROKEN_PIPE,
    EXIT_CODES_HELP,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_STORAGE,
    EXIT_USAGE,
    StorageFailure,
    UsageError,
    describe_error,
)
from fsspec_shards.cli.options import CommandParser, shared_options
from fsspec_shards.errors import ShardFormatError

PROGRAM = "fsspec-shards"
SUBCOMMANDS = (demo, stream, prefetch, verify, manifest, cache)

logger = logging.getLogger("fsspec_shards.cli")


def build_parser() -> CommandParser:
    """The argparse parser of ``fsspec-shards`` and its subcommands."""
    parser = CommandParser(
        prog=PROGRAM,
        description="Stream, cache and check webdataset-format shards on any fsspec storage.",
        epilog=EXIT_CODES_HELP,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    shared = shared_options()
    for module in SUBCOMMANDS:
        module.add_parser(commands, shared)
    return parser


def configure_logging(args: argparse.Namespace) -> None:
    level = logging.DEBUG if args.verbose else logging.WARNING
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("fsspec_shards").setLevel(level)


def fail(args: argparse.Namespace, code: int, message: str) -> int:
    """Print one line on stderr (and the traceback with --verbose); return ``code``."""
    if getattr(args, "verbose", False):
        logger.exception("%s failed", args.command)
    print(f"{PROGRAM} {args.command}: error: {message}", file=sys.stderr)
    return code


def main(argv: Iterable[str] | None = None) -> int:
    """Run the command line; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(None if argv is None else list(argv))
    if getattr(args, "jobs", 1) < 1:
        parser.error("--jobs must be at least 1")
    if getattr(args, "retries", None) is not None and args.retries < 0:
        parser.error("--retries must not be negative")
    configure_logging(args)
    try:
        return args.run(args)
    except UsageError as exc:
        return fail(args, EXIT_USAGE, str(exc))
    except StorageFailure as exc:
        return fail(args, EXIT_STORAGE, str(exc))
    except (OSError, ShardFormatError) as exc:
        return fail(args, EXIT_STORAGE, describe_error(exc))
    except KeyboardInterrupt:
        return fail(args, EXIT_INTERRUPTED, "interrupted")
    except BrokenPipeError:
        # The reader of our output went away (e.g. `| head`): stop quietly, as shells expect.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except Exception as exc:
        hint = "" if args.verbose else " (run with --verbose for the traceback)"
        return fail(args, EXIT_INTERNAL, f"{describe_error(exc)}{hint}")
