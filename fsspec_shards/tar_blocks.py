"""The tar format's block: a header is one 512-byte block and a member's data is padded to
whole blocks, so every member starts at a multiple of :data:`BLOCK_SIZE`.

Neutral (imports nothing of the package): storage and iteration never import each other.
"""

from __future__ import annotations

BLOCK_SIZE = 512
"""Bytes of a tar block."""


def padded(size: int) -> int:
    """The bytes ``size`` bytes of member data take in a tar: rounded up to whole blocks."""
    return (size + BLOCK_SIZE - 1) & -BLOCK_SIZE
