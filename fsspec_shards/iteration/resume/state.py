"""The resumable position of one consumer's sample stream: a dozen integers, as plain JSON.

A :class:`StreamState` says where the stream stands after the last sample DELIVERED to the
consumer: the epoch, the read cursor (segment index in this consumer's
:class:`~fsspec_shards.iteration.plan.EpochPlan` and byte offset after the last sample
read), how many samples were read and delivered, the shuffle RNG counter, and ``window``:
where the oldest sample still in the shuffle buffer lies. Its size does not depend on the
shuffle buffer: the buffer's content follows from the counts (its order from replaying the
RNG, :func:`~fsspec_shards.iteration.shuffle.replay_buffer`) and its samples are found by a
header scan from ``window`` to the cursor.

``fingerprint`` records the arguments the position only means something under, the shards
identified as the cache identifies them (signing parameters ignored, so a re-signed URL is
the same shard); :func:`check_fingerprint` names every one that differs, and
:func:`check_position` every field that cannot be a position of the given plan.

The state is written as a flat dict whose ``fingerprint`` is one list of ``[name, value]``
pairs (version 3), not a nested dict (version 2, still read): torchdata's
``StatefulDataLoader`` flattens every nested dict of a state into leaves and compares each of
them at every snapshot, and the fingerprint never changes within an epoch.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fsspec_shards.config import is_int
from fsspec_shards.iteration.order import Consumer
from fsspec_shards.iteration.plan import EpochPlan, Segment
from fsspec_shards.redact import without_signing
from fsspec_shards.tar_blocks import BLOCK_SIZE

STATE_VERSION = 3
READ_VERSIONS = (2, 3)
"""Versions :meth:`StreamState.from_dict` reads: 2 wrote the fingerprint as a dict."""
CONSUMER_FIELDS = ("rank", "world_size", "worker", "num_workers")
"""The fingerprint fields that name the consumer a position is of."""


@dataclass(frozen=True, slots=True)
class SampleRef:
    """Where a read sample lies: segment index in the plan, byte range, and read index (its
    position among the samples read this epoch)."""

    shard: int
    offset: int
    end: int
    index: int = 0


@dataclass(slots=True)
class StreamState:
    """Position of one consumer's stream; ``finished`` marks a fully delivered epoch.

    ``read`` counts the samples read this epoch, ``delivered`` those handed out (transform
    drops included); the difference is in the shuffle buffer. ``segment_read`` counts the
    samples read from the current segment. ``remainder`` is set when the epoch is the rest of
    an epoch regrouped over other consumers (:mod:`~fsspec_shards.iteration.resume.regroup`).
    """

    fingerprint: dict[str, Any]
    epoch: int = 0
    shard: int = 0
    offset: int = 0
    read: int = 0
    delivered: int = 0
    rng_counter: int = 0
    window: SampleRef | None = None
    segment_read: int = 0
    finished: bool = False
    remainder: tuple[tuple[Segment, int | None], ...] | None = None

    @property
    def buffered(self) -> int:
        return self.read - self.delivered

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict (ints, bools, strings and lists only)."""
        window = self.window
        return {
            "version": STATE_VERSION,
            "fingerprint": [[name, value] for name, value in self.fingerprint.items()],
            "epoch": self.epoch,
            "shard": self.shard,
            "offset": self.offset,
            "read": self.read,
            "delivered": self.delivered,
            "rng_counter": self.rng_counter,
            "window": None if window is None else [window.shard, window.offset, window.index],
            "segment_read": self.segment_read,
            "finished": self.finished,
            "remainder": None if self.remainder is None else remainder_to_list(self.remainder),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StreamState:
        """Parse :meth:`to_dict` output; ValueError naming the field that is not one."""
        if not isinstance(data, Mapping) or data.get("version") not in READ_VERSIONS:
            raise ValueError(
                "not a ShardDataset state (expected a dict with version "
                f"{STATE_VERSION} or {READ_VERSIONS[0]}, got {type(data).__name__}"
                + (f" with version {data.get('version')!r})" if isinstance(data, Mapping) else ")")
            )
        if data["version"] == 2:
            fingerprint = _field(data, "fingerprint", dict)
        else:
            fingerprint = _pairs(_field(data, "fingerprint", list), "fingerprint")
        window = data.get("window")
        if window is not None:
            values = _ints(window, "window", 3)
            window = SampleRef(values[0], values[1], values[1], values[2])
        remainder = data.get("remainder")
        return cls(
            fingerprint=dict(fingerprint),
            epoch=_int(data, "epoch"),
            shard=_int(data, "shard"),
            offset=_int(data, "offset"),
            read=_int(data, "read"),
            delivered=_int(data, "delivered"),
            rng_counter=_int(data, "rng_counter"),
            window=window,
            segment_read=_int(data, "segment_read"),
            finished=_field(data, "finished", bool),
            remainder=None if remainder is None else remainder_from_list(remainder),
        )


def remainder_to_list(pieces: Sequence[tuple[Segment, int | None]]) -> list[list[int]]:
    """Pieces as ``[shard, start, end, skip, count, samples]`` lists (-1: open or unknown)."""
    return [[*segment.to_list(), -1 if samples is None else samples] for segment, samples in pieces]


def remainder_from_list(data: Any) -> tuple[tuple[Segment, int | None], ...]:
    """Parse :func:`remainder_to_list` output; ValueError naming the field if malformed."""
    if not isinstance(data, list | tuple):
        raise ValueError(f"state field 'remainder' must be a list, got {type(data).__name__}")
    pieces = []
    for item in data:
        values = _ints(item, "remainder", 6)
        pieces.append((Segment.from_list(values[:5]), None if values[5] == -1 else values[5]))
    return tuple(pieces)


def _field(data: Mapping[str, Any], name: str, kind: type) -> Any:
    if name not in data:
        raise ValueError(f"malformed ShardDataset state: field {name!r} is missing")
    value = data[name]
    if not isinstance(value, kind):
        raise ValueError(
            f"malformed ShardDataset state: field {name!r} must be {kind.__name__}, "
            f"got {type(value).__name__}"
        )
    return value


def _int(data: Mapping[str, Any], name: str) -> int:
    value = _field(data, name, int)
    if isinstance(value, bool):
        raise ValueError(f"malformed ShardDataset state: field {name!r} must be int, got bool")
    return value


def _pairs(values: Sequence[Any], name: str) -> dict[str, Any]:
    """A list of ``[name, value]`` pairs as a dict; ValueError naming the field otherwise."""
    if not all(
        isinstance(pair, list | tuple) and len(pair) == 2 and isinstance(pair[0], str)
        for pair in values
    ):
        raise ValueError(
            f"malformed ShardDataset state: field {name!r} must be a list of "
            f"[name, value] pairs, got {values!r}"
        )
    return dict(values)


def _ints(values: Any, name: str, count: int) -> list[int]:
    if (
        not isinstance(values, list | tuple)
        or len(values) != count
        or not all(is_int(v) for v in values)
    ):
        raise ValueError(
            f"malformed ShardDataset state: field {name!r} must hold lists of {count} ints, "
            f"got {values!r}"
        )
    return list(values)


def _bad(name: str, reason: str) -> ValueError:
    return ValueError(f"invalid ShardDataset state: field {name!r}: {reason}")


def check_position(state: StreamState, plan: EpochPlan, buffer_size: int) -> None:
    """Raise ValueError naming the first field of ``state`` that no stream over ``plan`` with
    a shuffle buffer of ``buffer_size`` can reach."""
    limit = plan.limit
    if state.epoch < 0:
        raise _bad("epoch", f"{state.epoch} is negative")
    # An equal-length stream that fell short reads further passes, past the plan's limit.
    if not 0 <= state.shard <= limit and not (plan.length is not None and state.shard > limit):
        raise _bad("shard", f"{state.shard} is outside this consumer's segments 0..{limit}")
    if state.offset < 0 or state.offset % BLOCK_SIZE:
        raise _bad("offset", f"{state.offset} is not a tar block boundary (a multiple of 512)")
    if state.shard == limit and state.offset and plan.length is None:
        raise _bad("offset", f"{state.offset} at the end of the segments must be 0")
    if state.delivered < 0:
        raise _bad("delivered", f"{state.delivered} is negative")
    if plan.length is not None and state.delivered > plan.length:
        raise _bad("delivered", f"{state.delivered} exceeds the epoch length {plan.length}")
    if state.read < state.delivered:
        raise _bad("read", f"{state.read} is less than delivered ({state.delivered})")
    if not 0 <= state.segment_read <= state.read:
        raise _bad("segment_read", f"{state.segment_read} is outside 0..read ({state.read})")
    if state.rng_counter < 0:
        raise _bad("rng_counter", f"{state.rng_counter} is negative")
    if not buffer_size and (state.buffered or state.rng_counter):
        raise _bad("read", "buffered samples or RNG draws without a shuffle buffer")
    if buffer_size and state.buffered >= buffer_size:
        raise _bad(
            "read",
            f"{state.buffered} buffered samples (read - delivered), more than a shuffle "
            f"buffer of {buffer_size} keeps between samples",
        )
    _check_window(state)
    if state.finished and not (
        (state.buffered == 0 and state.shard >= limit)
        or (plan.length is not None and state.delivered == plan.length)
    ):
        raise _bad("finished", "set, but samples remain to be read or delivered")


def _check_window(state: StreamState) -> None:
    window = state.window
    if window is None:
        if state.buffered and not state.finished:
            raise _bad("window", f"missing, but {state.buffered} samples are buffered")
        return
    if not state.buffered:
        raise _bad("window", "set, but no sample is buffered")
    if window.offset < 0 or window.offset % BLOCK_SIZE:
        raise _bad("window", f"offset {window.offset} is not a tar block boundary")
    if not 0 <= window.shard <= state.shard:
        raise _bad("window", f"segment {window.shard} is outside 0..shard ({state.shard})")
    if window.shard == state.shard and window.offset >= state.offset:
        raise _bad("window", f"offset {window.offset} is not before the cursor")
    if not 0 <= window.index <= state.read - state.buffered:
        raise _bad("window", f"read index {window.index} cannot be the oldest buffered sample")


def shard_identity(urls: Sequence[str]) -> str:
    """A short digest of the shard list as the cache identifies shards: signing parameters
    ignored, so re-signed URLs give the same digest; the state stays small for any list."""
    digest = hashlib.sha256()
    for url in urls:
        digest.update(without_signing(url).encode())
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def urls_digest(values: Sequence[str]) -> str:
    """A short digest of a list of strings (sample counts, for the fingerprint)."""
    digest = hashlib.sha256()
    for value in values:
        digest.update(value.encode())
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def consumer_fingerprint(identity: Mapping[str, Any], consumer: Consumer) -> dict[str, Any]:
    """The fingerprint of a position of ``consumer``: the dataset's ``identity`` (the
    arguments its plans and streams depend on) and the consumer."""
    return {
        **identity,
        "rank": consumer.rank,
        "world_size": consumer.world_size,
        "worker": consumer.worker,
        "num_workers": consumer.num_workers,
    }


def base_fingerprint(fingerprint: Mapping[str, Any]) -> dict[str, Any]:
    """A state fingerprint without the consumer it was taken by."""
    return {key: value for key, value in fingerprint.items() if key not in CONSUMER_FIELDS}


def check_fingerprint(saved: Mapping[str, Any], current: Mapping[str, Any]) -> None:
    """Raise ValueError naming every argument whose saved value differs from the current one."""
    names = sorted(set(saved) | set(current))
    differences = [
        f"{name} (state: {saved.get(name)!r}, dataset: {current.get(name)!r})"
        for name in names
        if saved.get(name) != current.get(name)
    ]
    if differences:
        raise ValueError(
            "the state was saved by a dataset with other arguments: " + "; ".join(differences)
        )
