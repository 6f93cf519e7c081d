"""The ``stream`` chore: iterate a dataset once and measure it (samples/s, bytes/s, how many
shards came from the cache, retries).

Invariants: the report's cache numbers are per shard of the pass. The cache's own counters
count lookups of every process sharing the cache (a shard the dataset prefetches ahead is one
miss, its read no extra hit); the hit rate is the share of the pass's shards that were not
downloaded, and the raw counters (the growth of each over the pass) are kept for ``--json``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fsspec_shards.counters import COUNTERS
from fsspec_shards.errors import ShardFormatError
from fsspec_shards.fleet.errors import InputError, describe_error
from fsspec_shards.fleet.report import format_bytes, shown, storage_stats
from fsspec_shards.fleet.shards import open_filesystem
from fsspec_shards.option_shapes import cache_is_off
from fsspec_shards.units import MiB


@dataclass
class PassReport:
    """The numbers of one pass over a dataset."""

    title: str
    cache_enabled: bool = True
    samples: int = 0
    payload_bytes: int = 0
    seconds: float = 0.0
    shards: int = 0
    failed_shards: int = 0
    storage: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0))
    failures: list[tuple[str, str]] = field(default_factory=list)

    @property
    def downloaded_shards(self) -> int:
        """Shards of the pass that were fetched from the backend (each a cache miss)."""
        return min(self.storage.get("misses", 0), self.shards)

    def hit_fraction(self) -> float | None:
        """The share of shards read that were in the cache already (not downloaded)."""
        if not self.cache_enabled or not self.shards:
            return None
        return (self.shards - self.downloaded_shards) / self.shards

    def shard_hit_rate(self) -> str:
        if not self.cache_enabled:
            return "cache off"
        fraction = self.hit_fraction()
        if fraction is None:
            return "n/a"
        cached = self.shards - self.downloaded_shards
        return f"{100 * fraction:.0f}% of shards ({cached} of {self.shards} cached already)"

    def downloaded(self) -> str:
        amount = format_bytes(self.storage.get("bytes_downloaded", 0))
        if not self.cache_enabled:
            return amount
        shards = self.downloaded_shards
        return f"{amount} ({shards} shard{'' if shards == 1 else 's'})"

    def as_dict(self) -> dict[str, Any]:
        """The report for ``--json``: the same numbers, unrounded, rates per second."""
        seconds = max(self.seconds, 1e-9)
        return {
            "title": self.title,
            "samples": self.samples,
            "payload_bytes": self.payload_bytes,
            "seconds": self.seconds,
            "samples_per_second": self.samples / seconds,
            "megabytes_per_second": self.payload_bytes / seconds / 1e6,
            "cache": self.cache_enabled,
            "shard_hit_rate": self.hit_fraction(),
            "shards": self.shards,
            "downloaded_shards": self.downloaded_shards if self.cache_enabled else None,
            "failed_shards": self.failed_shards,
            "storage": dict(self.storage),
            "failures": [{"shard": shown(url), "problem": why} for url, why in self.failures],
        }

    def lines(self) -> list[str]:
        seconds = max(self.seconds, 1e-9)
        rows = [
            ("samples", f"{self.samples}"),
            ("time", f"{self.seconds:.2f} s"),
            ("samples/s", f"{self.samples / seconds:,.0f}"),
            ("MiB/s", f"{self.payload_bytes / seconds / MiB:,.1f}"),
            ("cache hit rate", self.shard_hit_rate()),
            ("downloaded", self.downloaded()),
            ("retries", f"{self.storage['retries']}"),
            ("integrity failures", f"{self.storage['integrity_failures']}"),
            ("failed shards", f"{self.failed_shards}"),
        ]
        lines = [self.title] + [f"  {name:<19} {value}" for name, value in rows]
        lines += [f"  failed: {shown(url)}: {why}" for url, why in self.failures]
        return lines


def stream_pass(
    title: str,
    urls: list[str],
    options: dict[str, dict],
    dataset_kwargs: dict[str, Any],
    limit: int | None = None,
    epoch: int = 0,
    advance: Callable[[], Any] = lambda: None,
) -> PassReport:
    """Iterate a ShardDataset over ``urls`` once (``limit`` samples at most) and report on
    it; ``advance()`` after every sample. Arguments the dataset refuses are an
    :class:`InputError`; an error that is not a broken shard is raised, whatever the handler."""
    fs, _ = open_filesystem(urls[0], options)
    from fsspec_shards.iteration.dataset import ShardDataset

    before = storage_stats(fs)
    try:
        dataset = ShardDataset(urls, storage_options=options, **dataset_kwargs)
    except ValueError as exc:
        raise InputError(str(exc)) from None
    dataset.set_epoch(epoch)
    report = PassReport(title, cache_enabled=not cache_is_off(options))
    started = time.perf_counter()
    for sample in dataset:
        report.samples += 1
        report.payload_bytes += sum(
            len(value) for key, value in sample.items() if not key.startswith("__")
        )
        advance()
        if limit is not None and report.samples >= limit:
            break
    report.seconds = time.perf_counter() - started
    after = storage_stats(fs)
    report.storage = {key: after[key] - before[key] for key in COUNTERS}
    stats = dataset.stats()
    for _, error in stats.get("failures", []):
        if not isinstance(error, OSError | ShardFormatError):
            raise error  # not a broken shard: a bad option or a bug, whatever the handler
    report.failed_shards = int(stats.get("shards_failed", 0))
    report.shards = int(stats.get("shards_done", 0)) + report.failed_shards
    report.failures = [(url, describe_error(error)) for url, error in stats.get("failures", [])]
    return report
