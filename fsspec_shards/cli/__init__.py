"""The ``fsspec-shards`` command line: demo, stream, prefetch, verify, manifest and cache.

It parses arguments and prints; the work is library code in :mod:`fsspec_shards.fleet` (the
chores and their executors), which the dask face :mod:`fsspec_shards.distributed` runs too.
One module per subcommand, each with ``NAME``, ``add_parser(commands, shared)`` and a
``run(args)`` it sets as the parser's default; shared options live in :mod:`.options`,
output in :mod:`.report`. No library module imports this package.

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
    EXIT_CHECK_FAILED,
    EXIT_CODES_HELP,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_STORAGE,
    EXIT_USAGE,
    PROGRAM,
    CheckFailed,
    UsageError,
)
from fsspec_shards.cli.options import CommandParser, shared_options
from fsspec_shards.errors import OptionError, ShardFormatError
from fsspec_shards.fleet.errors import InputError, ShardsFailed, describe_error
from fsspec_shards.redact import redact_text

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
    """Warnings on stderr; our DEBUG lines with --verbose. dask's own chatter (a local
    cluster starting and stopping) only with --verbose, its errors always."""
    level = logging.DEBUG if args.verbose else logging.WARNING
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("fsspec_shards").setLevel(level)
    if not args.verbose:  # a filter on the handler: importing distributed resets its levels
        for handler in logging.getLogger().handlers:
            handler.addFilter(_quiet_dask)


def _quiet_dask(record: logging.LogRecord) -> bool:
    return record.levelno >= logging.ERROR or not record.name.startswith("distributed")


def fail(args: argparse.Namespace, code: int, message: str) -> int:
    """Print one line on stderr (and the traceback with --verbose); return ``code``."""
    if getattr(args, "verbose", False) and code not in (EXIT_CHECK_FAILED, EXIT_USAGE):
        logger.exception("%s failed", args.command)
    print(f"{PROGRAM} {args.command}: error: {redact_text(message)}", file=sys.stderr)
    return code


def main(argv: Iterable[str] | None = None) -> int:
    """Run the command line; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(None if argv is None else list(argv))
    if getattr(args, "retries", None) is not None and args.retries < 0:
        parser.error("argument --retries: must not be negative")
    configure_logging(args)
    try:
        code = args.run(args)
        sys.stdout.flush()  # a closed pipe shows here, not at exit
        return code
    except BrokenPipeError:
        # The reader of our output went away (e.g. `| head`): stop quietly, as shells expect.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except CheckFailed as exc:
        return fail(args, EXIT_CHECK_FAILED, str(exc))
    except (UsageError, InputError) as exc:
        return fail(args, EXIT_USAGE, str(exc))
    except ShardsFailed as exc:
        return fail(args, EXIT_STORAGE, str(exc))
    except OptionError as exc:  # the library names the option (PROTOCOL.KEY) when it is made
        return fail(args, EXIT_USAGE, str(exc))
    except (OSError, ShardFormatError) as exc:
        return fail(args, EXIT_STORAGE, describe_error(exc))
    except KeyboardInterrupt:
        return fail(args, EXIT_INTERRUPTED, "interrupted")
    except Exception as exc:
        hint = "" if args.verbose else " (run with --verbose for the traceback)"
        return fail(args, EXIT_INTERNAL, f"{describe_error(exc)}{hint}")
