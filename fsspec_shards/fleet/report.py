"""What every chore's report shares: shards named as reports show them, byte counts in one
unit system, and the cache counters read from a ``wds`` filesystem.

Invariant: sizes are shown in binary units (KiB, MiB, GiB: the units of the defaults, such as
the 20 GiB cache bound), everywhere a report or a progress bar shows bytes.
"""

from __future__ import annotations

from typing import Any

from fsspec_shards.counters import COUNTERS
from fsspec_shards.fleet.shards import comparable
from fsspec_shards.redact import redact_url

BINARY_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def format_bytes(count: float) -> str:
    """``13.2 MiB``: binary units, whole bytes below 1 KiB, whole units when exact
    (``20 GiB``)."""
    for unit in BINARY_UNITS:
        if abs(count) < 1024 or unit == BINARY_UNITS[-1]:
            break
        count /= 1024
    if unit == "B" or float(count).is_integer():
        return f"{count:.0f} {unit}"
    return f"{count:.1f} {unit}"


def storage_stats(fs: Any) -> dict[str, int]:
    """The cache counters of a wds filesystem (zeros for any other filesystem)."""
    stats = fs.cache_stats() if hasattr(fs, "cache_stats") else {}
    return {key: int(stats.get(key, 0)) for key in COUNTERS}


def shown(url: str) -> str:
    """A shard URL as reports show it: plain, local paths without ``file://``, redacted."""
    return redact_url(comparable(url))
