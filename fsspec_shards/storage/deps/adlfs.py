"""adlfs beyond its public API.

Uses:

- ``AzureBlobFileSystem._timeout_kwargs``: the ``connection_timeout``/``read_timeout`` the
  user gave, as adlfs hands them to every SDK call (ours too, and the shortest bounds our
  streaming).
"""

from __future__ import annotations

from typing import Any

import fsspec


def timeout_kwargs(fs: fsspec.AbstractFileSystem) -> dict[str, Any]:
    """The SDK time-out keywords adlfs instance ``fs`` passes to each call."""
    return dict(getattr(fs, "_timeout_kwargs", None) or {})
