"""A counter-based random generator whose whole state is one integer.

Shard order and the sample shuffle buffer draw from :class:`CounterRNG`: draw ``i`` is
``splitmix64(key + (i + 1) * GAMMA)``, so saving and restoring the generator means saving the
draw counter, and the same (key, counter) gives the same numbers in every process and on every
machine. Keys come from :func:`derive_key`, a cryptographic hash of the labelled inputs, never
from Python's per-process randomized ``hash()``.
"""

from __future__ import annotations

import hashlib

_MASK64 = (1 << 64) - 1
_GAMMA = 0x9E3779B97F4A7C15


def _mix64(value: int) -> int:
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK64
    return value ^ (value >> 31)


def derive_key(purpose: str, *parts: int) -> int:
    """A 64-bit key from a purpose label and integers, stable across processes and versions."""
    text = "fsspec-shards/1|" + purpose + "|" + "|".join(str(int(part)) for part in parts)
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


class CounterRNG:
    """splitmix64 over a draw counter: the generator's state is ``counter``."""

    __slots__ = ("counter", "key")

    def __init__(self, key: int, counter: int = 0) -> None:
        self.key = key & _MASK64
        self.counter = counter

    def next_u64(self) -> int:
        """The next 64-bit draw."""
        self.counter += 1
        return _mix64((self.key + self.counter * _GAMMA) & _MASK64)

    def below(self, bound: int) -> int:
        """A uniform integer in ``[0, bound)``, unbiased (rejection of the top remainder)."""
        if bound <= 0:
            raise ValueError(f"bound must be positive, got {bound}")
        limit = ((1 << 64) // bound) * bound
        while True:
            draw = self.next_u64()
            if draw < limit:
                return draw % bound

    def below_many(self, bound: int, count: int) -> list[int]:
        """``count`` draws of :meth:`below` with the same ``bound``, in one tight loop (a
        resume replays a shuffle buffer's draws this way)."""
        if bound <= 0:
            raise ValueError(f"bound must be positive, got {bound}")
        limit = ((1 << 64) // bound) * bound
        key, counter = self.key, self.counter
        draws = []
        append = draws.append
        while len(draws) < count:
            counter += 1
            value = (key + counter * _GAMMA) & _MASK64
            value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
            value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK64
            value ^= value >> 31
            if value < limit:
                append(value % bound)
        self.counter = counter
        return draws

    def permutation(self, count: int) -> list[int]:
        """A uniform permutation of ``range(count)`` (Fisher-Yates)."""
        items = list(range(count))
        for i in range(count - 1, 0, -1):
            j = self.below(i + 1)
            items[i], items[j] = items[j], items[i]
        return items
