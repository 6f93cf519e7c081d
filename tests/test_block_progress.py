"""Which blocks of a fill are verified (storage/transfer/block_progress.py): readers wait on
the block they read and get the verified run from it; a failure ends what is readable."""

from __future__ import annotations

import threading
import time

import pytest

from fsspec_shards.storage.transfer.block_progress import BlockProgress
from tests.test_blocks import BLOCK, _blocks


def test_blocks_are_readable_as_they_verify_and_a_failure_stops_at_the_last_good_one():
    blocks = _blocks()
    progress = BlockProgress(blocks)
    progress.mark(0)
    progress.mark(1)
    progress.mark(3)
    assert progress.readable_end(10) == 2 * BLOCK  # the run from block 0
    assert progress.readable_end(3 * BLOCK) == 4 * BLOCK
    waiting = threading.Thread(target=lambda: progress.readable_end(2 * BLOCK + 5))
    waiting.start()
    time.sleep(0.05)
    assert progress.next_wanted() == 2  # the reader waits on block 2: fetched first
    progress.mark(2)
    waiting.join(5)
    assert not waiting.is_alive()
    progress.fail(OSError("gone"))
    assert progress.readable_end(0) == 4 * BLOCK
    with pytest.raises(OSError, match="gone"):
        progress.readable_end(4 * BLOCK)
