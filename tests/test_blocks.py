"""Block-checked fills: blocks handed out as they verify, in memory (planned faults).

Readers and followers of a fill: tests/test_cache_following.py. Real servers, other
processes and kills: tests/integration/test_blocks.py.
"""

from __future__ import annotations

import random
import threading
import uuid

import pytest

from fsspec_shards.checksums import BlockHasher, format_block_manifest, format_sums
from fsspec_shards.errors import IntegrityError
from fsspec_shards.storage.cache.following import ProgressiveReader
from fsspec_shards.storage.filesystem import WdsFileSystem
from fsspec_shards.storage.transfer.block_progress import BlockProgress
from fsspec_shards.storage.transfer.blocks import fill_blocks
from tests.faults import Flip
from tests.planned_faults import PlannedFaultFileSystem

BLOCK = 4096
DATA = random.Random(5).randbytes(10 * BLOCK + 17)


def _blocks(data: bytes = DATA):
    hasher = BlockHasher(BLOCK)
    hasher.update(data)
    return hasher.block_list()


def _planned(tmp_path, plan=None, backend=None, **options):
    """A wds filesystem over planned faults, with a sums file and a block manifest; the plan
    applies to the shard's reads (the manifests are read first)."""
    backend = backend or PlannedFaultFileSystem()
    directory = f"/fs-{uuid.uuid4().hex}"
    path = f"{directory}/train-0000.tar"
    backend.pipe_file(path, DATA)
    blocks = _blocks()
    backend.pipe_file(
        f"{directory}/SHA256SUMS", format_sums([("train-0000.tar", blocks.checksum)]).encode()
    )
    backend.pipe_file(
        f"{directory}/SHA256SUMS.blocks",
        format_block_manifest([("train-0000.tar", blocks)], BLOCK).encode(),
    )
    fs = WdsFileSystem(
        fs=backend,
        cache_dir=str(tmp_path / "cache"),
        backoff=0.001,
        checksums=f"{directory}/SHA256SUMS",
        skip_instance_cache=True,
        **options,
    )
    assert fs.fetcher.manifest is not None  # loaded now: the plan is for the shard
    backend.plan = list(plan or [])
    backend.reads.clear()
    return fs, backend, path


def test_a_cold_read_is_a_progressive_reader_and_the_copy_is_published_whole(tmp_path):
    fs, backend, path = _planned(tmp_path)
    with fs.open(path, "rb") as handle:
        assert isinstance(handle.raw, ProgressiveReader)
        handle.seek(5 * BLOCK)
        assert handle.read(100) == DATA[5 * BLOCK : 5 * BLOCK + 100]
        handle.seek(0)
        assert handle.read() == DATA
        handle.raw.wait_until_cached()
    assert fs.cat_file(path, 3, 50) == DATA[3:50]
    stats = fs.cache_stats()
    assert (stats["cached_files"], stats["cached_bytes"], stats["misses"]) == (1, len(DATA), 1)


def test_a_flipped_byte_costs_its_block_once_more(tmp_path):
    fs, backend, path = _planned(tmp_path, plan=[Flip(3 * BLOCK + 1)])
    assert fs.cat_file(path) == DATA
    assert backend.reads[1][0] == 3 * BLOCK  # then block 3 on
    assert fs.cache_stats()["integrity_failures"] == 1


def test_a_block_bad_every_time_raises_naming_it_and_caches_nothing(tmp_path):
    fs, backend, path = _planned(tmp_path, plan=[Flip(3 * BLOCK + 1), Flip(3 * BLOCK + 1)])
    with fs.open(path, "rb") as handle:
        assert handle.read(3 * BLOCK) == DATA[: 3 * BLOCK]
        with pytest.raises(
            IntegrityError, match=r"train-0000.tar: .*block 3 \(bytes 12288-16384\)"
        ):
            handle.read(1)
    assert fs.cache_stats()["cached_files"] == 0


def test_an_object_of_another_size_than_the_block_manifest_is_an_integrity_error(tmp_path):
    fs, backend, path = _planned(tmp_path)
    backend.pipe_file(path, DATA + b"x")
    with pytest.raises(IntegrityError, match="not the one the block manifest lists"):
        fs.cat_file(path)


@pytest.mark.parametrize("plan", [[], [Flip(7)]], ids=["clean", "flipped"])
def test_streamed_without_cache_every_block_is_checked(tmp_path, plan):
    fs, backend, path = _planned(tmp_path, plan=plan, cache=False)
    with fs.open(path, "rb") as handle:
        assert handle.read() == DATA
    assert fs.cache_stats()["integrity_failures"] == len(plan)


class FlipsOnce(PlannedFaultFileSystem):
    """Flips the byte at ``flip_at`` in the first read that covers it, whichever that is."""

    protocol = "flipsonce"
    flip_at: int | None = None

    def cat_file(self, path, start=None, end=None, **kwargs):
        data = super().cat_file(path, start, end, **kwargs)
        offset = self.flip_at
        if offset is not None and (start or 0) <= offset < (start or 0) + len(data):
            self.flip_at = None
            index = offset - (start or 0)
            data = data[:index] + bytes([data[index] ^ 0xFF]) + data[index + 1 :]
        return data


def test_spans_in_flight_complete_out_of_order_and_a_bad_block_is_fetched_alone(tmp_path):
    fs, backend, path = _planned(tmp_path, backend=FlipsOnce())
    backend.flip_at = 5 * BLOCK + 3
    target = fs.fetcher.target(path)
    info = target.stat()
    blocks = _blocks()
    progress = BlockProgress(blocks)
    expected = target.expect(info, blocks)
    with open(tmp_path / "out", "w+b") as out:
        metadata = fill_blocks(target, out, expected, blocks, progress, 3, 2 * BLOCK)
        out.seek(0)
        assert out.read() == DATA
    assert progress.complete and metadata["size"] == len(DATA)
    starts = sorted(start for start, _, _ in backend.reads)
    assert starts == [0, 2 * BLOCK, 4 * BLOCK, 5 * BLOCK, 6 * BLOCK, 8 * BLOCK, 10 * BLOCK]
    assert fs.cache_stats()["integrity_failures"] == 1


class StallsWhileASiblingFails(PlannedFaultFileSystem):
    """The span at ``2 * BLOCK`` stalls until the span at ``4 * BLOCK`` was refused (its
    worker ended), then times out."""

    protocol = "stallsonce"

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.refused_in: threading.Thread | None = None
        self.refused = threading.Event()
        self.stalled_reads = 0

    def cat_file(self, path, start=None, end=None, **kwargs):
        if start == 4 * BLOCK and self.refused_in is None:
            self.refused_in = threading.current_thread()
            self.refused.set()
            raise PermissionError("refused")
        if start == 2 * BLOCK:
            self.stalled_reads += 1
            if self.stalled_reads == 1:
                assert self.refused.wait(30)
                self.refused_in.join(30)  # its worker set the fill's stop, then ended
                raise TimeoutError("stalled")
        return super().cat_file(path, start=start, end=end, **kwargs)


def test_a_span_stalled_while_another_failed_asks_no_more(tmp_path):
    fs, backend, path = _planned(tmp_path, backend=StallsWhileASiblingFails())
    target = fs.fetcher.target(path)
    blocks = _blocks()
    progress = BlockProgress(blocks)
    with open(tmp_path / "out", "w+b") as out, pytest.raises(PermissionError):
        expected = target.expect(target.stat(), blocks)
        fill_blocks(target, out, expected, blocks, progress, 2, 2 * BLOCK)
    assert backend.stalled_reads == 1  # its time-out ended it: no retry of a failed fill


def test_the_plan_starts_with_a_small_span_and_merges_the_rest_on_request(tmp_path):
    # 11 blocks, spans of 4 after a first span of 1: [0,1) [1,5) [5,9) [9,11); a fill whose
    # server ignores Range takes what is left in one request (rest=True).
    from fsspec_shards.storage.transfer.blocks import _Plan

    blocks = _blocks()
    plan = _Plan(blocks, BlockProgress(blocks), 4, 1)
    assert plan.spans == [(0, 1), (1, 5), (5, 9), (9, 11)]
    assert plan.take() == (0, 1)
    assert not plan.empty.is_set()
    assert plan.take(rest=True) == (1, 11)
    assert plan.empty.is_set() and plan.take() is None
