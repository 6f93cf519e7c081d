"""One consumer's sample stream over its epoch plan: reading, shuffling, and rebuilding a
position after a resume.

A :class:`ConsumerStream` reads the segments of an
:class:`~fsspec_shards.iteration.plan.EpochPlan` sample by sample, through the shuffle
buffer when there is one, and keeps its :class:`~fsspec_shards.iteration.resume.state.StreamState`
current after every sample DELIVERED: :meth:`ConsumerStream.position` costs the same for any
buffer size. Resuming rebuilds what the state leaves out:

- from a state (:meth:`restore_position`): the buffer's read indices by replaying the RNG
  (no I/O), where they lie by a header scan from the state's ``window`` to its cursor, their
  bytes by ranged reads; the cursor is sought to.
- from a delivered count (:meth:`fast_forward`, the plain DataLoader's tracker): the stream
  is run on tar headers only up to the count, then the buffered samples are read by range.

Both check that what they find matches the state exactly, else ValueError naming the field.
The first pass over the plan goes through the shuffle buffer and is drained before any padding
pass is read, so every sample of the pass is delivered before a repeat. Shard errors and
sample errors go through the source's ``handler``; the counters are published for the main
process every ``FLUSH_SECONDS`` and when the stream ends.

:class:`Streams` makes the streams of one dataset's consumers (fresh, at a loaded position,
over a remainder) from the parts they use: the source, the planner, the shuffle and the
dataset's identity for the fingerprint.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import closing
from dataclasses import dataclass
from typing import Any

from fsspec_shards.iteration.lengths import SampleCountError
from fsspec_shards.iteration.order import Consumer
from fsspec_shards.iteration.plan import EpochPlan, Piece, Planner
from fsspec_shards.iteration.prefetch import ShardPrefetcher
from fsspec_shards.iteration.resume.state import (
    SampleRef,
    StreamState,
    check_fingerprint,
    check_position,
    consumer_fingerprint,
)
from fsspec_shards.iteration.rng import CounterRNG
from fsspec_shards.iteration.samples import RawSample
from fsspec_shards.iteration.shuffle import (
    OldestBuffered,
    ShuffleBuffer,
    replay_buffer,
    shuffle_key,
)
from fsspec_shards.iteration.source import ShardSource
from fsspec_shards.iteration.stats import FLUSH_SECONDS

Entry = tuple[SampleRef, RawSample]


class ConsumerStream:
    """The stream of ``consumer`` over ``plan`` read from ``source``, from ``state`` (a fresh
    or loaded position), through a shuffle buffer of ``shuffle_buffer`` samples (0: none)
    keyed by ``seed``."""

    def __init__(
        self,
        source: ShardSource,
        consumer: Consumer,
        plan: EpochPlan,
        state: StreamState,
        shuffle_buffer: int = 0,
        seed: int = 0,
        loaded: bool = False,
    ) -> None:
        self.source = source
        self.consumer = consumer
        self.plan = plan
        self.state = state
        self.epoch = state.epoch
        self.buffer: ShuffleBuffer[Entry] | None = None
        self.oldest: OldestBuffered[SampleRef] = OldestBuffered()
        if shuffle_buffer:
            key = shuffle_key(seed, state.epoch, consumer.rank, consumer.worker)
            self.buffer = ShuffleBuffer(shuffle_buffer, CounterRNG(key))
        self.rebuilt = not loaded
        """False while a loaded state's cursor is unchecked and its buffer not read back."""

    # --- the position ------------------------------------------------------------------

    def position(self) -> StreamState:
        """The position after the last delivered sample (O(1): no buffer contents)."""
        state = self.state
        if self.rebuilt and self.buffer is not None:
            state.rng_counter = self.buffer.rng.counter
            state.window = self.oldest.oldest
        return state

    def restore_position(self, payloads: bool = True) -> list[SampleRef]:
        """Rebuild the buffer of a loaded state; its refs. With ``payloads`` their bytes are
        read back into the buffer, in the order the uninterrupted stream held them."""
        state, buffer = self.state, self.buffer
        self._check_cursor()
        drained = state.shard >= len(self.plan.segments)
        if buffer is None or state.finished or (drained and not state.buffered):
            # Nothing buffered and no draw to come: the RNG counter no longer matters.
            if buffer is not None:
                buffer.rng.counter = state.rng_counter
            self.rebuilt = True
            return []
        rng = CounterRNG(buffer.rng.key)
        try:
            held = replay_buffer(buffer.size, rng, state.read, state.delivered, drained)
        except ValueError as exc:
            raise ValueError(
                f"invalid ShardDataset state: fields 'read'/'delivered': {exc}"
            ) from None
        if rng.counter != state.rng_counter:
            raise ValueError(
                f"invalid ShardDataset state: field 'rng_counter': {state.rng_counter}, but "
                f"{state.read} samples read and {state.delivered} delivered make {rng.counter}"
            )
        refs = self._scan_window(set(held)) if held else {}
        ordered = [refs[index] for index in held]
        buffer.rng.counter = state.rng_counter
        for ref in sorted(ordered, key=lambda ref: ref.index):
            self.oldest.read(ref.index, ref)
        if payloads:
            buffer.items[:] = self._read_back(ordered)
        self.rebuilt = True
        return ordered

    def _check_cursor(self) -> None:
        """ValueError when the loaded cursor lies outside its segment or past its shard's
        end (a plain tar's size is known without reading it; a gzip shard's is not)."""
        state = self.state
        if not state.offset or state.shard >= self.plan.limit:
            return
        segment = self.plan.segment(state.shard)
        url = self.source.urls[segment.shard]
        try:
            start, end = self.source.byte_range(url, segment)
            size = self.source.plain_size(url)
        except self.source.shard_errors:
            return  # reading it will meet the same error, and the handler decides
        if state.offset < start or (end is not None and state.offset > end):
            raise ValueError(
                f"invalid ShardDataset state: field 'offset': {state.offset} is outside its "
                f"segment's bytes {start}..{'end' if end is None else end}"
            )
        if size is not None and state.offset > size:
            raise ValueError(
                f"invalid ShardDataset state: field 'offset': {state.offset} is past the end "
                f"of shard {self.source.shown_url(url)} ({size} bytes)"
            )

    def _scan_window(self, wanted: set[int]) -> dict[int, SampleRef]:
        """Where the buffered samples lie: a header scan from the window to the cursor."""
        state, window = self.state, self.state.window
        scan = StreamState(
            state.fingerprint, state.epoch, window.shard, window.offset, window.index
        )
        counted = bool(self.plan.samples)
        if counted:  # so that the scan stops a segment at its count, as the stream did
            scan.segment_read = self._segment_read_at(window)
        found: dict[int, SampleRef] = {}
        source = self._read(scan, None, headers_only=True, counted=counted)
        try:
            for ref, _ in source:
                if ref.index == window.index and ref.offset != window.offset:
                    break
                if ref.index in wanted:
                    found[ref.index] = ref
                if scan.read == state.read:
                    break
        finally:
            source.close()
        at_cursor = state.shard >= len(self.plan.segments) or (scan.shard, scan.offset) == (
            state.shard,
            state.offset,
        )
        if len(found) != len(wanted) or scan.read != state.read or not at_cursor:
            raise ValueError(
                "invalid ShardDataset state: field 'window': the samples from "
                f"{[window.shard, window.offset, window.index]} to the cursor "
                f"{[state.shard, state.offset]} are not the {state.read - window.index} samples "
                "the state counts (a tampered state, or the shards changed)"
            )
        return found

    def _segment_read_at(self, ref: SampleRef) -> int:
        """How many samples of its segment the stream had read before sample ``ref``: from
        the state when it is in the cursor's segment, else by a header scan from the
        segment's start."""
        state = self.state
        if ref.shard == state.shard:
            return max(state.segment_read - (state.read - ref.index), 0)
        segment = self.plan.segment(ref.shard)
        url = self.source.urls[segment.shard]
        before = 0
        try:
            start, _ = self.source.byte_range(url, segment)
            with closing(self.source.samples(url, start, headers_only=True)) as samples:
                for sample in samples:
                    if sample.offset >= ref.offset:
                        break
                    before += 1
        except self.source.shard_errors:
            pass  # the window scan meets the same error, and the handler decides
        return before

    def fast_forward(self, count: int, payloads: bool = True) -> list[SampleRef]:
        """Move past the first ``count`` deliveries reading tar headers only; the buffered
        refs. With ``payloads`` their bytes are read back into the buffer."""
        state, buffer = self.state, self.buffer
        entries = self._entries(None, headers_only=True)
        try:
            for _ in range(count):
                if not self._wants_more() or next(entries, None) is None:
                    state.finished = True
                    break
                state.delivered += 1
        finally:
            entries.close()
        refs = [] if buffer is None else [ref for ref, _ in buffer.items]
        if buffer is not None and payloads:
            buffer.items[:] = self._read_back(refs)
        self.rebuilt = True
        return refs

    def _read_back(self, refs: list[SampleRef]) -> list[Entry]:
        """The buffered samples' bytes, by ranged reads, shard by shard; in ``refs`` order."""
        ranges: dict[int, list[SampleRef]] = {}
        for ref in refs:
            ranges.setdefault(ref.shard, []).append(ref)
        found: dict[SampleRef, RawSample] = {}
        for index, shard_refs in ranges.items():
            url = self.source.urls[self.plan.segment(index).shard]
            spans = [(ref.offset, ref.end) for ref in shard_refs]
            failure = None
            try:
                samples = self.source.reader.samples_at(url, spans)
            except self.source.shard_errors as exc:
                failure = exc
            if failure is not None:
                self.source.shard_failed(url, failure)
                continue
            found.update(zip(shard_refs, samples, strict=True))
        return [(ref, found[ref]) for ref in refs if ref in found]

    # --- reading ---------------------------------------------------------------------

    def _wants_more(self) -> bool:
        return self.plan.length is None or self.state.delivered < self.plan.length

    def _entries(
        self, prefetcher: ShardPrefetcher | None, headers_only: bool = False
    ) -> Iterator[Entry]:
        """The samples to deliver, in order: the plan's first pass through the shuffle buffer
        (drained at its end, so that every sample of the pass comes before any padding),
        then the padding passes as read. When those fall short of an equal length (a shard
        left out, or holding fewer samples than its count), more passes keep the length
        equal, as long as a pass yields any sample (a pass resumed inside a segment is not
        a whole pass: reading nothing there ends nothing)."""
        state, plan = self.state, self.plan
        first = self._read(state, prefetcher, headers_only, until=len(plan.segments))
        yield from self._shuffled(first) if self.buffer is not None else first
        yield from self._read(state, prefetcher, headers_only)
        while self._wants_more() and plan.length is not None:
            read, whole = state.read, state.offset == 0
            stop = max(state.shard, plan.limit) + len(plan.segments)
            yield from self._read(state, prefetcher, headers_only, until=stop, beyond=True)
            if state.read == read and whole:
                return

    def _read(
        self,
        state: StreamState,
        prefetcher: ShardPrefetcher | None,
        headers_only: bool = False,
        until: int | None = None,
        beyond: bool = False,
        counted: bool = True,
    ) -> Iterator[Entry]:
        """Samples of the plan from ``state``'s cursor on, moving it, up to segment index
        ``until`` (default: the plan's end; ``beyond``: past it, in further passes);
        ``state.shard`` indexes the plan's segments. A shard that turns out malformed is read
        once more (after its cached copy is dropped) before the handler decides. Long
        because it is the per-sample read loop: kept in one function for speed.

        ``counted``: ``state.segment_read`` counts from the segment's start (not so for a
        window scan), so a segment holding other than its sample count is a
        :class:`~fsspec_shards.iteration.lengths.SampleCountError` for the handler, raised at
        the sample past the count (the count's samples delivered first) or at the short end.
        """
        plan, source = self.plan, self.source
        stop = plan.limit if until is None else until if beyond else min(until, plan.limit)
        while state.shard < stop:
            index = state.shard
            segment = plan.segment(index)
            url = source.urls[segment.shard]
            expected = (
                plan.samples[index % len(plan.segments)] if counted and plan.samples else None
            )
            # ``shards_done`` counts each shard once: by the consumer that reads its last
            # part, in the first pass; at the part's count when known (an equal-length epoch
            # ends right after it), else at its end.
            finishes = not headers_only and index < plan.own_segments
            finishes = finishes and segment.end is None and segment.count is None
            done_at = expected if finishes and expected else None
            retried = False
            while True:
                failure = None
                try:
                    # The next shards are prefetched once this one has a sample: their
                    # fills then never hold the cache's locks or the link before it.
                    waiting = prefetcher is not None
                    if waiting:
                        prefetch_error = prefetcher.wait(index)
                        if prefetch_error is not None:
                            prefetcher.advance(index)
                            raise prefetch_error
                    start, end = source.byte_range(url, segment)
                    position = state.offset or start
                    with closing(source.samples(url, position, headers_only)) as samples:
                        for sample in samples:
                            if waiting:
                                prefetcher.advance(index)
                                waiting = False
                            if end is not None and sample.offset >= end:
                                break
                            if expected is not None and state.segment_read >= expected:
                                raise _miscounted(source, url, expected, "more")
                            ref = SampleRef(index, sample.offset, sample.end, state.read)
                            state.offset = sample.end
                            state.read += 1
                            state.segment_read += 1
                            if state.segment_read == done_at:
                                source.counters().shards_done += 1
                            yield ref, sample
                    if waiting:
                        prefetcher.advance(index)
                    if expected is not None and state.segment_read < expected:
                        raise _miscounted(source, url, expected, f"only {state.segment_read}")
                except source.shard_errors as exc:
                    failure = exc
                # Handled outside the except block, so that a raised error chains nothing.
                if done_at is not None and state.segment_read >= done_at and failure is not None:
                    source.counters().shards_done -= 1  # counted, then found to hold more
                if failure is None:
                    if finishes and done_at is None:
                        source.counters().shards_done += 1
                elif isinstance(failure, source.malformed_errors) and not retried:
                    retried = source.drop_cached(url)
                    if retried:
                        continue
                    source.shard_failed(url, failure)
                else:
                    source.shard_failed(url, failure)
                break
            state.shard = index + 1
            state.offset = 0
            state.segment_read = 0

    def _check_overrun(self) -> None:
        """At an equal length reached right at the count of a segment read to its shard's
        end: whether the shard holds more (one header read), for the handler. Not for a
        gzip shard: that would decompress it again."""
        state, plan, source = self.state, self.plan, self.source
        segment = plan.segment(state.shard)
        expected = plan.samples[state.shard % len(plan.segments)]
        if expected != state.segment_read or segment.end is not None or segment.count is not None:
            return
        url = source.urls[segment.shard]
        failure: BaseException | None = None
        try:
            if source.plain_size(url) is None:
                return
            with closing(source.samples(url, state.offset, headers_only=True)) as samples:
                if next(samples, None) is not None:
                    failure = _miscounted(source, url, expected, "more")
        except source.shard_errors as exc:
            failure = exc
        if failure is not None:
            source.shard_failed(url, failure)

    def _shuffled(self, source: Iterator[Entry]) -> Iterator[Entry]:
        """``source`` through the shuffle buffer, noting which read sample is oldest."""
        buffer, oldest = self.buffer, self.oldest
        items, size = buffer.items, buffer.size
        for entry in source:
            items.append(entry)
            oldest.read(entry[0].index, entry[0])
            if len(items) >= size:
                entry = buffer.pop()
                oldest.delivered(entry[0].index)
                yield entry
        while buffer.items:
            entry = buffer.pop()
            oldest.delivered(entry[0].index)
            yield entry

    def run(self) -> Iterator[Any]:
        """Deliver the rest of the epoch: samples through the transforms, with the stats.
        Long because it is the per-sample loop: its steps stay inline for speed."""
        state, source, plan = self.state, self.source, self.plan
        if state.finished:
            return
        stats = source.counters()
        stats.begin_epoch(state.epoch)
        # One pass: padding passes read shards already read (and cached), and a pass count
        # from a count that lies (2**32) must not become a list.
        urls = [source.urls[segment.shard] for segment in plan.segments]
        prefetcher = ShardPrefetcher(urls, source.reader.locate, source.prefetch)
        progress = source.progress_log(self.consumer, urls)
        # Bound here: a generator left alive until interpreter exit is closed after the
        # modules' globals are cleared, and its ``finally`` must then run without them.
        clock, finalizing = time.perf_counter, sys.is_finalizing
        started = clock()
        asked = started
        check_at = started + min(FLUSH_SECONDS, progress.interval or FLUSH_SECONDS)
        padding_from = plan.own_segments
        try:
            if not self.rebuilt:
                self.restore_position()
            entries = self._entries(prefetcher)
            while self._wants_more():
                entry = next(entries, None)
                if entry is None:
                    break
                ref, sample = entry
                state.delivered += 1
                stats.bytes_read += sample.end - sample.offset
                if ref.shard >= padding_from:
                    stats.padded += 1
                result = source.prepare(sample, self.consumer, state.delivered - 1)
                if result is None:
                    continue
                stats.samples += 1
                now = time.perf_counter()
                stats.wait_seconds += now - asked
                if now >= check_at:
                    stats.seconds += now - started
                    started = now
                    source.publish_stats(self.consumer)
                    progress.maybe_log(stats)
                    check_at = now + min(FLUSH_SECONDS, progress.interval or FLUSH_SECONDS)
                yield result
                asked = time.perf_counter()
            if plan.length is not None and state.delivered < plan.length:
                source.short_epoch(self.consumer, state.epoch, state.delivered, plan.length)
            elif plan.length is not None and state.shard < plan.limit:
                self._check_overrun()
            state.finished = True
        finally:
            if not finalizing():  # at interpreter exit there is no one left to tell
                prefetcher.close()
                stats.seconds += clock() - started
                source.publish_stats(self.consumer)


def _miscounted(source: ShardSource, url: str, expected: int, held: str) -> SampleCountError:
    return SampleCountError(
        f"shard {source.shown_url(url)} holds {held} samples where its sample count says "
        f"{expected}: the counts are wrong or the shard changed"
    )


@dataclass(frozen=True)
class Streams:
    """Makes the streams of a dataset's consumers. ``identity`` is what a position depends
    on besides its consumer (:func:`~fsspec_shards.iteration.resume.state.consumer_fingerprint`)."""

    source: ShardSource
    planner: Planner
    shuffle_buffer: int
    seed: int
    identity: Mapping[str, Any]

    def fingerprint(self, consumer: Consumer) -> dict[str, Any]:
        """The arguments a position of ``consumer`` depends on."""
        return consumer_fingerprint(self.identity, consumer)

    def fresh(self, consumer: Consumer, epoch: int) -> ConsumerStream:
        """The stream of ``consumer`` from the start of ``epoch``."""
        state = StreamState(self.fingerprint(consumer), epoch=epoch)
        return self._stream(consumer, self.planner.plan(epoch, consumer), state)

    def at(self, consumer: Consumer, state: StreamState) -> ConsumerStream:
        """The stream of ``consumer`` at a loaded position; ValueError naming the field when
        the position cannot be of this consumer (before anything is read)."""
        check_fingerprint(state.fingerprint, self.fingerprint(consumer))
        plan = self.planner.plan(state.epoch, consumer, state.remainder)
        check_position(state, plan, self.shuffle_buffer)
        return self._stream(consumer, plan, state, loaded=True)

    def over(self, consumer: Consumer, epoch: int, pieces: Sequence[Piece]) -> ConsumerStream:
        """The stream of ``consumer`` over its share of an epoch's remainder ``pieces``."""
        state = StreamState(self.fingerprint(consumer), epoch, remainder=tuple(pieces))
        return self._stream(consumer, self.planner.plan(epoch, consumer, pieces), state)

    def _stream(
        self, consumer: Consumer, plan: EpochPlan, state: StreamState, loaded: bool = False
    ) -> ConsumerStream:
        return ConsumerStream(
            self.source, consumer, plan, state, self.shuffle_buffer, self.seed, loaded
        )
