"""What commands print: progress bars, byte counts, storage counters and result tables.

Invariants: results go to standard output, progress bars to standard error (hidden with
``--quiet`` or when standard error is no terminal), and every URL shown passes through
:func:`fsspec_shards.redact.redact_url`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from fsspec_shards.cli.errors import describe_error
from fsspec_shards.cli.shards import comparable
from fsspec_shards.redact import redact_url

STAT_KEYS = ("hits", "misses", "bytes_downloaded", "retries", "integrity_failures")


def progress(args: argparse.Namespace, **kwargs: Any):
    """A tqdm progress bar on stderr, hidden with --quiet and when stderr is no terminal."""
    from tqdm import tqdm

    return tqdm(disable=True if args.quiet else None, file=sys.stderr, dynamic_ncols=True, **kwargs)


def format_bytes(count: float) -> str:
    """``13.8 MB``: decimal units, whole bytes below 1 kB."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(count) < 1000 or unit == "TB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1000
    return f"{count:.1f} TB"


def storage_stats(fs: Any) -> dict[str, int]:
    """The counters of a wds filesystem (zeros for any other filesystem)."""
    stats = fs.cache_stats() if hasattr(fs, "cache_stats") else {}
    return {key: int(stats.get(key, 0)) for key in STAT_KEYS}


def shown(url: str) -> str:
    """A shard URL as commands print it: plain, local paths without ``file://``, redacted."""
    return redact_url(comparable(url))


def print_failures(failures: Iterable[tuple[str, BaseException]]) -> None:
    """A table of failed shards on stdout: shard, then why, sorted by shard."""
    rows = [(shown(url), describe_error(error)) for url, error in failures]
    width = max(len("shard"), *(len(shard) for shard, _ in rows))
    print(f"{'shard':<{width}}  problem")
    for shard, problem in sorted(rows):
        print(f"{shard:<{width}}  {problem}")


@dataclass
class PassReport:
    """The numbers printed after streaming a dataset once."""

    title: str
    cache_enabled: bool = True
    samples: int = 0
    payload_bytes: int = 0
    seconds: float = 0.0
    shards: int = 0
    failed_shards: int = 0
    storage: dict[str, int] = field(default_factory=dict)
    failures: list[tuple[str, str]] = field(default_factory=list)

    def shard_hit_rate(self) -> str:
        """The share of shards read that were in the cache already (not downloaded)."""
        if not self.cache_enabled:
            return "cache off"
        if not self.shards:
            return "n/a"
        downloaded = min(self.storage.get("misses", 0), self.shards)
        return f"{100 * (self.shards - downloaded) / self.shards:.0f}% of shards"

    def lines(self) -> list[str]:
        seconds = max(self.seconds, 1e-9)
        rows = [
            ("samples", f"{self.samples}"),
            ("time", f"{self.seconds:.2f} s"),
            ("samples/s", f"{self.samples / seconds:,.0f}"),
            ("MB/s", f"{self.payload_bytes / seconds / 1e6:,.1f}"),
            ("cache hit rate", self.shard_hit_rate()),
            ("cache hits/misses", f"{self.storage['hits']} / {self.storage['misses']}"),
            ("downloaded", format_bytes(self.storage["bytes_downloaded"])),
            ("retries", f"{self.storage['retries']}"),
            ("integrity failures", f"{self.storage['integrity_failures']}"),
            ("failed shards", f"{self.failed_shards}"),
        ]
        lines = [self.title] + [f"  {name:<19} {value}" for name, value in rows]
        lines += [f"  failed: {shown(url)}: {why}" for url, why in self.failures]
        return lines
