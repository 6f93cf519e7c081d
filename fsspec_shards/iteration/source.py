"""The shards of a dataset and how they are read: URLs, byte ranges, the error policy, stats.

A :class:`ShardSource` is what a :class:`~fsspec_shards.iteration.stream.ConsumerStream`
reads through. It opens shards (:class:`~fsspec_shards.iteration.reader.ShardReader`), scans
tar headers (seeking over payloads) to find where a sample range lies, caching each range
found, turns a read sample into the dict a user gets (the transforms), applies ``handler``
to a broken shard or a failed sample, and keeps this process's counters where the main
process collects them (:class:`~fsspec_shards.iteration.stats.StatsBoard`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from fsspec_shards.errors import IntegrityError, ShardFormatError
from fsspec_shards.iteration.lengths import SampleCountError, count_samples
from fsspec_shards.iteration.order import Consumer
from fsspec_shards.iteration.plan import Segment
from fsspec_shards.iteration.reader import ShardReader
from fsspec_shards.iteration.samples import RawSample, group_samples, to_dict
from fsspec_shards.iteration.stats import ProgressLog, StatsBoard, StreamStats, summary
from fsspec_shards.iteration.tar import is_compressed_file, iter_members
from fsspec_shards.redact import clean_error, redact_text, redact_url

logger = logging.getLogger("fsspec_shards.dataset")

HANDLERS = ("raise", "warn", "skip")
SHARD_ERRORS = (OSError, IntegrityError, ShardFormatError, SampleCountError)
"""What makes a shard broken: cannot be opened or read, fails verification, is malformed,
or holds other than the samples its count says."""
MALFORMED_ERRORS = (ShardFormatError, SampleCountError)
"""Shard errors that a bad cached copy explains: the shard is read once more from the backend."""
HEADER_SCAN_BLOCK = 4096
"""Read-ahead of a header scan over a remote file read without a cache: a header and a
little more per request, rather than a block of payload per header."""


class ShardSource:
    """Reads the shards ``urls`` through ``reader``; ``handler`` decides what a broken shard
    or a failed sample does; ``transforms``, ``annotate`` and ``raw_urls`` shape the sample
    dicts; ``stats_dir`` and ``log_interval`` are the counters' directory and log period."""

    shard_errors = SHARD_ERRORS
    malformed_errors = MALFORMED_ERRORS

    def __init__(
        self,
        urls: Sequence[str],
        reader: ShardReader,
        *,
        handler: str = "raise",
        prefetch: int | str = "auto",
        transforms: Sequence[Callable[[dict], Any]] = (),
        annotate: bool = False,
        raw_urls: bool = False,
        stats_dir: str | os.PathLike | None = None,
        log_interval: float | None = None,
    ) -> None:
        self.urls = list(urls)
        self.reader = reader
        self.handler = handler
        self.prefetch = prefetch
        self.transforms = tuple(transforms)
        self.annotate = annotate
        self.raw_urls = raw_urls
        self.log_interval = log_interval
        self._ranges: dict[tuple[str, Segment], tuple[int, int | None]] = {}
        self._shown: dict[str, str] = {}
        self._stats = StreamStats()
        self._stats_pid = os.getpid()
        self._board = StatsBoard(stats_dir)
        self._board.bind(self)

    # --- reading -------------------------------------------------------------------------

    def samples(self, url: str, start: int = 0, headers_only: bool = False) -> Iterator[RawSample]:
        """The shard's samples from byte ``start``. ``headers_only``: without their bytes,
        read from the tar headers alone, seeking over payloads on a plain seekable file
        (a resume's window scan, fast-forwards, sample counts and sample-range lookups)."""
        if not headers_only:
            yield from self.reader.samples(url, start)
            return
        fs, path = self.reader.locate(url)
        if is_compressed_file(fs, path):
            yield from self.reader.samples(url, start, headers_only=True)
            return
        with fs.open(path, "rb", block_size=HEADER_SCAN_BLOCK) as raw:
            if not raw.seekable():
                yield from self.reader.samples(url, start, headers_only=True)
                return
            raw.seek(start)
            members = iter_members(
                raw, url, start, read_data=False, max_member_size=self.reader.max_member_size
            )
            yield from group_samples(members, url)

    def count_samples(self) -> list[int]:
        """Every shard's sample count, by a header-only scan (``count_samples=True``)."""

        def scan(url: str) -> Iterator[RawSample]:
            return self.samples(url, headers_only=True)

        return count_samples(self.urls, scan, skip_failed=self.handler != "raise")

    def plain_size(self, url: str) -> int | None:
        """The byte size of a plain tar shard; None for a compressed one (its tar size is unknown).
        Reads four bytes, never a block of the shard. The size is the open file's: through a
        cache, the copy the stream reads, with no request to the backend (a resumed
        DataLoader worker's ``info`` request started its backend's client: most of its first
        batch on a warm cache); elsewhere the size the open asks for."""
        fs, path = self.reader.locate(url)
        if is_compressed_file(fs, path):
            return None
        with fs.open(path, "rb") as handle:
            size = getattr(handle, "size", None)
        return int(fs.size(path) if size is None else size)

    def shown_url(self, url: str) -> str:
        """``url`` for display: redacted (no query values, no password)."""
        shown = self._shown.get(url)
        if shown is None:
            shown = self._shown[url] = redact_url(url)
        return shown

    def byte_range(self, url: str, segment: Segment) -> tuple[int, int | None]:
        """``[start, end)`` of a segment in its shard; a header scan finds sample ranges."""
        if not segment.needs_index:
            return segment.start, segment.end
        found = self._ranges.get((url, segment))
        if found is None:
            found = self._ranges[(url, segment)] = self._scan_range(url, segment)
        return found

    def _scan_range(self, url: str, segment: Segment) -> tuple[int, int | None]:
        stop = None if segment.count is None else segment.skip + segment.count
        start = None
        seen = 0
        for sample in self.samples(url, segment.start, headers_only=True):
            if segment.end is not None and sample.offset >= segment.end:
                break
            if seen == segment.skip:
                start = sample.offset
            if seen == stop:
                return start, sample.offset
            seen += 1
        if start is None or (stop is not None and seen < stop):
            raise SampleCountError(
                f"shard {redact_url(url)} holds {seen} samples from byte {segment.start}, but "
                f"its count says at least {segment.skip if stop is None else stop}: the sample "
                "counts are wrong or the shard changed"
            )
        return start, segment.end

    def drop_cached(self, url: str) -> bool:
        """Drop the cached copy of a shard that turned out malformed (through fsspec:
        ``invalidate_cache``, harmless where nothing is cached); whether to read it again."""
        try:
            fs, path = self.reader.locate(url)
            fs.invalidate_cache(path)
        except (OSError, ValueError) as exc:
            logger.debug("could not drop the cached copy of %s: %s", redact_url(url), exc)
            return False
        self._ranges = {key: value for key, value in self._ranges.items() if key[0] != url}
        logger.info("shard %s is malformed: reading it once more from storage", redact_url(url))
        return True

    # --- the error policy and the sample dicts ------------------------------------------

    def shard_failed(self, url: str, error: BaseException) -> None:
        """Apply the error policy to a broken shard: raise, or log and count it."""
        shown = redact_url(url)
        error = clean_error(error, url)
        if self.handler == "raise":
            if shown not in str(error) and hasattr(error, "add_note"):
                error.add_note(f"while reading shard {shown}")
            raise error
        # Without its traceback, a kept error does not keep the reader's frames alive.
        self.counters().shard_failed(shown, error.with_traceback(None))
        level = logging.WARNING if self.handler == "warn" else logging.DEBUG
        logger.log(level, "leaving out shard %s: %s: %s", shown, type(error).__name__, error)

    def prepare(self, sample: RawSample, consumer: Consumer, index: int) -> Any:
        """The sample as the user gets it: a dict through the transforms; None if dropped
        (by a transform, or by the handler after a transform raised)."""
        result = to_dict(sample)
        url = sample.url
        if not self.raw_urls:
            result["__url__"] = self.shown_url(url)
        if self.annotate:
            result["__worker__"] = consumer.worker
            result["__index__"] = index
        if not self.transforms:
            return result
        try:
            for transform in self.transforms:
                result = transform(result)
                if result is None:
                    return None
            return result
        except Exception as exc:
            error = exc
        self._sample_failed(url, sample.key, error)
        return None

    def _sample_failed(self, url: str, key: str, error: Exception) -> None:
        """Apply the error policy to a sample a transform failed on."""
        shown = redact_url(url)
        where = f"sample {key!r} of shard {shown}"
        if self.handler == "raise":
            error = clean_error(error, url)
            if hasattr(error, "add_note"):
                error.add_note(f"while transforming {where}")
            raise error
        error = clean_error(error, url).with_traceback(None)
        self.counters().sample_failed(shown, key, error)
        level = logging.WARNING if self.handler == "warn" else logging.DEBUG
        text = redact_text(str(error), url)
        logger.log(level, "leaving out %s: %s: %s", where, type(error).__name__, text)

    def short_epoch(self, consumer: Consumer, epoch: int, delivered: int, length: int) -> None:
        """Warn that ``consumer`` ended ``epoch`` short of the equal length (it had nothing
        left to read or pad with): the consumers no longer take the same steps."""
        logger.warning(
            "rank %d worker %d: epoch %d ended after %d samples, short of the equal length %d "
            "(a shard failed or the sample counts overstate it, and nothing is left to pad "
            "with): ranks now take different numbers of steps, which a distributed run waits on",
            consumer.rank,
            consumer.worker,
            epoch,
            delivered,
            length,
        )

    # --- stats -----------------------------------------------------------------------------

    def counters(self) -> StreamStats:
        """This process's counters (a forked DataLoader worker starts its own)."""
        if self._stats_pid != os.getpid():
            self._stats = StreamStats()
            self._stats_pid = os.getpid()
        return self._stats

    def publish_stats(self, consumer: Consumer) -> None:
        """Leave this process's counters where :meth:`stats` finds them: from a DataLoader
        worker, and from every process when the directory is the user's (shared by ranks)."""
        if self._board.owned and os.getpid() == self._board.owner_pid:
            return
        who = {"rank": consumer.rank, "worker": consumer.worker, "pid": os.getpid()}
        try:
            self._board.write(who, self.counters())
        except (OSError, ValueError) as exc:
            logger.warning("cannot write stats to %s: %s", self._board.path, exc)

    def progress_log(self, consumer: Consumer, urls: Sequence[str]) -> ProgressLog:
        cache_stats = None
        if urls and self.log_interval:
            try:
                cache_stats = getattr(self.reader.locate(urls[0])[0], "cache_stats", None)
            except (OSError, ValueError):
                cache_stats = None
        label = f"rank {consumer.rank} worker {consumer.worker}"
        return ProgressLog(self.log_interval, label, cache_stats)

    def stats(self) -> dict[str, Any]:
        """Counts across the processes that read these shards (this one and its DataLoader
        workers)."""
        return summary(self._board.collect(), self.counters())

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_ranges"] = {}
        return state
