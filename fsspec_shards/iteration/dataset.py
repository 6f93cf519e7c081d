"""ShardDataset: webdataset-format samples from sharded tars, split, shuffled and resumable.

One epoch of one consumer (a DataLoader worker of one rank) reads its part of the epoch's
shard order (:mod:`~fsspec_shards.iteration.order`), shard by shard and sample by sample
(:mod:`~fsspec_shards.iteration.reader`), optionally through a seeded shuffle buffer
(:mod:`~fsspec_shards.iteration.shuffle`), while the next shards are prefetched into the
storage cache (:mod:`~fsspec_shards.iteration.prefetch`). After every delivered sample the
stream's position is a small :class:`~fsspec_shards.iteration.state.StreamState`;
:meth:`ShardDataset.state_dict` returns it and :meth:`ShardDataset.load_state_dict` makes a
fresh dataset continue from it exactly, seeking instead of re-reading.

Epochs change only through :meth:`ShardDataset.set_epoch`. A loaded state resumes the epoch
it was taken in; a state taken after the last sample of epoch ``e`` leaves nothing of ``e``,
so iterating ``e`` again yields nothing and ``set_epoch(e + 1)`` starts ``e + 1`` from its
beginning. See docs/resumption.md.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import closing
from dataclasses import dataclass, field, replace
from typing import Any

from fsspec_shards.errors import IntegrityError, ShardFormatError
from fsspec_shards.iteration.lengths import (
    EQUALIZE_MODES,
    epoch_lengths,
    load_sample_counts,
    shard_sizes,
)
from fsspec_shards.iteration.order import Consumer, consumer_shards, current_consumer, shard_order
from fsspec_shards.iteration.prefetch import ShardPrefetcher
from fsspec_shards.iteration.reader import ShardReader
from fsspec_shards.iteration.regroup import base_fingerprint, is_remainder_state
from fsspec_shards.iteration.resume import DeliveredCounts, is_tracker_state
from fsspec_shards.iteration.rng import CounterRNG
from fsspec_shards.iteration.samples import RawSample, to_dict
from fsspec_shards.iteration.shuffle import ShuffleBuffer, shuffle_key
from fsspec_shards.iteration.state import (
    SampleRef,
    StreamState,
    check_fingerprint,
    urls_digest,
)
from fsspec_shards.iteration.transforms import Batched
from fsspec_shards.iteration.urls import expand_urls
from fsspec_shards.redact import redact_text, redact_url

try:
    from torch.utils.data import IterableDataset as _DatasetBase
except ImportError:
    _DatasetBase = object

logger = logging.getLogger("fsspec_shards.dataset")

HANDLERS = ("raise", "warn", "skip")
SHARD_ERRORS = (OSError, IntegrityError, ShardFormatError)
"""What makes a shard broken: cannot be opened or read, fails verification, or is malformed."""

Entry = tuple[SampleRef, RawSample]


@dataclass(slots=True)
class _Live:
    """The position of the iterator currently running, read by ``state_dict()``.

    ``unread`` holds the loaded buffer references until the iterator has read them back.
    """

    state: StreamState
    buffer: ShuffleBuffer[Entry] | None
    unread: list[SampleRef] | None = None

    def snapshot(self) -> StreamState:
        state = self.state
        if self.unread is not None:
            buffer_refs = list(self.unread)
        elif self.buffer is not None:
            buffer_refs = [ref for ref, _ in self.buffer.items]
        else:
            buffer_refs = []
        return StreamState(
            fingerprint=dict(state.fingerprint),
            epoch=state.epoch,
            shard=state.shard,
            offset=state.offset,
            rng_counter=self.buffer.rng.counter if self.buffer is not None else 0,
            buffer=buffer_refs,
            delivered=state.delivered,
            finished=state.finished,
            remainder=state.remainder,
        )


@dataclass(frozen=True, slots=True)
class Segment:
    """A byte range of a shard to read: ``[start, end)``, ``end`` None for the whole rest."""

    url: str
    start: int = 0
    end: int | None = None


@dataclass(frozen=True, slots=True)
class EpochPlan:
    """One consumer's epoch: what it reads, the sample count to stop at, how far indices run.

    Indices run past the segment list when padding: index ``i`` reads segment ``i % len``.
    """

    segments: list[Segment]
    length: int | None
    shard_limit: int

    @property
    def urls(self) -> list[str]:
        return [segment.url for segment in self.segments]

    def segment(self, index: int) -> Segment:
        return self.segments[index % len(self.segments)]

    def wants_more(self, state: StreamState) -> bool:
        return self.length is None or state.delivered < self.length


@dataclass(slots=True)
class _Stats:
    samples: int = 0
    shards_done: int = 0
    shards_failed: int = 0
    failures: list[tuple[str, BaseException]] = field(default_factory=list)


class ShardDataset(_DatasetBase):
    """Samples (dicts of ``__key__``, ``__url__`` and one bytes value per extension) of shards.

    ``urls`` is a brace pattern or a list of URLs (fsspec chains such as ``wds::s3://...``
    included); ``storage_options`` go to ``fsspec.core.url_to_fs``. ``transforms`` are
    per-sample steps (:mod:`~fsspec_shards.iteration.transforms` or any callable) applied in
    order to each sample dict; a step returning ``None`` drops the sample. ``annotate`` adds
    ``__worker__`` / ``__index__`` to each sample (for :mod:`~fsspec_shards.iteration.resume`).
    ``equalize="truncate"|"pad"`` with ``samples_per_shard`` (``{shard name: count}`` or a
    JSON file of it) gives every consumer the same number of samples per epoch
    (:mod:`~fsspec_shards.iteration.lengths`). See the contract (section 2) and
    docs/resumption.md.
    """

    def __init__(
        self,
        urls: str | Sequence[str],
        storage_options: Mapping[str, Any] | None = None,
        shuffle_shards: bool = True,
        shuffle_buffer: int = 0,
        seed: int = 0,
        split_by_node: bool = True,
        split_by_worker: bool = True,
        handler: str = "raise",
        prefetch: int = 2,
        *,
        transforms: Sequence[Callable[[dict], Any]] = (),
        annotate: bool = False,
        samples_per_shard: Mapping[str, int] | str | None = None,
        equalize: str | None = None,
    ) -> None:
        if handler not in HANDLERS:
            raise ValueError(f"handler must be one of {HANDLERS}, got {handler!r}")
        if int(shuffle_buffer) < 0 or int(prefetch) < 0:
            raise ValueError("shuffle_buffer and prefetch must be >= 0")
        self.urls = expand_urls(urls)
        if not self.urls:
            raise ValueError(f"no shard URLs in {urls!r}")
        self.storage_options = dict(storage_options or {})
        self.shuffle_shards = bool(shuffle_shards)
        self.shuffle_buffer = int(shuffle_buffer)
        self.seed = int(seed)
        self.split_by_node = bool(split_by_node)
        self.split_by_worker = bool(split_by_worker)
        self.handler = handler
        self.prefetch = int(prefetch)
        self.transforms = tuple(transforms)
        self.annotate = bool(annotate)
        self.equalize = equalize
        self.shard_sizes = (
            None
            if samples_per_shard is None
            else shard_sizes(self.urls, load_sample_counts(samples_per_shard, storage_options))
        )
        if equalize is not None and (equalize not in EQUALIZE_MODES or self.shard_sizes is None):
            raise ValueError(
                f"equalize must be one of {EQUALIZE_MODES} or None, and needs samples_per_shard"
            )
        if any(isinstance(step, Batched) for step in self.transforms):
            raise ValueError(
                "batched() spans samples and would lose a partial batch on resume: batch in "
                "the DataLoader (batch_size=...) or apply it to the dataset's output"
            )
        self.epoch = 0
        self._reader = ShardReader(self.storage_options)
        self._pending: StreamState | None = None
        self._pending_counts: DeliveredCounts | None = None
        self._pending_remainder: dict[str, Any] | None = None
        self._live: _Live | None = None
        self._stats = _Stats()

    # --- epochs and state -------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch the next iteration reads; its shard order comes from (seed, epoch)."""
        self.epoch = int(epoch)

    def state_dict(self) -> dict[str, Any]:
        """The position after the last delivered sample, as a small JSON-serialisable dict."""
        if self._pending is not None and self._pending.epoch == self.epoch:
            return self._pending.to_dict()
        if self._pending_counts is not None and self._pending_counts.epoch == self.epoch:
            return self._pending_counts.to_dict()
        if self._live is not None and self._live.state.epoch == self.epoch:
            return self._live.snapshot().to_dict()
        start = StreamState(self._fingerprint(self._consumer()), epoch=self.epoch)
        remainder = self._pending_remainder
        if remainder is not None and remainder["epoch"] == self.epoch:
            start.remainder = remainder["segments"]
        return start.to_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state`` at the next iteration; ValueError if made with other args."""
        if is_remainder_state(state):
            check_fingerprint(
                state["fingerprint"], base_fingerprint(self._fingerprint(self._consumer()))
            )
            self._pending_remainder = dict(state)
            self._pending = self._pending_counts = self._live = None
            self.epoch = int(state["epoch"])
            return
        if is_tracker_state(state):
            counts = DeliveredCounts.from_dict(state)
            check_fingerprint(counts.fingerprint, self.tracker_fingerprint(len(counts.delivered)))
            self._pending_counts = counts
            self._pending = self._pending_remainder = self._live = None
            self.epoch = counts.epoch
            return
        loaded = StreamState.from_dict(state)
        check_fingerprint(loaded.fingerprint, self._fingerprint(self._consumer()))
        if self.shuffle_buffer and len(loaded.buffer) >= self.shuffle_buffer:
            raise ValueError(
                f"the state holds {len(loaded.buffer)} buffered samples, "
                f"more than a shuffle buffer of {self.shuffle_buffer} keeps between samples"
            )
        self._pending = loaded
        self._pending_counts = self._pending_remainder = self._live = None
        self.epoch = loaded.epoch

    def stats(self) -> dict[str, Any]:
        """Counts of this dataset object in this process: samples, shards done and failed."""
        return {
            "samples": self._stats.samples,
            "shards_done": self._stats.shards_done,
            "shards_failed": self._stats.shards_failed,
            "failures": list(self._stats.failures),
        }

    def _consumer(self) -> Consumer:
        return current_consumer(self.split_by_node, self.split_by_worker)

    def tracker_fingerprint(self, num_workers: int) -> dict[str, Any]:
        """The arguments a :class:`~fsspec_shards.iteration.resume.DeliveryTracker` state
        depends on: those of the dataset state, for all workers of this rank."""
        consumer = self._consumer()
        fingerprint = self._fingerprint(Consumer(consumer.rank, consumer.world_size, 0, 1))
        del fingerprint["worker"]
        fingerprint["num_workers"] = num_workers
        return fingerprint

    def _fingerprint(self, consumer: Consumer) -> dict[str, Any]:
        return {
            "urls": urls_digest(self.urls),
            "shards": len(self.urls),
            "seed": self.seed,
            "shuffle_shards": self.shuffle_shards,
            "shuffle_buffer": self.shuffle_buffer,
            "rank": consumer.rank,
            "world_size": consumer.world_size,
            "worker": consumer.worker,
            "num_workers": consumer.num_workers,
            "equalize": self.equalize,
            "sample_counts": None
            if self.shard_sizes is None
            else urls_digest([str(size) for size in self.shard_sizes]),
        }

    def _start_state(self, fingerprint: dict[str, Any]) -> StreamState:
        """The loaded state when it is for this epoch, else the start of this epoch."""
        pending, self._pending = self._pending, None
        if pending is not None:
            check_fingerprint(pending.fingerprint, fingerprint)
            if pending.epoch == self.epoch:
                return pending
            logger.info(
                "dropping the loaded state of epoch %d: set_epoch(%d) chose another epoch",
                pending.epoch,
                self.epoch,
            )
        return StreamState(fingerprint, epoch=self.epoch)

    def consumer_urls(self, epoch: int, consumer: Consumer) -> list[str]:
        """The shard URLs ``consumer`` reads in ``epoch``, in order."""
        return self.epoch_plan(epoch, consumer).urls

    def epoch_plan(
        self, epoch: int, consumer: Consumer, remainder: list[list[int]] | None = None
    ) -> EpochPlan:
        """What ``consumer`` reads in ``epoch``: its shards, or its part of a ``remainder``."""
        if remainder is not None:
            mine = remainder[consumer.index :: consumer.total]
            segments = [
                Segment(self.urls[url], start, None if end < 0 else end) for url, start, end in mine
            ]
            return EpochPlan(segments, None, len(segments))
        order = shard_order(len(self.urls), self.seed, epoch, self.shuffle_shards)
        segments = [Segment(self.urls[index]) for index in consumer_shards(order, consumer)]
        if self.equalize is None:
            return EpochPlan(segments, None, len(segments))
        totals, length = epoch_lengths(order, self.shard_sizes, consumer.total, self.equalize)
        own = totals[consumer.index]
        if own == 0 and length > 0:
            raise ValueError(
                f"consumer {consumer.index} has no samples in epoch {epoch}: cannot pad to {length}"
            )
        passes = 1 if self.equalize == "truncate" or own == 0 else -(-length // own)
        return EpochPlan(segments, length, len(segments) * passes)

    # --- iteration ----------------------------------------------------------------------

    def __iter__(self) -> Iterator[dict]:
        consumer = self._consumer()
        counts = self._take_pending_counts(consumer)
        if counts is not None:
            consumer = replace(
                consumer, worker=(consumer.worker + counts.next_worker) % consumer.num_workers
            )
        state = self._start_state(self._fingerprint(consumer))
        remainder, self._pending_remainder = self._pending_remainder, None
        if remainder is not None and remainder["epoch"] == self.epoch:
            state.remainder = remainder["segments"]
        plan = self.epoch_plan(self.epoch, consumer, state.remainder)
        buffer = self._new_buffer(state, consumer)
        if counts is not None:
            self._fast_forward(plan, state, buffer, counts.delivered[consumer.worker])
        live = _Live(state, buffer, unread=list(state.buffer) if buffer is not None else None)
        self._live = live
        return self._deliver(plan, live, consumer)

    def _new_buffer(self, state: StreamState, consumer: Consumer) -> ShuffleBuffer | None:
        if not self.shuffle_buffer:
            return None
        key = shuffle_key(self.seed, state.epoch, consumer.rank, consumer.worker)
        return ShuffleBuffer(self.shuffle_buffer, CounterRNG(key, state.rng_counter))

    def _take_pending_counts(self, consumer: Consumer) -> DeliveredCounts | None:
        """The loaded tracker counts when they are for this epoch; checks the worker count."""
        counts = self._pending_counts
        if counts is None or counts.epoch != self.epoch:
            return None
        self._pending_counts = None
        if len(counts.delivered) != consumer.num_workers:
            raise ValueError(
                f"the state counts {len(counts.delivered)} DataLoader workers, "
                f"this DataLoader has {consumer.num_workers}"
            )
        return counts

    def _fast_forward(
        self, plan: EpochPlan, state: StreamState, buffer: ShuffleBuffer | None, count: int
    ) -> None:
        """Move ``state`` past the first ``count`` samples, reading tar headers only."""
        prefetcher = ShardPrefetcher(plan.urls, self._reader.locate, 0)
        source = self._read(plan, state, prefetcher, headers_only=True)
        entries = buffer.shuffle(source) if buffer is not None else source
        try:
            for _ in range(count):
                if not plan.wants_more(state) or next(entries, None) is None:
                    state.finished = True
                    break
                state.delivered += 1
        finally:
            source.close()
        if buffer is not None:
            state.rng_counter = buffer.rng.counter
            state.buffer = [ref for ref, _ in buffer.items]
            buffer.items = []

    def _deliver(self, plan: EpochPlan, live: _Live, consumer: Consumer) -> Iterator[dict]:
        state = live.state
        if state.finished:
            return
        prefetcher = ShardPrefetcher(plan.urls, self._reader.locate, self.prefetch)
        try:
            source = self._read(plan, state, prefetcher)
            if live.buffer is None:
                entries = source
            else:
                live.buffer.items = self._reread(plan, live.unread or [])
                live.unread = None
                entries = live.buffer.shuffle(source)
            while plan.wants_more(state):
                entry = next(entries, None)
                if entry is None:
                    break
                sample = entry[1]
                state.delivered += 1
                sample_dict = to_dict(sample)
                if self.annotate:
                    sample_dict["__worker__"] = consumer.worker
                    sample_dict["__index__"] = state.delivered - 1
                result = self._apply_transforms(sample_dict)
                if result is not None:
                    self._stats.samples += 1
                    yield result
            if plan.length is not None and state.delivered < plan.length:
                logger.warning(
                    "epoch %d ended after %d samples, short of the equal length %d: "
                    "a shard failed or samples_per_shard overstates it",
                    state.epoch,
                    state.delivered,
                    plan.length,
                )
            state.finished = True
        finally:
            prefetcher.close()

    def _read(
        self,
        plan: EpochPlan,
        state: StreamState,
        prefetcher: ShardPrefetcher,
        headers_only: bool = False,
    ) -> Iterator[Entry]:
        """Samples of this consumer's shards from the state's position, moving the position.

        ``state.shard`` indexes the plan's segments (see :class:`EpochPlan`).
        """
        while state.shard < plan.shard_limit:
            index = state.shard
            segment = plan.segment(index)
            url = segment.url
            try:
                prefetch_error = prefetcher.wait(index)
                prefetcher.advance(index)
                if prefetch_error is not None:
                    raise prefetch_error
                start = state.offset or segment.start
                with closing(self._reader.samples(url, start, headers_only)) as samples:
                    for sample in samples:
                        if segment.end is not None and sample.offset >= segment.end:
                            break
                        state.offset = sample.end
                        yield SampleRef(index, sample.offset, sample.end), sample
            except SHARD_ERRORS as exc:
                self._shard_failed(url, exc)
            else:
                self._stats.shards_done += 1
            state.shard = index + 1
            state.offset = 0

    def _reread(self, plan: EpochPlan, refs: list[SampleRef]) -> list[Entry]:
        """The buffered samples of a saved state, read back by byte range, shard by shard."""
        ranges_by_shard: dict[int, list[tuple[int, int]]] = {}
        for ref in refs:
            ranges_by_shard.setdefault(ref.shard, []).append((ref.offset, ref.end))
        found: dict[SampleRef, RawSample] = {}
        for shard, ranges in ranges_by_shard.items():
            try:
                samples = self._reader.samples_at(plan.segment(shard).url, ranges)
            except SHARD_ERRORS as exc:
                self._shard_failed(plan.segment(shard).url, exc)
                continue
            for (offset, end), sample in zip(ranges, samples, strict=True):
                found[SampleRef(shard, offset, end)] = sample
        return [(ref, found[ref]) for ref in refs if ref in found]

    def _shard_failed(self, url: str, error: BaseException) -> None:
        """Apply the error policy to a broken shard: raise, or log and count it."""
        shown = redact_url(url)
        error = _without_secrets(error, url)
        if self.handler == "raise":
            if shown not in str(error) and hasattr(error, "add_note"):
                error.add_note(f"while reading shard {shown}")
            raise error
        self._stats.shards_failed += 1
        # Without its traceback, a kept error does not keep the reader's frames alive.
        self._stats.failures.append((shown, error.with_traceback(None)))
        level = logging.WARNING if self.handler == "warn" else logging.DEBUG
        logger.log(level, "leaving out shard %s: %s: %s", shown, type(error).__name__, error)

    def _apply_transforms(self, sample: dict) -> Any:
        for transform in self.transforms:
            sample = transform(sample)
            if sample is None:
                return None
        return sample

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_live"] = None
        return state


def _without_secrets(error: BaseException, url: str) -> BaseException:
    """``error``, or a copy of its type whose text hides the credentials of ``url``, for logs,
    stats and tracebacks (the original is not chained, as it would show them)."""
    text = str(error)
    shown = redact_text(text, url)
    if shown == text:
        return error
    try:
        clean = type(error)(shown)
    except TypeError:
        clean = OSError(shown)
    clean.__suppress_context__ = True
    return clean
