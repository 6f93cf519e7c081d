"""Exit codes and the exceptions that choose them.

Invariant: every way a command can end maps to one exit code here, and every non-zero code
comes with one line on standard error (written by :mod:`fsspec_shards.cli`'s ``main``). The
library's errors map too: :class:`fsspec_shards.fleet.errors.InputError` is a usage error,
:class:`~fsspec_shards.fleet.errors.ShardsFailed` a storage error.
"""

from __future__ import annotations

PROGRAM = "fsspec-shards"

EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_USAGE = 2
EXIT_STORAGE = 3
EXIT_INTERNAL = 4
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141

EXIT_CODES_HELP = (
    "exit codes: 0 ok, 1 check failed, 2 usage error, 3 storage or data error, "
    "4 internal error, 130 interrupted, 141 output closed"
)


class UsageError(ValueError):
    """The arguments, options or URL pattern given cannot be used (exit code 2)."""


class CheckFailed(Exception):
    """A check found bad shards; the report is printed already (exit code 1)."""
