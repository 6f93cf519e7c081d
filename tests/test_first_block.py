"""A block fill's first block as concurrent pieces (storage/transfer/first_block.py): the
pieces asked, the block checked once all are in, a bad or failed piece. Against a paced
link (how soon the block is readable) and where ranges do not pay (one request):
tests/integration/test_blocks.py; the rule of how many: tests/test_range_plan.py.
"""

from __future__ import annotations

import hashlib
import threading

import pytest

from fsspec_shards.storage.transfer import range_plan
from fsspec_shards.storage.transfer.block_progress import BlockProgress
from fsspec_shards.storage.transfer.blocks import fill_blocks
from fsspec_shards.storage.transfer.first_block import PiecedBlock
from tests.planned_faults import PlannedFaultFileSystem
from tests.test_blocks import BLOCK, DATA, FlipsOnce, _blocks, _planned


def _fill_with_pieces(tmp_path, backend, monkeypatch):
    """Fill the shard with 4 pieces of its first block (pieces of a quarter block), every
    block left in one request."""
    monkeypatch.setattr(range_plan, "PIECE_BYTES", BLOCK // 4)
    monkeypatch.setattr(range_plan, "_learned", {})
    fs, backend, path = _planned(tmp_path, backend=backend)
    target = fs.fetcher.target(path)
    blocks = _blocks()
    progress = BlockProgress(blocks)
    expected = target.expect(target.stat(), blocks)
    with open(tmp_path / "out", "w+b") as out:
        metadata = fill_blocks(target, out, expected, blocks, progress, "auto")
        out.seek(0)
        assert out.read() == DATA
    assert progress.complete and metadata["size"] == len(DATA)
    return fs, sorted((start, end) for start, end, _ in backend.reads)


def test_a_first_block_asked_in_pieces_is_verified_once_all_are_in(tmp_path, monkeypatch):
    fs, reads = _fill_with_pieces(tmp_path, FlipsOnce(), monkeypatch)
    quarter = BLOCK // 4
    assert reads == [(0, quarter), (quarter, 2 * quarter), (2 * quarter, 3 * quarter),
                     (3 * quarter, len(DATA))]  # fmt: skip
    assert fs.cache_stats()["integrity_failures"] == 0


def test_a_bad_byte_in_a_piece_costs_the_first_block_once_more_in_one_request(
    tmp_path, monkeypatch
):
    backend = FlipsOnce()
    backend.flip_at = BLOCK // 4 + 5  # in the second piece
    fs, reads = _fill_with_pieces(tmp_path, backend, monkeypatch)
    assert (0, BLOCK) in reads  # block 0 again, alone
    assert fs.cache_stats()["integrity_failures"] == 1


class RefusesTheSecondPiece(PlannedFaultFileSystem):
    protocol = "refusespiece"

    def cat_file(self, path, start=None, end=None, **kwargs):
        if start == BLOCK // 4:
            raise PermissionError("refused")
        return super().cat_file(path, start=start, end=end, **kwargs)


def test_a_piece_that_fails_fails_the_fill(tmp_path, monkeypatch):
    with pytest.raises(PermissionError):
        _fill_with_pieces(tmp_path, RefusesTheSecondPiece(), monkeypatch)


def test_the_pieces_cover_the_block_and_the_block_is_checked_from_the_file(tmp_path):
    blocks = _blocks()
    verified: list[int] = []
    with open(tmp_path / "file", "w+b") as out:
        out.truncate(len(DATA))
        block = PiecedBlock(blocks, out.fileno(), 1, 3, verified.append, lambda: 0)
        assert [(p.start, p.end) for p in block.pieces] == [
            (BLOCK, BLOCK + 1366), (BLOCK + 1366, BLOCK + 2732), (BLOCK + 2732, 2 * BLOCK)
        ]  # fmt: skip
        writers = [
            threading.Thread(
                target=p.write, args=(memoryview(DATA[p.start : p.end + 100]), p.start)
            )
            for p in reversed(block.pieces)
        ]
        for writer in writers:
            writer.start()
        for writer in writers:
            writer.join()
        assert verified == [1] and block.actual is None
        bad = PiecedBlock(blocks, out.fileno(), 2, 2, verified.append, lambda: 0)
        for piece in bad.pieces:
            piece.write(memoryview(bytes(piece.end - piece.start)), piece.start)
        assert verified == [1]
        assert bad.actual == hashlib.sha256(bytes(BLOCK)).hexdigest() and not bad.changed


def test_a_pieces_rate_is_from_its_first_byte_or_from_its_request_when_it_came_whole():
    with open(__file__, "rb") as any_file:
        block = PiecedBlock(_blocks(), any_file.fileno(), 0, 2, lambda index: None, lambda: 0)
    streamed, whole = block.pieces
    assert streamed.rate() is None  # nothing in yet
    streamed.asked_at, streamed.first_at, streamed.last_at = 0.0, 1.0, 1.5
    streamed.first_bytes = 48
    assert streamed.rate() == (BLOCK // 2 - 48) / 0.5  # the round trip left out
    whole.asked_at, whole.first_at, whole.last_at = 0.0, 0.25, 0.25
    assert whole.rate() == (BLOCK // 2) / 0.25  # handed over whole: from its request on
