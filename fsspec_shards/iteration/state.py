"""The resumable position of one consumer's sample stream, as small plain JSON.

A :class:`StreamState` holds where the stream stands after the last sample DELIVERED to the
consumer: the epoch, the reader's shard (index in this consumer's shard list) and byte offset,
the shuffle RNG counter, and the shuffle buffer as references ``[shard index, offset, end]``
into the shards, never sample bytes. ``fingerprint`` records the arguments the position is
only meaningful under; :func:`check_fingerprint` names every one that differs.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

STATE_VERSION = 1


@dataclass(frozen=True, slots=True)
class SampleRef:
    """Where a sample lives: shard index in the consumer's list, byte range in the tar."""

    shard: int
    offset: int
    end: int


@dataclass(slots=True)
class StreamState:
    """Position of one consumer's stream; ``finished`` marks a fully delivered epoch.

    ``delivered`` counts the samples taken from the stream this epoch (including any that a
    transform dropped). ``remainder`` is set when the epoch is the rest of an epoch regrouped
    over other consumers: all its segments ``[url index, start, end or -1]``
    (:mod:`~fsspec_shards.iteration.regroup`).
    """

    fingerprint: dict[str, Any]
    epoch: int = 0
    shard: int = 0
    offset: int = 0
    rng_counter: int = 0
    buffer: list[SampleRef] = field(default_factory=list)
    delivered: int = 0
    finished: bool = False
    remainder: list[list[int]] | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict (ints, bools, strings and lists only)."""
        return {
            "version": STATE_VERSION,
            "fingerprint": dict(self.fingerprint),
            "epoch": self.epoch,
            "shard": self.shard,
            "offset": self.offset,
            "rng_counter": self.rng_counter,
            "buffer": [[ref.shard, ref.offset, ref.end] for ref in self.buffer],
            "delivered": self.delivered,
            "finished": self.finished,
            "remainder": None if self.remainder is None else [list(s) for s in self.remainder],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StreamState:
        """Parse :meth:`to_dict` output; ValueError when it is not such a state."""
        if not isinstance(data, Mapping) or data.get("version") != STATE_VERSION:
            raise ValueError(
                "not a ShardDataset state (expected a dict with version "
                f"{STATE_VERSION}, got {type(data).__name__})"
            )
        try:
            return cls(
                fingerprint=dict(data["fingerprint"]),
                epoch=int(data["epoch"]),
                shard=int(data["shard"]),
                offset=int(data["offset"]),
                rng_counter=int(data["rng_counter"]),
                buffer=[SampleRef(int(s), int(o), int(e)) for s, o, e in data["buffer"]],
                delivered=int(data["delivered"]),
                finished=bool(data["finished"]),
                remainder=_segments(data.get("remainder")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed ShardDataset state: {exc!r}") from None


def _segments(data: Any) -> list[list[int]] | None:
    if data is None:
        return None
    return [[int(url), int(start), int(end)] for url, start, end in data]


def urls_digest(urls: Sequence[str]) -> str:
    """A short digest of the shard URL list, so the state stays small for huge datasets."""
    digest = hashlib.sha256()
    for url in urls:
        digest.update(url.encode())
        digest.update(b"\0")
    return digest.hexdigest()[:16]


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
