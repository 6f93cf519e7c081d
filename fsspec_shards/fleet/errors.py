"""The errors of the fleet chores, and how a shard's problem is described in a report.

Invariant: a chore raises :class:`InputError` before it touches a shard (the request cannot be
used) and :class:`ShardsFailed` when it refuses to finish with holes (a manifest missing a
shard); a single shard's storage or format problem is a line of its report, never an exception.
Every text here is redacted.
"""

from __future__ import annotations

from collections.abc import Sequence

from fsspec_shards.errors import IntegrityError, ShardFormatError
from fsspec_shards.redact import redact_text


class InputError(ValueError):
    """A chore cannot use what it was given: a URL pattern matching nothing, an unknown
    protocol, a missing or malformed manifest, a dask scheduler it cannot reach."""


class ShardsFailed(Exception):
    """Some shards could not be read or fetched; ``failures`` holds (shard, problem) rows,
    shards shown as reports show them."""

    def __init__(self, message: str, failures: Sequence[tuple[str, str]]) -> None:
        super().__init__(message)
        self.failures = list(failures)


def describe_error(error: BaseException) -> str:
    """A short description of why a shard failed, every URL in it redacted."""
    if isinstance(error, FileNotFoundError):
        kind = "not found"
    elif isinstance(error, PermissionError):
        kind = "permission denied"
    elif isinstance(error, IntegrityError):
        kind = "integrity"
    elif isinstance(error, ShardFormatError):
        kind = "malformed tar"
    else:
        kind = type(error).__name__
    if isinstance(error, OSError) and error.strerror:
        message = error.strerror + (f": {error.filename}" if error.filename else "")
    else:
        message = str(error)
    if not message.startswith(kind):
        message = f"{kind}: {message}" if message else kind
    return redact_text(message)
