"""The one builder of ``wds`` filesystems for tests: a new instance each call (fsspec's
instance cache skipped), so no test sees another's options or counters."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import fsspec

from fsspec_shards import WdsFileSystem

QUICK_RETRIES = {"backoff": 0.01, "max_backoff": 0.05}
"""Retry pauses short enough for tests that make requests fail on purpose."""


def wds_filesystem(
    target_protocol: str | None = None,
    target_options: dict[str, Any] | None = None,
    *,
    cache_dir: str | Path | None = None,
    **options: Any,
) -> WdsFileSystem:
    """A new ``wds`` filesystem over ``target_protocol`` (or ``fs=``), caching in
    ``cache_dir``; ``options`` as :class:`WdsFileSystem` takes them."""
    given = {
        "target_protocol": target_protocol,
        "target_options": target_options,
        "cache_dir": None if cache_dir is None else str(cache_dir),
    }
    chosen = {name: value for name, value in given.items() if value is not None}
    return fsspec.filesystem("wds", skip_instance_cache=True, **chosen, **options)
