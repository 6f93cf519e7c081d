"""Counters of the sample streams, visible in the main process when DataLoader workers read.

Each consumer (a DataLoader worker, or the process iterating) counts in a
:class:`StreamStats`: samples, shards done and failed, sample errors per exception type,
padded samples, tar bytes read, seconds spent and seconds its consumer waited for a sample.
A :class:`StatsBoard` is a directory (a private temporary one made with the dataset, or a run
directory the user names) where every consumer process writes its counters as one small JSON
file, replaced atomically at most every ``FLUSH_SECONDS`` and when its iteration ends;
:meth:`StatsBoard.collect` in any process reads them all. No storage import: this is files.

:class:`ProgressLog` writes the documented INFO line every ``interval`` seconds, with the
cache's hit rate, download rate and retries when the shards are read through a filesystem
that has ``cache_stats()`` (the ``wds`` protocol), reached through fsspec.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import stat
import tempfile
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fsspec_shards.redact import redact_text

logger = logging.getLogger("fsspec_shards.dataset")

FLUSH_SECONDS = 1.0
MAX_FAILURES_KEPT = 100
COUNTERS = (
    "samples",
    "shards_done",
    "shards_failed",
    "padded",
    "bytes_read",
    "wait_seconds",
    "seconds",
)


class ReportedFailure(Exception):
    """A failure recorded by another process: ``kind`` is the original exception's type."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind

    def __reduce__(self):
        return (type(self), (self.kind, str(self)))


@dataclass(slots=True)
class StreamStats:
    """What one consumer process counted, for every dataset iteration it ran."""

    samples: int = 0
    shards_done: int = 0
    shards_failed: int = 0
    padded: int = 0
    bytes_read: int = 0
    wait_seconds: float = 0.0
    seconds: float = 0.0
    sample_errors: dict[str, int] = field(default_factory=dict)
    failures: list[tuple[str, BaseException]] = field(default_factory=list)
    sample_failures: list[tuple[str, str, BaseException]] = field(default_factory=list)
    epoch: int | None = None
    epoch_started: float = 0.0
    epoch_base: tuple[int, float] = (0, 0.0)

    def begin_epoch(self, epoch: int) -> None:
        """A stream of ``epoch`` starts in this process: its epoch rate counts from now
        (``epoch_started`` is wall-clock time, comparable across processes)."""
        self.epoch = epoch
        self.epoch_started = time.time()
        self.epoch_base = (self.samples, self.seconds)

    def epoch_counts(self) -> dict[str, Any]:
        """The latest epoch of this process: its number, wall-clock start, samples, seconds."""
        return {
            "epoch": self.epoch,
            "epoch_started": self.epoch_started,
            "epoch_samples": self.samples - self.epoch_base[0],
            "epoch_seconds": self.seconds - self.epoch_base[1],
        }

    def shard_failed(self, shown_url: str, error: BaseException) -> None:
        self.shards_failed += 1
        if len(self.failures) < MAX_FAILURES_KEPT:
            self.failures.append((shown_url, error))

    def sample_failed(self, shown_url: str, key: str, error: BaseException) -> None:
        kind = type(error).__name__
        self.sample_errors[kind] = self.sample_errors.get(kind, 0) + 1
        if len(self.sample_failures) < MAX_FAILURES_KEPT:
            self.sample_failures.append((shown_url, key, error))

    def to_json(self, who: Mapping[str, int]) -> dict[str, Any]:
        return {
            **who,
            **{name: getattr(self, name) for name in COUNTERS},
            **self.epoch_counts(),
            "sample_errors": dict(self.sample_errors),
            "failures": [_failure(url, error) for url, error in self.failures],
            "sample_failures": [
                {"key": key, **_failure(url, error)} for url, key, error in self.sample_failures
            ],
        }


def _failure(url: str, error: BaseException) -> dict[str, str]:
    return {"url": url, "kind": type(error).__name__, "message": str(error)}


def _rebuilt(entry: Mapping[str, str]) -> ReportedFailure:
    return ReportedFailure(entry["kind"], entry["message"])


def _rate(samples: int, seconds: float) -> float:
    return samples / seconds if seconds > 0 else 0.0


def epoch_rate(epochs: list[Mapping[str, Any]]) -> float:
    """Samples per second of the current epoch across processes: the latest-started epoch's
    samples over the wall-clock span from its first process's start to its last one's end.

    Not the sum of each process's rate: workers feeding one loader overlap, and processes of
    past epochs (DataLoader workers that are not persistent) are not part of it. An epoch
    read again (no ``set_epoch`` between loader iterations) counts its latest run only: a
    consumer (rank, worker) seen again starts a new run, and what started before the end of
    the run it replaces is of earlier runs.
    """
    started = [entry for entry in epochs if entry.get("epoch") is not None]
    if not started:
        return 0.0
    current = max(started, key=lambda entry: entry["epoch_started"])["epoch"]
    entries = sorted(
        (entry for entry in started if entry["epoch"] == current),
        key=lambda entry: entry["epoch_started"],
    )
    latest: dict[tuple[Any, Any], Mapping[str, Any]] = {}
    run_start = float("-inf")
    for entry in entries:
        consumer = (entry.get("rank"), entry.get("worker"))
        replaced = latest.get(consumer)
        if replaced is not None:
            run_start = max(run_start, replaced["epoch_started"] + replaced["epoch_seconds"])
        latest[consumer] = entry
    entries = [entry for entry in entries if entry["epoch_started"] >= run_start]
    first = min(entry["epoch_started"] for entry in entries)
    last = max(entry["epoch_started"] + entry["epoch_seconds"] for entry in entries)
    return _rate(sum(entry["epoch_samples"] for entry in entries), last - first)


def summary(records: list[dict[str, Any]], own: StreamStats | None) -> dict[str, Any]:
    """The dataset's ``stats()`` from the workers' records and this process's own counts.

    Counters are sums over every epoch; ``samples_per_second`` is the current epoch's rate
    (:func:`epoch_rate`), and ``workers`` lists each worker's samples, the rate of its latest
    epoch and the time it waited.
    """
    total: dict[str, Any] = {name: 0 for name in COUNTERS}
    epochs: list[Mapping[str, Any]] = []
    errors: dict[str, int] = {}
    failures: list[tuple[str, BaseException]] = []
    sample_failures: list[tuple[str, str, BaseException]] = []
    workers = []
    for record in records:
        for name in COUNTERS:
            total[name] += record[name]
        for kind, count in record["sample_errors"].items():
            errors[kind] = errors.get(kind, 0) + count
        failures += [(entry["url"], _rebuilt(entry)) for entry in record["failures"]]
        sample_failures += [
            (entry["url"], entry["key"], _rebuilt(entry)) for entry in record["sample_failures"]
        ]
        epochs.append(record)
        workers.append(
            {
                "rank": record["rank"],
                "worker": record["worker"],
                "pid": record["pid"],
                "epoch": record.get("epoch"),  # None in a record of an older version
                "samples": record["samples"],
                "samples_per_second": _rate(
                    record.get("epoch_samples", 0), record.get("epoch_seconds", 0.0)
                ),
                "wait_seconds": record["wait_seconds"],
            }
        )
    if own is not None:
        for name in COUNTERS:
            total[name] += getattr(own, name)
        for kind, count in own.sample_errors.items():
            errors[kind] = errors.get(kind, 0) + count
        failures += own.failures
        sample_failures += own.sample_failures
        epochs.append(own.epoch_counts())
    total["samples_per_second"] = epoch_rate(epochs)
    total["sample_errors"] = errors
    total["failures"] = failures
    total["sample_failures"] = sample_failures
    total["workers"] = workers
    return total


class StatsBoard:
    """A directory of per-process stats files. ``path`` None makes a private temporary one
    (0700, removed when the dataset that made it is collected in the process that made it);
    a path given may be shared by the ranks of a job. ``token`` tells the records of one
    dataset (and its workers' copies) from those of other datasets in the same directory."""

    def __init__(self, path: str | os.PathLike | None = None) -> None:
        self.owned = path is None
        if path is None:
            path = os.path.join(
                tempfile.gettempdir(), f"fsspec-shards-stats-{secrets.token_hex(8)}"
            )
        self.path = os.fspath(path)
        self.owner_pid = os.getpid()
        self.token = secrets.token_hex(8)

    def bind(self, dataset: object) -> None:
        """Remove a private directory once ``dataset`` is collected in this process."""
        if self.owned:
            weakref.finalize(dataset, _remove_private, self.path, self.owner_pid)

    def _ensure(self) -> None:
        try:
            os.mkdir(self.path, 0o700)
        except FileExistsError:
            info = os.stat(self.path)
            if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
                raise ValueError(
                    f"stats directory {self.path} is not a directory owned by this user"
                ) from None

    def write(self, who: Mapping[str, int], stats: StreamStats) -> None:
        """Replace this process's file with ``stats`` (atomically: readers see whole files)."""
        self._ensure()
        name = f"stats-{self.token}-{who['pid']}-{who['rank']}-{who['worker']}.json"
        temporary = os.path.join(self.path, f".{name}.{secrets.token_hex(4)}.tmp")
        with open(temporary, "w", encoding="utf-8") as handle:
            json.dump({**stats.to_json(who), "token": self.token}, handle)
        os.replace(temporary, os.path.join(self.path, name))

    def collect(self) -> list[dict[str, Any]]:
        """Every record but this dataset's in this process (that one counts in memory)."""
        try:
            names = sorted(os.listdir(self.path))
        except FileNotFoundError:
            return []
        records = []
        for name in names:
            if not (name.startswith("stats-") and name.endswith(".json")):
                continue
            try:
                with open(os.path.join(self.path, name), encoding="utf-8") as handle:
                    record = json.load(handle)
            except (OSError, ValueError):
                continue
            if (record.get("token"), record.get("pid")) != (self.token, os.getpid()):
                records.append(record)
        return records

    def __reduce__(self):
        return (_restore_board, (self.path, self.owned, self.owner_pid, self.token))


def _restore_board(path: str, owned: bool, owner_pid: int, token: str) -> StatsBoard:
    board = StatsBoard(path)
    board.owned, board.owner_pid, board.token = owned, owner_pid, token
    return board


def _remove_private(path: str, owner_pid: int) -> None:
    if os.getpid() == owner_pid:
        shutil.rmtree(path, ignore_errors=True)


class ProgressLog:
    """The INFO line every ``interval`` seconds (None or 0: never) for one consumer: samples
    so far and per second and MB/s of tar read since the last line, seconds waited; with a
    cache, its hit rate and retries since the stream began and MB/s downloaded since the
    last line."""

    def __init__(
        self, interval: float | None, label: str, cache_stats: Callable[[], dict] | None
    ) -> None:
        self.interval = interval or 0.0
        self.label = label
        self.cache_stats = cache_stats
        now = time.monotonic()
        self.next_at = now + self.interval
        self.first = self._cache()
        self.last = (now, 0, 0, self.first)

    def _cache(self) -> dict | None:
        """The cache's counters now; None without a cache or when they cannot be read (a
        filesystem's counters must never stop the stream: the first failure is a WARNING,
        then the progress line leaves them out)."""
        if self.cache_stats is None:
            return None
        try:
            return dict(self.cache_stats())
        except Exception as exc:
            logger.warning(
                "%s: cannot read the cache's counters (%s); progress lines leave them out",
                self.label,
                redact_text(f"{type(exc).__name__}: {exc}"),
            )
            self.cache_stats = None
            return None

    def maybe_log(self, stats: StreamStats) -> None:
        if not self.interval or time.monotonic() < self.next_at:
            return
        now = time.monotonic()
        then, samples, read, cache_then = self.last
        cache_now = self._cache()
        elapsed = max(now - then, 1e-9)
        line = (
            f"{self.label}: {stats.samples:,} samples, "
            f"{(stats.samples - samples) / elapsed:,.1f} samples/s, "
            f"{(stats.bytes_read - read) / elapsed / 1e6:,.1f} MB/s read, "
            f"waited {stats.wait_seconds:,.1f} s"
        )
        if cache_now is not None and cache_then is not None and self.first is not None:
            hits, misses, retries = (
                cache_now.get(name, 0) - self.first.get(name, 0)
                for name in ("hits", "misses", "retries")
            )
            downloaded = cache_now.get("bytes_downloaded", 0) - cache_then.get(
                "bytes_downloaded", 0
            )
            rate = f"{100 * hits / (hits + misses):.1f}%" if hits + misses else "n/a"
            line += (
                f"; cache hit rate {rate}, {downloaded / elapsed / 1e6:,.1f} MB/s downloaded, "
                f"{retries} retries"
            )
        logger.info(line)
        self.last = (now, stats.samples, stats.bytes_read, cache_now)
        self.next_at = now + self.interval
