"""Following a fill in flight (``cache/following.py``): the progress record other processes
poll, and readers that never read past a verified block.

Fills through the filesystem: tests/test_blocks.py; other processes and kills:
tests/integration/test_blocks.py.
"""

from __future__ import annotations

import io
import random
import threading
import time

from fsspec_shards.checksums import BlockHasher
from fsspec_shards.storage.cache.following import (
    LocalFill,
    ProgressiveReader,
    ProgressRecord,
    close_settled,
    read_record,
)
from fsspec_shards.storage.transfer.block_progress import BlockProgress

BLOCK = 4096
DATA = random.Random(5).randbytes(10 * BLOCK + 17)


def _blocks(data: bytes = DATA):
    hasher = BlockHasher(BLOCK)
    hasher.update(data)
    return hasher.block_list()


def test_the_progress_record_lists_verified_runs_and_is_replaced_whole(tmp_path):
    (tmp_path / "tmp").mkdir()
    key = "ab" * 32
    temp = tmp_path / "tmp" / f"{key}.1.00000000.5.part"
    record = ProgressRecord(str(tmp_path), key, str(temp))
    progress = BlockProgress(_blocks(), record)
    for index in (0, 1, 4):
        progress.mark(index)
    record.write(progress, "filling")
    found = read_record(record.path)
    assert found["verified"] == [[0, 2], [4, 5]] and found["temp"] == temp.name
    assert sorted(p.name for p in (tmp_path / "tmp").iterdir()) == [f"{key}.progress"]
    record.remove()
    assert read_record(record.path) is None


def test_a_failed_fill_is_recorded_for_followers(tmp_path):
    (tmp_path / "tmp").mkdir()
    key = "cd" * 32
    temp = tmp_path / "tmp" / f"{key}.1.00000000.5.part"
    record = ProgressRecord(str(tmp_path), key, str(temp))
    progress = BlockProgress(_blocks(), record)
    progress.mark(0)
    progress.fail(OSError("gone"))
    found = read_record(record.path)
    assert found["state"] == "failed" and found["error"] == "gone"
    assert found["verified"] == [[0, 1]] and found["integrity"] is False


def test_a_reader_of_a_fill_here_waits_for_each_block_to_verify(tmp_path):
    blocks = _blocks()
    temp = tmp_path / "part"
    temp.write_bytes(DATA)  # the bytes are there; only verified ones may be read
    progress = BlockProgress(blocks)
    local = LocalFill(progress, str(temp), ProgressRecord(str(tmp_path), "ef" * 32, str(temp)))
    reader = ProgressiveReader(io.FileIO(str(temp), "rb"), len(DATA), local, lambda: None)
    progress.mark(0)
    assert reader.read(3 * BLOCK) == DATA[:BLOCK]  # the verified run only
    got = []
    waiting = threading.Thread(target=lambda: got.append(reader.read(BLOCK)))
    waiting.start()
    time.sleep(0.05)
    assert waiting.is_alive() and progress.next_wanted() == 1
    progress.mark(1)
    waiting.join(5)
    assert got == [DATA[BLOCK : 2 * BLOCK]]
    reader.close()


def test_the_last_bytes_of_a_fill_here_are_returned_once_the_fetch_ended(tmp_path):
    """The fill publishes after its last block verified: a reader that read everything
    returns after that, so nothing of the fill writes into the directory afterwards."""
    blocks = _blocks()
    temp = tmp_path / "part"
    temp.write_bytes(DATA)
    progress = BlockProgress(blocks)
    local = LocalFill(progress, str(temp), ProgressRecord(str(tmp_path), "ab" * 32, str(temp)))
    reader = ProgressiveReader(io.FileIO(str(temp), "rb"), len(DATA), local, lambda: None)
    progress.mark_all()
    assert reader.read(BLOCK) == DATA[:BLOCK]  # not the end: no wait
    got = []
    waiting = threading.Thread(target=lambda: got.append(reader.read()))
    waiting.start()
    time.sleep(0.05)
    assert waiting.is_alive()  # every byte verified, the fetch still publishing
    local.ended.set()
    waiting.join(5)
    assert got == [DATA[BLOCK:]]
    reader.close()


def test_a_reader_given_up_closes_once_the_fill_here_ended(tmp_path):
    # What an opener does when the object's HEAD failed beside the fill: the fill stops at
    # its next byte; the opener raises only once it is gone (its lock free, its file removed).
    temp = tmp_path / "part"
    temp.write_bytes(DATA)
    progress = BlockProgress(_blocks())
    local = LocalFill(progress, str(temp), ProgressRecord(str(tmp_path), "ab" * 32, str(temp)))
    reader = ProgressiveReader(io.FileIO(str(temp), "rb"), len(DATA), local, lambda: None)
    ending = threading.Timer(0.2, local.ended.set)
    ending.start()
    started = time.monotonic()
    close_settled(reader)
    assert local.ended.is_set() and reader.closed
    assert time.monotonic() - started >= 0.15
    published = io.FileIO(str(temp), "rb")  # a published file: closed at once
    close_settled(published)
    assert published.closed
