"""A block fill's first block as concurrent pieces: what a reader of a cold file waits for,
in one round trip and a piece's time rather than a whole block's.

How many pieces, and where none: ``range_plan.Ramp.first_pieces``. Each piece is asked by a
request of its own, all at once (the last one runs on past the block: ``blocks.py``), and
written where it belongs; the block is read back from the file and checked against its
digest once the last piece is in, so what is verified is what was written. A mismatch is
left for the fill to count and ask again (:attr:`PiecedBlock.actual`).
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Callable

from fsspec_shards.checksums import BlockList
from fsspec_shards.storage.core.retry import TransientError
from fsspec_shards.storage.transfer.one_stream import pwrite_all
from fsspec_shards.storage.transfer.range_plan import Stopped

_READ_BACK = 1024 * 1024


class Piece:
    """Bytes ``[start, end)`` of a block asked as pieces (:class:`PiecedBlock`), the first
    bytes of one request: when they arrived (for the link's rate)."""

    __slots__ = ("start", "end", "block", "asked_at", "first_at", "last_at", "first_bytes")

    def __init__(self, start: int, end: int, block: PiecedBlock) -> None:
        self.start, self.end, self.block = start, end, block
        self.asked_at = time.monotonic()
        self.first_at = self.last_at = 0.0
        self.first_bytes = 0

    def write(self, data: memoryview, position: int) -> int:
        """Write what of ``data`` (bytes from ``position`` on) belongs to the piece into the
        file; how many bytes that was. The last one written completes the piece."""
        taken = data[: self.end - position]
        pwrite_all(self.block.descriptor, taken, position)
        now = time.monotonic()
        if not self.first_at:
            self.first_at, self.first_bytes = now, len(taken)
        self.last_at = now
        if position + len(taken) == self.end:
            self.block.piece_done()
        return len(taken)

    def rate(self) -> float | None:
        """Bytes per second from its first byte to its last; where all came at once (a
        transport that hands a range over whole), from its request on (None: not in)."""
        if not self.last_at:
            return None
        if self.last_at > self.first_at:
            return (self.end - self.start - self.first_bytes) / (self.last_at - self.first_at)
        return (self.end - self.start) / max(self.last_at - self.asked_at, 1e-6)


class PiecedBlock:
    """Block ``index`` of ``blocks`` asked as ``pieces`` pieces, written into the file
    ``descriptor``: checked once the last piece is in; a good block is passed to
    ``verified``. ``changes`` counts the versions the fill met, so that a block read across
    two versions is told from a corrupt one."""

    def __init__(
        self,
        blocks: BlockList,
        descriptor: int,
        index: int,
        pieces: int,
        verified: Callable[[int], None],
        changes: Callable[[], int],
    ) -> None:
        self.blocks = blocks
        self.descriptor = descriptor
        self.index = index
        self._verified = verified
        self._changes = changes
        self._changes_before = changes()
        start, end = blocks.bounds(index)
        size = -(-(end - start) // pieces)
        self.pieces = [Piece(at, min(end, at + size), self) for at in range(start, end, size)]
        self._left = len(self.pieces)
        self._lock = threading.Lock()
        self.actual: str | None = None
        """The digest the block had when it did not match (None: it did, or is not in)."""
        self.changed = False
        """The object changed while the pieces were read (not corrupt: read again)."""

    def piece_done(self) -> None:
        """A piece is all written; the last one in checks the block."""
        with self._lock:
            self._left -= 1
            if self._left:
                return
        start, end = self.blocks.bounds(self.index)
        digest = hashlib.sha256()
        position = start
        while position < end:
            data = os.pread(self.descriptor, min(end - position, _READ_BACK), position)
            if not data:
                raise TransientError(f"the file ends at byte {position}, expected {end}")
            digest.update(data)
            position += len(data)
        actual = digest.hexdigest()
        if actual == self.blocks.blocks[self.index]:
            self._verified(self.index)
        else:
            self.actual = actual
            self.changed = self._changes() != self._changes_before

    def slowest_rate(self) -> float | None:
        """The rate of the slowest piece but the last (which runs on); None: unknown."""
        rates = [piece.rate() for piece in self.pieces[:-1]]
        return None if None in rates or not rates else min(rates)


def fetch_pieces(
    block: PiecedBlock,
    fetch: Callable[[Piece], int | None],
    stop: threading.Event,
    failed: Callable[[BaseException], None],
) -> list[int | None]:
    """Every piece of ``block`` fetched at once (``fetch``: the HTTP status of its answer):
    the last on this thread, the others on threads of their own; the statuses. A piece that
    fails is passed to ``failed`` (which stops the fill); a failure here sets ``stop``, and
    returns or raises only once every piece ended."""
    statuses: list[int | None] = []

    def piece(number: int) -> None:
        try:
            statuses.append(fetch(block.pieces[number]))
        except Stopped:
            pass
        except BaseException as exc:
            failed(exc)

    threads = [
        threading.Thread(target=piece, args=(n,), name=f"fsspec-shards-piece-{n}", daemon=True)
        for n in range(len(block.pieces) - 1)
    ]
    for thread in threads:
        thread.start()
    try:
        statuses.append(fetch(block.pieces[-1]))
    except BaseException:
        stop.set()  # the other pieces end at their next byte
        raise
    finally:
        for thread in threads:
            thread.join()
    return statuses
