"""Continue an interrupted epoch with a different number of workers or ranks.

A consumer's position only means something for the consumer count it was made with. To
change the count mid-epoch, :func:`remainder_state` takes the states of ALL the old
consumers and lists the work left in the epoch as segments ``[url index, start, end]``
(``end`` -1: to the end of the shard): each old consumer's buffered samples (one segment
each), the rest of its current shard, then its untouched shards. Every new consumer loads
the same remainder and reads every ``total``-th segment; together they deliver each
remaining sample exactly once (in another order than the old consumers would have). States
taken during the remainder resume it exactly, and can be regrouped again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fsspec_shards.iteration.order import Consumer
from fsspec_shards.iteration.state import StreamState

REMAINDER_KIND = "epoch-remainder"
CONSUMER_FIELDS = ("rank", "world_size", "worker", "num_workers")


def is_remainder_state(data: Any) -> bool:
    """True for a :func:`remainder_state` result."""
    return isinstance(data, Mapping) and data.get("kind") == REMAINDER_KIND


def base_fingerprint(fingerprint: Mapping[str, Any]) -> dict[str, Any]:
    """A state fingerprint without the consumer it was taken by."""
    return {key: value for key, value in fingerprint.items() if key not in CONSUMER_FIELDS}


def remainder_state(dataset: Any, states: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The work left in an epoch, from the states of every consumer of one run.

    ``dataset`` is built with the run's arguments. Raises ValueError when the states are of
    different epochs or runs, or do not cover every consumer exactly once.
    """
    if dataset.equalize is not None:
        raise ValueError("an equal-length (equalize) epoch cannot be regrouped")
    parsed = [StreamState.from_dict(state) for state in states]
    if not parsed:
        raise ValueError("remainder_state needs the states of every consumer, got none")
    first = parsed[0]
    consumers = [Consumer(*(int(s.fingerprint[key]) for key in CONSUMER_FIELDS)) for s in parsed]
    for state in parsed:
        if state.epoch != first.epoch or base_fingerprint(state.fingerprint) != base_fingerprint(
            first.fingerprint
        ):
            raise ValueError("the states come from different epochs or differently built runs")
    total = consumers[0].total
    if sorted(consumer.index for consumer in consumers) != list(range(total)) or any(
        consumer.total != total for consumer in consumers
    ):
        raise ValueError(
            f"the states must cover each of the {total} consumers of the run exactly once"
        )
    url_index = {url: index for index, url in reversed(list(enumerate(dataset.urls)))}
    segments: list[list[int]] = []
    for consumer, state in sorted(zip(consumers, parsed, strict=True), key=lambda p: p[0].index):
        if state.finished:
            continue
        plan = dataset.epoch_plan(state.epoch, consumer, state.remainder)
        for ref in state.buffer:
            segments.append([url_index[plan.segment(ref.shard).url], ref.offset, ref.end])
        for index in range(state.shard, plan.shard_limit):
            segment = plan.segment(index)
            start = state.offset if index == state.shard and state.offset else segment.start
            end = -1 if segment.end is None else segment.end
            segments.append([url_index[segment.url], start, end])
    return {
        "kind": REMAINDER_KIND,
        "fingerprint": base_fingerprint(first.fingerprint),
        "epoch": first.epoch,
        "segments": segments,
    }


def loader_dataset_states(loader_state: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The dataset state of every worker in a torchdata ``StatefulDataLoader.state_dict()``.

    The snapshot must be of the last delivered batch (``snapshot_every_n_steps=1``, the
    default); with several ranks, concatenate the lists of all ranks.
    """
    snapshot = loader_state.get("_snapshot")
    if snapshot is None:
        return [dict(loader_state["dataset_state"])]
    if loader_state.get("_steps_since_snapshot"):
        raise ValueError(
            "the loader state is older than its last batch: take it with snapshot_every_n_steps=1"
        )
    workers = snapshot["_worker_snapshots"].values()
    return [dict(worker["dataset_state"]) for worker in workers]
