"""A bounded sample shuffle buffer, and how to rebuild it from two counts.

Samples go in with :meth:`ShuffleBuffer.add`; once ``size`` items are held, :meth:`pop` takes a
random one out (swap with the last, then drop the last), as webdataset's shuffle does. Which
list position each draw takes depends only on how many items are held, never on the items:
so the buffer after ``read`` samples went in and ``delivered`` came out is a function of those
two counts and of the RNG key. :func:`replay_buffer` computes it as read indices (the
``i``-th sample read), without reading any sample; a resumed stream then needs only where
those samples lie. :class:`OldestBuffered` follows the oldest buffered sample, the point a
resume scans from, at O(1) amortized cost per sample.
"""

from __future__ import annotations

from collections import deque
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


def replay_buffer(
    size: int, rng: CounterRNG, read: int, delivered: int, drained: bool
) -> list[int]:
    """The read indices held by a buffer of ``size`` after ``read`` samples went in and
    ``delivered`` came out, in list order; ``rng`` (at the epoch's start) ends where the
    stream's did. ``drained``: the source had ended, so pops continued without adds.

    Raises ValueError when no stream gives these counts.
    """
    in_loop = max(0, read - size + 1)
    if delivered < in_loop if drained else delivered != in_loop:
        raise ValueError(
            f"{read} samples read and {delivered} delivered do not fit a shuffle buffer of "
            f"{size} (the source {'had' if drained else 'had not'} ended)"
        )
    items = list(range(min(read, size - 1)))
    # Once full, every add is followed by a draw below ``size``: draw them all at once. The
    # drawn item is swapped with the new last one and taken out, so the new item takes its
    # place (or, drawn itself, leaves at once).
    last = size - 1
    for index, chosen in enumerate(rng.below_many(size, in_loop), start=last):
        if chosen != last:
            items[chosen] = index
    for _ in range(delivered - in_loop):
        if not items:
            raise ValueError(f"{delivered} samples delivered, more than the {read} read")
        _pop_at(items, rng.below(len(items)))
    return items


def _pop_at(items: list, index: int) -> None:
    """Remove ``items[index]`` as :meth:`ShuffleBuffer.pop` does (swap with the last)."""
    last = items.pop()
    if index != len(items):
        items[index] = last


class OldestBuffered(Generic[T]):
    """The earliest-read item still in a shuffle buffer, kept up to date at O(1) amortized
    cost: items are noted in read order, a delivered one is marked, and the head of the
    queue skips marked items."""

    def __init__(self) -> None:
        self._queue: deque[tuple[int, T]] = deque()
        self._delivered: set[int] = set()

    def read(self, index: int, item: T) -> None:
        """The item with read index ``index`` went into the buffer."""
        self._queue.append((index, item))

    def delivered(self, index: int) -> None:
        """The item with read index ``index`` left the buffer."""
        queue = self._queue
        if queue and queue[0][0] == index:
            queue.popleft()
            delivered = self._delivered
            while queue and queue[0][0] in delivered:
                delivered.discard(queue.popleft()[0])
        else:
            self._delivered.add(index)

    def clear(self) -> None:
        self._queue.clear()
        self._delivered.clear()

    @property
    def oldest(self) -> T | None:
        return self._queue[0][1] if self._queue else None
