"""Exit codes and the exceptions that choose them.

Invariant: every way a command can end maps to one exit code here, and every non-zero code
comes with one line on standard error (written by :mod:`fsspec_shards.cli`'s ``main``).
"""

from __future__ import annotations

from fsspec_shards.errors import IntegrityError, ShardFormatError

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


class UsageError(Exception):
    """The arguments, options or URL pattern given cannot be used (exit code 2)."""


class StorageFailure(Exception):
    """Work on some shards failed for storage reasons (exit code 3)."""


def describe_error(error: BaseException) -> str:
    """A short, secret-free description of why a shard failed."""
    if isinstance(error, FileNotFoundError):
        kind = "not found"
    elif isinstance(error, PermissionError):
        kind = "permission denied"
    elif isinstance(error, IntegrityError):
        kind = "integrity"
    elif isinstance(error, ShardFormatError):
        kind = "malformed tar"
    elif isinstance(error, LookupError):
        kind = "not in the manifest"
    else:
        kind = type(error).__name__
    if isinstance(error, OSError) and error.strerror:
        message = error.strerror + (f": {error.filename}" if error.filename else "")
    else:
        message = str(error)
    if message.startswith(kind):
        return message
    return f"{kind}: {message}" if message else kind
