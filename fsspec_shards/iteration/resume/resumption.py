"""Where a dataset's next iteration starts: one resume object for every kind of state.

:meth:`Resumption.load` turns every kind of state into ONE object: a position of this
consumer (:class:`_Position`), a plain-DataLoader tracker's delivered counts
(:class:`_Counts`, :mod:`~fsspec_shards.iteration.resume.delivery`), an epoch remainder
(:class:`_Remainder`: a :func:`~fsspec_shards.iteration.resume.regroup.remainder_state`, or the
list of every old consumer's state of another world size or worker count, regrouped). The
next iteration starts from it (:meth:`Resumption.start`), and the running stream takes its
place (:class:`_Running`), so :meth:`Resumption.state_dict` always asks that one object.

A loaded state resumes the epoch it was taken in; an iteration of another epoch drops it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from fsspec_shards.config import is_int
from fsspec_shards.iteration.order import Consumer
from fsspec_shards.iteration.plan import Piece
from fsspec_shards.iteration.resume.delivery import DeliveredCounts, is_tracker_state
from fsspec_shards.iteration.resume.regroup import is_remainder_state, remainder_pieces
from fsspec_shards.iteration.resume.state import (
    StreamState,
    check_fingerprint,
    check_position,
    remainder_from_list,
)
from fsspec_shards.iteration.stream import ConsumerStream, Streams
from fsspec_shards.tar_blocks import BLOCK_SIZE

logger = logging.getLogger("fsspec_shards.dataset")


@dataclass(slots=True)
class _Position:
    """A loaded position of this consumer's stream."""

    state: StreamState

    @property
    def epoch(self) -> int:
        return self.state.epoch

    @property
    def remainder(self) -> tuple[Piece, ...] | None:
        return self.state.remainder

    def state_dict(self, streams: Streams, consumer: Callable[[], Consumer]) -> dict[str, Any]:
        return self.state.to_dict()

    def start(self, streams: Streams, consumer: Consumer) -> ConsumerStream:
        return streams.at(consumer, self.state)


@dataclass(slots=True)
class _Counts:
    """A plain-DataLoader tracker's delivered counts for every worker of this rank, in a
    whole epoch or in the ``remainder`` it continues."""

    counts: DeliveredCounts
    remainder: tuple[Piece, ...] | None = None

    @property
    def epoch(self) -> int:
        return self.counts.epoch

    def state_dict(self, streams: Streams, consumer: Callable[[], Consumer]) -> dict[str, Any]:
        return self.counts.to_dict()

    def start(self, streams: Streams, consumer: Consumer) -> ConsumerStream:
        counts = self.counts
        if len(counts.delivered) != consumer.num_workers:
            raise ValueError(
                f"the state counts {len(counts.delivered)} DataLoader workers, "
                f"this DataLoader has {consumer.num_workers}"
            )
        rotated = replace(
            consumer, worker=(consumer.worker + counts.next_worker) % consumer.num_workers
        )
        if self.remainder is None:
            stream = streams.fresh(rotated, counts.epoch)
        else:
            stream = streams.over(rotated, counts.epoch, self.remainder)
        stream.fast_forward(counts.delivered[rotated.worker])
        return stream


@dataclass(slots=True)
class _Remainder:
    """The rest of an interrupted epoch, to be shared by this run's consumers."""

    epoch: int
    remainder: tuple[Piece, ...]

    def state_dict(self, streams: Streams, consumer: Callable[[], Consumer]) -> dict[str, Any]:
        fingerprint = streams.fingerprint(consumer())
        return StreamState(fingerprint, self.epoch, remainder=self.remainder).to_dict()

    def start(self, streams: Streams, consumer: Consumer) -> ConsumerStream:
        return streams.over(consumer, self.epoch, self.remainder)


class _Running:
    """The stream an iterator is running: ``state_dict()`` reads its position."""

    __slots__ = ("stream",)

    def __init__(self, stream: ConsumerStream) -> None:
        self.stream = stream

    @property
    def epoch(self) -> int:
        return self.stream.epoch

    @property
    def remainder(self) -> tuple[Piece, ...] | None:
        return self.stream.state.remainder

    def state_dict(self, streams: Streams, consumer: Callable[[], Consumer]) -> dict[str, Any]:
        return self.stream.position().to_dict()

    def start(self, streams: Streams, consumer: Consumer) -> ConsumerStream:
        return streams.fresh(consumer, self.stream.epoch)


class Resumption:
    """The resume object of one dataset (None: start each epoch fresh), over its ``streams``."""

    def __init__(self, streams: Streams) -> None:
        self.streams = streams
        self.current: _Position | _Counts | _Remainder | _Running | None = None

    def state_dict(self, epoch: int, consumer: Callable[[], Consumer]) -> dict[str, Any]:
        """The position after the last delivered sample of ``epoch`` of the consumer that
        ``consumer()`` names: it is asked (it reads the environment) only when no running or
        loaded position answers, as a running stream's does at every checkpointed batch."""
        current = self.current
        if current is not None and current.epoch == epoch:
            return current.state_dict(self.streams, consumer)
        return StreamState(self.streams.fingerprint(consumer()), epoch=epoch).to_dict()

    def remainder(self, epoch: int) -> tuple[Piece, ...] | None:
        """The remainder ``epoch`` is made of, when a loaded or running one is."""
        current = self.current
        if current is None or current.epoch != epoch:
            return None
        return current.remainder

    def load(
        self, state: Mapping[str, Any] | Sequence[Mapping[str, Any]], consumer: Consumer
    ) -> int:
        """Make ``state`` (any kind: see ``ShardDataset.load_state_dict``) the start of the
        next iteration of ``consumer``; its epoch. ValueError naming the field or argument
        when it does not fit."""
        streams = self.streams
        if isinstance(state, list | tuple):
            epoch, pieces = remainder_pieces(streams, state)
            self.current = _Remainder(epoch, pieces)
        elif is_remainder_state(state):
            check_fingerprint(state["fingerprint"], dict(streams.identity))
            epoch = state.get("epoch")
            if not is_int(epoch) or epoch < 0:
                raise ValueError(f"invalid remainder state: field 'epoch': {epoch!r}")
            pieces = remainder_from_list(state.get("segments"))
            self.check_pieces(pieces)
            self.current = _Remainder(epoch, pieces)
        elif is_tracker_state(state):
            counts = DeliveredCounts.from_dict(state)
            expected = self.tracker_fingerprint(consumer, len(counts.delivered))
            check_fingerprint(counts.fingerprint, expected)
            pieces = None
            if counts.remainder is not None:
                pieces = remainder_from_list(counts.remainder)
                self.check_pieces(pieces)
            self.current = _Counts(counts, pieces)
        else:
            loaded = StreamState.from_dict(state)
            check_fingerprint(loaded.fingerprint, streams.fingerprint(consumer))
            if loaded.remainder is not None:
                self.check_pieces(loaded.remainder)
            plan = streams.planner.plan(loaded.epoch, consumer, loaded.remainder)
            check_position(loaded, plan, streams.shuffle_buffer)
            self.current = _Position(loaded)
        return self.current.epoch

    def start(self, epoch: int, consumer: Consumer) -> ConsumerStream:
        """The stream an iteration of ``epoch`` by ``consumer`` runs; it becomes the current
        resume object. A loaded state of another epoch is dropped."""
        current = self.current
        if current is not None and current.epoch != epoch:
            if not isinstance(current, _Running):
                logger.info(
                    "dropping the loaded state of epoch %d: set_epoch(%d) chose another epoch",
                    current.epoch,
                    epoch,
                )
            current = None
        if current is None:
            stream = self.streams.fresh(consumer, epoch)
        else:
            stream = current.start(self.streams, consumer)
        self.current = _Running(stream)
        return stream

    def tracker_fingerprint(self, consumer: Consumer, num_workers: int) -> dict[str, Any]:
        """The arguments a :class:`~fsspec_shards.iteration.resume.delivery.DeliveryTracker` state
        of ``consumer``'s rank depends on: those of the dataset state, for all its workers."""
        whole_rank = Consumer(consumer.rank, consumer.world_size, 0, 1)
        fingerprint = self.streams.fingerprint(whole_rank)
        del fingerprint["worker"]
        fingerprint["num_workers"] = num_workers
        return fingerprint

    def check_pieces(self, pieces: Sequence[Piece]) -> None:
        """ValueError naming the field when a remainder's segment cannot be of this dataset."""
        shards = len(self.streams.source.urls)
        for segment, samples in pieces:
            if not 0 <= segment.shard < shards:
                raise ValueError(
                    f"invalid ShardDataset state: field 'remainder': shard index "
                    f"{segment.shard} is outside 0..{shards - 1}"
                )
            if (
                segment.start < 0
                or segment.start % BLOCK_SIZE
                or (segment.end is not None and segment.end <= segment.start)
                or segment.skip < 0
                or (segment.count is not None and segment.count < 0)
                or (samples is not None and samples < 0)
            ):
                raise ValueError(
                    f"invalid ShardDataset state: field 'remainder': segment "
                    f"{[*segment.to_list(), samples]} is not a byte range of a shard"
                )

    def __getstate__(self) -> dict[str, Any]:
        current = None if isinstance(self.current, _Running) else self.current
        return {"streams": self.streams, "current": current}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.streams = state["streams"]
        self.current = state["current"]
