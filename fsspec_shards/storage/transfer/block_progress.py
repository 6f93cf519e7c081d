"""Which blocks of a block fill are verified (:class:`BlockProgress`): written by the fill
(``blocks.py``) as each block matches its digest, read by readers, who wait on it and never
read past a block that is not verified (``cache/following.py``), and told to a listener
(the cache's progress record, for other processes).
"""

from __future__ import annotations

import threading
from typing import Any, Protocol

from fsspec_shards.checksums import BlockList


class ProgressListener(Protocol):
    """Who is told of a fill's progress (the cache's record for other processes)."""

    def changed(self, progress: BlockProgress, force: bool) -> None:
        """More blocks are verified (``force``: the last one, or all at once)."""

    def failed(self, progress: BlockProgress, error: BaseException) -> None:
        """The fill ended without verifying every block."""


class BlockProgress:
    """Which blocks of one fill are verified: written by the fill, read by readers (who
    wait on a condition) and told to ``listener``."""

    def __init__(self, blocks: BlockList, listener: ProgressListener | None = None) -> None:
        self.blocks = blocks
        self.listener = listener
        self.verified = bytearray(len(blocks))
        self.failure: BaseException | None = None
        self.wanted: int | None = None
        """The block a reader waits on: the next range to fetch is the one holding it."""
        self._done = 0
        self._condition = threading.Condition()

    @property
    def complete(self) -> bool:
        return self._done == len(self.blocks)

    def mark(self, index: int) -> None:
        """Block ``index`` is written and matches its digest."""
        with self._condition:
            if not self.verified[index]:
                self.verified[index] = 1
                self._done += 1
            self._condition.notify_all()
        if self.listener is not None:
            self.listener.changed(self, force=self.complete)

    def mark_all(self) -> None:
        """Every block is verified (the whole object was, e.g. copied from the shared tier)."""
        with self._condition:
            self.verified[:] = b"\x01" * len(self.blocks)
            self._done = len(self.blocks)
            self._condition.notify_all()
        if self.listener is not None:
            self.listener.changed(self, force=True)

    def fail(self, error: BaseException) -> None:
        """The fill ended without verifying every block: readers waiting get ``error``."""
        with self._condition:
            if self.failure is None and not self.complete:
                self.failure = error
            self._condition.notify_all()
        if self.listener is not None and not self.complete:
            self.listener.failed(self, error)

    def readable_end(self, offset: int) -> int:
        """Wait until the block holding ``offset`` is verified; the end of the verified run
        from there (bytes ``[offset, end)`` may be handed out)."""
        index = self.blocks.block_at(offset)
        with self._condition:
            while not self.verified[index]:
                if self.failure is not None:
                    raise self.failure
                self.wanted = index
                self._condition.wait(1.0)
            return verified_run_end(self.blocks, self.verified, index)

    def wait_first(self, timeout: float) -> None:
        """Wait (at most ``timeout`` s) until some block is verified, or the fill failed."""
        with self._condition:
            self._condition.wait_for(lambda: self._done or self.failure, timeout)

    def next_wanted(self) -> int | None:
        """The block a reader waits on, if any and not verified yet."""
        wanted = self.wanted
        return None if wanted is None or self.verified[wanted] else wanted


def verified_run_end(blocks: BlockList, verified: Any, index: int) -> int:
    """The end byte of the run of verified blocks starting at ``index``."""
    end = index
    while end < len(blocks) and verified[end]:
        end += 1
    return blocks.bounds(end - 1)[1]
