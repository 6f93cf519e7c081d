"""A bounded sample shuffle buffer whose state is its items and one RNG counter.

Samples go in with :meth:`ShuffleBuffer.add`; once ``size`` items are held, :meth:`pop` takes a
random one out (swap with the last, then drop the last), as webdataset's shuffle does. The
items' list order and the RNG counter together determine everything that follows, so saving
``items`` (as references) and ``rng.counter`` is enough to continue exactly.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Generic, TypeVar

from fsspec_shards.iteration.rng import CounterRNG, derive_key

T = TypeVar("T")


def shuffle_key(seed: int, epoch: int, rank: int, worker: int) -> int:
    """RNG key of the shuffle buffer of one consumer in one epoch."""
    return derive_key("sample-shuffle", seed, epoch, rank, worker)


class ShuffleBuffer(Generic[T]):
    """Holds at most ``size`` items and releases them in a seeded random order."""

    def __init__(self, size: int, rng: CounterRNG, items: Iterable[T] = ()) -> None:
        if size < 1:
            raise ValueError(f"shuffle buffer size must be >= 1, got {size}")
        self.size = size
        self.rng = rng
        self.items: list[T] = list(items)
        if len(self.items) > size:
            raise ValueError(f"{len(self.items)} items do not fit a buffer of size {size}")

    def __len__(self) -> int:
        return len(self.items)

    @property
    def full(self) -> bool:
        """True when the next item must be popped before another is added."""
        return len(self.items) >= self.size

    def add(self, item: T) -> None:
        """Put an item in; the caller pops first when the buffer is full."""
        if self.full:
            raise OverflowError("shuffle buffer is full: pop before adding")
        self.items.append(item)

    def pop(self) -> T:
        """Remove and return a random item."""
        index = self.rng.below(len(self.items))
        last = self.items.pop()
        if index == len(self.items):
            return last
        chosen = self.items[index]
        self.items[index] = last
        return chosen

    def shuffle(self, source: Iterable[T]) -> Iterator[T]:
        """Items of ``source`` in shuffled order: fill, then pop one per add, then drain."""
        for item in source:
            self.add(item)
            if self.full:
                yield self.pop()
        while self.items:
            yield self.pop()
