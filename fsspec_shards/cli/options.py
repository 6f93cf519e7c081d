"""Options the subcommands share: the parent parsers, and storage options from flags.

Storage options reach the command as ``{protocol: {key: value}}``, merged in this order, each
overriding the one before: ``--options-file``, ``--option PROTOCOL.KEY=VALUE``, then the
dedicated flags (``--retries``, ``--cache-dir``, ``--cache-size``, ``--no-cache``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from fsspec_shards.cli.errors import EXIT_USAGE, UsageError
from fsspec_shards.config import DEFAULT_MAX_MEMBER_SIZE, parse_size
from fsspec_shards.fleet.errors import InputError
from fsspec_shards.fleet.executors import Executor, ThreadExecutor
from fsspec_shards.fleet.report import format_bytes
from fsspec_shards.option_shapes import LAYER
from fsspec_shards.storage import OPTIONS


class CommandParser(argparse.ArgumentParser):
    """An argparse parser whose errors are one line on stderr, exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")


@dataclass(frozen=True)
class SharedOptions:
    """The parent parsers a subcommand picks its shared options from."""

    output: CommandParser
    storage: CommandParser
    cache: CommandParser
    jobs: CommandParser
    reading: CommandParser
    json: CommandParser


def shared_options() -> SharedOptions:
    """Build the parent parsers: output loudness, storage, cache and parallelism."""
    output = CommandParser(add_help=False)
    loudness = output.add_mutually_exclusive_group()
    loudness.add_argument(
        "-v", "--verbose", action="store_true", help="log details; show tracebacks on errors"
    )
    loudness.add_argument(
        "-q", "--quiet", action="store_true", help="no progress bars, only results and errors"
    )

    storage = CommandParser(add_help=False)
    group = storage.add_argument_group("storage")
    group.add_argument(
        "--option",
        action="append",
        metavar="PROTOCOL.KEY=VALUE",
        help="a storage option, repeatable, e.g. s3.endpoint_url=http://localhost:9000 or "
        "wds.verify=false (values parse as JSON when they can)",
    )
    group.add_argument(
        "--options-file",
        metavar="FILE",
        help='storage options from a .json or .toml file: {"s3": {...}, "wds": {...}}',
    )
    group.add_argument("--retries", type=int, metavar="N", help=wds_help("retries"))

    cache = CommandParser(add_help=False)
    group = cache.add_argument_group("cache")
    group.add_argument("--cache-dir", metavar="DIR", help=wds_help("cache_dir"))
    group.add_argument("--cache-size", metavar="SIZE", help=wds_help("cache_size"))
    group.add_argument(
        "--no-cache", action="store_true", help="stream with retries and checks, keep nothing"
    )

    jobs = CommandParser(add_help=False)
    jobs.add_argument(
        "-j",
        "--jobs",
        type=positive_int,
        default=8,
        metavar="N",
        help="shards in parallel (default 8; with --dask, threads across the workers)",
    )
    jobs.add_argument(
        "--dask",
        metavar="SCHEDULER",
        help="fan out over a dask cluster: a scheduler address (tcp://host:8786) or local:N "
        "for N local worker processes (needs fsspec-shards[dask])",
    )

    reading = CommandParser(add_help=False)
    reading.add_argument(
        "--max-member-size",
        type=size_type,
        default=DEFAULT_MAX_MEMBER_SIZE,
        metavar="SIZE",
        help="larger tar members are malformed shards "
        f"(default {format_bytes(DEFAULT_MAX_MEMBER_SIZE)})",
    )

    json_output = CommandParser(add_help=False)
    json_output.add_argument(
        "--json", action="store_true", help="print the report as one JSON object on stdout"
    )
    return SharedOptions(output, storage, cache, jobs, reading, json_output)


def wds_help(name: str) -> str:
    """The help of a flag that sets the ``wds`` option ``name``: its doc line, variables and
    default, from the options table (sizes in binary units)."""
    option = OPTIONS[name]
    built_in = option.default() if callable(option.default) else option.default
    shown = format_bytes(built_in) if option.bytes else str(built_in)
    environment = f"; from {' or '.join(option.env)} when set" if option.env else ""
    return f"{option.doc}{environment} (default {shown})"


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1."""
    return _int_at_least(text, 1)


def non_negative_int(text: str) -> int:
    """An argparse type: an integer >= 0."""
    return _int_at_least(text, 0)


def prefetch_depth(text: str) -> int | str:
    """An argparse type: ``auto`` or an integer >= 0 (``ShardDataset``'s ``prefetch``)."""
    return "auto" if text == "auto" else _int_at_least(text, 0)


def _int_at_least(text: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
    return value


def size_type(text: str) -> int:
    """An argparse type: a byte count, ``1GiB``, ``500MB`` or a plain integer."""
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parse_option(text: str) -> tuple[list[str], Any]:
    """Split ``s3.endpoint_url=http://host`` into (["s3", "endpoint_url"], value).

    The value is parsed as JSON when it parses (numbers, true/false, objects), else kept as a
    string. Dots after the protocol nest: ``s3.client_kwargs.region_name=eu-west-1``.
    """
    key, separator, raw = text.partition("=")
    path = key.strip().split(".")
    if not separator or len(path) < 2 or not all(path):
        raise UsageError(
            f"invalid --option {key.strip()!r}: expected PROTOCOL.KEY=VALUE, "
            "e.g. s3.endpoint_url=http://localhost:9000"
        )
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    return path, value


def load_options_file(path: str) -> dict[str, dict]:
    """Read ``{protocol: {key: value}}`` from a ``.json`` or ``.toml`` file."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read options file {path}: {exc.strerror or exc}") from None
    try:
        options = _load_toml(data) if path.endswith(".toml") else json.loads(data)
    except ValueError as exc:
        raise UsageError(f"options file {path} is not valid: {exc}") from None
    if not isinstance(options, dict) or not all(isinstance(v, dict) for v in options.values()):
        raise UsageError(
            f"options file {path} must map each protocol to a table of options, "
            'e.g. {"s3": {"endpoint_url": "..."}, "wds": {"retries": 5}}'
        )
    return options


def _load_toml(data: bytes) -> dict:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        try:
            import tomli as tomllib
        except ImportError:
            raise UsageError("TOML options files need Python 3.11+ or the tomli package") from None
    return tomllib.loads(data.decode())


def storage_options_from(args: argparse.Namespace) -> dict[str, dict]:
    """The per-protocol storage options of a command: file, then --option, then flags."""
    options: dict[str, dict] = {}
    if getattr(args, "options_file", None):
        options = load_options_file(args.options_file)
    for text in getattr(args, "option", None) or []:
        path, value = parse_option(text)
        table = options
        for name in path[:-1]:
            table = table.setdefault(name, {})
            if not isinstance(table, dict):
                raise UsageError(f"--option {'.'.join(path)} nests under a non-table value")
        table[path[-1]] = value
    wds = options.setdefault(LAYER, {})
    if getattr(args, "retries", None) is not None:
        wds["retries"] = args.retries
    if getattr(args, "cache_dir", None):
        wds["cache_dir"] = os.path.abspath(os.path.expanduser(args.cache_dir))
    if getattr(args, "cache_size", None):
        wds["cache_size"] = size_argument(args.cache_size)
    if getattr(args, "no_cache", False):
        wds["cache"] = False
    return options


def streaming_options(args: argparse.Namespace) -> dict[str, dict]:
    """Storage options for reading each shard once: straight from storage, no cache."""
    options = storage_options_from(args)
    options[LAYER]["cache"] = False
    return options


def size_argument(text: str) -> int:
    """A byte count from the command line, as a usage error when malformed."""
    try:
        return parse_size(text)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


@contextlib.contextmanager
def executor_for(args: argparse.Namespace) -> Iterator[Executor]:
    """Where a command's per-shard work runs: ``--jobs`` threads here, or ``--dask``."""
    if not getattr(args, "dask", None):
        yield ThreadExecutor(args.jobs)
        return
    from fsspec_shards.fleet.dask_executor import dask_executor

    with contextlib.ExitStack() as stack:
        try:
            executor = stack.enter_context(dask_executor(args.dask, jobs=args.jobs))
        except (ImportError, InputError) as exc:
            raise UsageError(f"--dask: {exc}") from None
        yield executor
