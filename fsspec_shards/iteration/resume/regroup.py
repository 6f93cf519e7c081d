"""Continue an interrupted epoch with a different number of workers or ranks.

A consumer's position only means something for the consumer count it was made with. To
change the count mid-epoch, the states of ALL the old consumers (dataset states, torchdata
StatefulDataLoader states, or plain-DataLoader tracker states) are turned into the work left
in the epoch: a list of pieces, each a byte range of a shard with its sample count when
known. Per old consumer: its buffered samples (one piece each, found by the same header scan
a resume does), the rest of its current segment, then its untouched segments (padding passes
are not work left: the new consumers pad among themselves). ``ShardDataset.load_state_dict``
does this for a list of states; :func:`remainder_state` returns it as a state that every
new consumer loads. The new consumers share the pieces as they share an epoch's shards
(:mod:`~fsspec_shards.iteration.plan`; by sample ranges, and to equal lengths, when counts
are known) and deliver each remaining sample exactly once (in another order than the old
consumers would have). States taken during the remainder resume it exactly, and can be
regrouped again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from fsspec_shards.iteration.order import Consumer
from fsspec_shards.iteration.plan import Piece, Segment
from fsspec_shards.iteration.resume.delivery import DeliveredCounts, is_tracker_state
from fsspec_shards.iteration.resume.state import (
    CONSUMER_FIELDS,
    SampleRef,
    StreamState,
    base_fingerprint,
    check_fingerprint,
    remainder_from_list,
    remainder_to_list,
)
from fsspec_shards.iteration.stream import ConsumerStream, Streams

REMAINDER_KIND = "epoch-remainder"


class Regroupable(Protocol):
    """What :func:`remainder_state` needs of a dataset (a ``ShardDataset``): its streams."""

    streams: Streams


def is_remainder_state(data: Any) -> bool:
    """True for a :func:`remainder_state` result."""
    return isinstance(data, Mapping) and data.get("kind") == REMAINDER_KIND


def remainder_state(dataset: Regroupable, states: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The work left in an epoch, from the states of every consumer of one run, as a state
    that every consumer of the new run loads (``dataset`` is built with the run's arguments).

    Raises ValueError when the states are of different epochs or runs, or do not cover
    every consumer exactly once.
    """
    epoch, pieces = remainder_pieces(dataset.streams, states)
    return {
        "kind": REMAINDER_KIND,
        "fingerprint": dict(dataset.streams.identity),
        "epoch": epoch,
        "segments": remainder_to_list(pieces),
    }


def remainder_pieces(
    streams: Streams, states: Sequence[Mapping[str, Any]]
) -> tuple[int, tuple[Piece, ...]]:
    """(epoch, pieces left) from the states of every consumer of one run, read with
    ``streams`` (those of a dataset made with the run's arguments)."""
    positions = _positions(_expand(states))
    if not positions:
        raise ValueError("the states of every consumer of the interrupted run are needed, got none")
    expected = dict(streams.identity)
    epoch = positions[0][2]
    for _, fingerprint, state_epoch, _ in positions:
        if state_epoch != epoch:
            raise ValueError("the states come from different epochs")
        check_fingerprint(base_fingerprint(fingerprint), expected)
    consumers = [consumer for consumer, *_ in positions]
    total = consumers[0].total
    if sorted(consumer.index for consumer in consumers) != list(range(total)) or any(
        consumer.total != total for consumer in consumers
    ):
        raise ValueError(
            f"the states must cover each of the {total} consumers of the run exactly once "
            f"(got {len(consumers)} states)"
        )
    pieces: list[Piece] = []
    for consumer, _, _, position in sorted(positions, key=lambda item: item[0].index):
        stream, refs = _resolve(streams, consumer, epoch, position)
        pieces += _left_over(stream, refs)
    return epoch, tuple(pieces)


def _expand(states: Sequence[Any]) -> list[Mapping[str, Any]]:
    """Dataset and tracker states, with StatefulDataLoader states replaced by their workers'."""
    expanded: list[Mapping[str, Any]] = []
    for state in states:
        if not isinstance(state, Mapping):
            raise ValueError(f"a state must be a dict, got {type(state).__name__}")
        if "_snapshot" in state or "dataset_state" in state:
            expanded += loader_dataset_states(state)
        else:
            expanded.append(state)
    return expanded


def _positions(states: Sequence[Mapping[str, Any]]) -> list[tuple[Consumer, dict, int, Any]]:
    """(old consumer, fingerprint, epoch, position) per old consumer: a StreamState, or a
    tracker's (delivered count, the remainder its epoch continues or None)."""
    positions = []
    for data in states:
        if is_tracker_state(data):
            counts = DeliveredCounts.from_dict(data)
            fingerprint = counts.fingerprint
            rank, world_size = int(fingerprint["rank"]), int(fingerprint["world_size"])
            pieces = None if counts.remainder is None else remainder_from_list(counts.remainder)
            for worker, delivered in enumerate(counts.delivered):
                consumer = Consumer(rank, world_size, worker, len(counts.delivered))
                positions.append((consumer, fingerprint, counts.epoch, (delivered, pieces)))
            continue
        if is_remainder_state(data):
            raise ValueError("a remainder state is loaded by itself, not in a list of states")
        state = StreamState.from_dict(data)
        try:
            consumer = Consumer(*(int(state.fingerprint[key]) for key in CONSUMER_FIELDS))
        except (KeyError, TypeError, ValueError):
            raise ValueError(
                "invalid ShardDataset state: field 'fingerprint' names no consumer"
            ) from None
        positions.append((consumer, state.fingerprint, state.epoch, state))
    return positions


def _resolve(
    streams: Streams,
    consumer: Consumer,
    epoch: int,
    position: StreamState | tuple[int, tuple[Piece, ...] | None],
) -> tuple[ConsumerStream, list[SampleRef]]:
    """The old consumer's stream at its position, and its buffered samples (headers only)."""
    if isinstance(position, tuple):
        delivered, pieces = position
        if pieces is None:
            stream = streams.fresh(consumer, epoch)
        else:
            stream = streams.over(consumer, epoch, pieces)
        return stream, stream.fast_forward(delivered, payloads=False)
    stream = streams.at(consumer, position)
    return stream, stream.restore_position(payloads=False)


def _left_over(stream: ConsumerStream, refs: list[SampleRef]) -> list[Piece]:
    """What one old consumer had still to deliver, without its padding."""
    plan, state, source = stream.plan, stream.state, stream.source
    if state.finished:
        return []
    pieces: list[Piece] = [
        (Segment(plan.segments[ref.shard].shard, ref.offset, ref.end), 1)
        for ref in sorted(refs, key=lambda ref: ref.index)
        if not plan.is_padding(ref.shard)
    ]
    for index in range(state.shard, plan.own_segments):
        segment, samples = plan.segments[index], plan.samples[index]
        if index == state.shard and state.segment_read:
            _, end = source.byte_range(source.urls[segment.shard], segment)
            rest = None if samples is None else samples - state.segment_read
            if rest != 0:
                pieces.append((Segment(segment.shard, state.offset, end), rest))
        else:
            pieces.append((segment, samples))
    return pieces


def loader_dataset_states(loader_state: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The dataset state of every worker in a torchdata ``StatefulDataLoader.state_dict()``.

    The snapshot must be of the last delivered batch (``snapshot_every_n_steps=1``, the
    default); with several ranks, concatenate the lists of all ranks. Reads torchdata's
    private state keys (``_snapshot``, ``_steps_since_snapshot``, ``_worker_snapshots``,
    ``dataset_state``), here only: a state without them is a ValueError naming them, so a
    torchdata that renames them fails loudly (tests/resume/test_regroup.py reads a real state).
    """
    try:
        snapshot = loader_state.get("_snapshot")
        if snapshot is None:
            return [dict(loader_state["dataset_state"])]
        steps_behind = loader_state.get("_steps_since_snapshot")
        workers = list(snapshot["_worker_snapshots"].values())
        states = [dict(worker["dataset_state"]) for worker in workers]
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(
            "not a torchdata StatefulDataLoader state this version reads (expected "
            f"'_snapshot' with '_worker_snapshots', or 'dataset_state'; missing {exc})"
        ) from None
    if steps_behind:
        raise ValueError(
            "the loader state is older than its last batch: take it with snapshot_every_n_steps=1"
        )
    return states
