"""zstd shards: the binding, the frame walk, and the tar reader over .tar.zst streams
(truncation, corruption and decompression bombs each a ShardFormatError naming the shard)."""

from __future__ import annotations

import io
import tarfile
import tracemalloc

import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from fsspec_shards.errors import ShardFormatError
from fsspec_shards.iteration import tar, zstd
from fsspec_shards.iteration.tar import iter_members, open_shard_stream, shard_compression
from tests.shardmaker import compressed_zeros, make_tar, regular, shard_tar

SHARD = "memory://bucket/shard-0001.tar.zst"


@pytest.fixture(params=["zstandard", "stdlib"], autouse=True)
def binding(request, monkeypatch):
    """Every test with each binding: zstandard, and Python 3.14's compression.zstd (its
    backport, the same API, where the standard library has none)."""
    if request.param == "zstandard":
        monkeypatch.setattr(zstd, "_STDLIB", None)
        monkeypatch.setattr(zstd, "_ZSTANDARD", zstandard)
        errors = (zstd.CorruptZstdError, zstandard.ZstdError)
    else:
        try:
            from compression import zstd as module
        except ImportError:
            module = pytest.importorskip("backports.zstd")
        monkeypatch.setattr(zstd, "_STDLIB", module)
        monkeypatch.setattr(zstd, "_ZSTANDARD", None)
        errors = (zstd.CorruptZstdError, module.ZstdError)
    monkeypatch.setattr(zstd, "ZSTD_ERRORS", errors)
    monkeypatch.setattr(tar, "COMPRESSED_STREAM_ERRORS", (EOFError, *errors))
    return request.param


def compress(raw: bytes) -> bytes:
    """``raw`` as the writer compresses it: the binding's writer, content checksum on."""
    buffer = io.BytesIO()
    writer = zstd.open_writer(buffer)
    writer.write(raw)
    writer.close()
    assert not buffer.closed
    return buffer.getvalue()


def members_of(data: bytes, name: str = SHARD) -> list[tuple[str, bytes]]:
    return [(m.name, m.data) for m in iter_members(open_shard_stream(io.BytesIO(data), name), name)]


def tarfile_members(raw: bytes) -> list[tuple[str, bytes]]:
    with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as archive:
        return [(info.name, archive.extractfile(info).read()) for info in archive.getmembers()]


def test_a_zstd_shard_reads_as_the_tar_it_holds_and_is_told_by_magic_bytes():
    raw = shard_tar(3, 20, payload_size=3000)
    data = compress(raw)
    assert data.startswith(zstd.ZSTD_MAGIC) and len(data) < len(raw) // 3
    assert shard_compression("plain-name.tar", io.BytesIO(data)) == "zstd"
    assert members_of(data, "plain-name.tar") == tarfile_members(raw)


def test_frames_written_by_another_zstd_writer_and_several_frames_in_a_row_read():
    raw = shard_tar(1, 30, payload_size=700)
    half = len(raw) // 1024 * 512
    other = zstandard.ZstdCompressor(level=19)  # no checksum, content size in the header
    data = other.compress(raw[:half]) + compress(raw[half:])
    assert members_of(data) == tarfile_members(raw)


def test_skippable_frames_are_passed_over():
    raw = shard_tar(2, 5)
    skippable = b"\x50\x2a\x4d\x18" + (7).to_bytes(4, "little") + b"metadat"
    assert members_of(skippable + compress(raw)) == tarfile_members(raw)


@pytest.mark.parametrize("kept", [0.3, 0.6, 0.95])
def test_a_truncated_zstd_shard_is_a_shard_format_error_naming_it(kept):
    raw = shard_tar(0, 40, payload_size=2000)
    data = compress(raw)
    cut = data[: int(len(data) * kept)]
    with pytest.raises(ShardFormatError) as caught:
        members_of(cut)
    assert caught.value.shard == SHARD
    assert "truncated" in caught.value.reason or "corrupt compressed" in caught.value.reason


def test_a_cut_at_a_frame_boundary_inside_the_tar_is_still_caught_by_the_tar_reader():
    raw = shard_tar(0, 10)
    data = compress(raw[:2048])  # a whole frame, holding the first members only
    assert members_of(data) == tarfile_members(raw)[:2]  # a shorter valid tar, as for .tar


def test_a_stream_cut_inside_its_checksum_is_refused_when_read_to_its_end():
    raw = make_tar([regular("a.txt", b"1")])
    data = compress(raw)[:-2]
    stream = open_shard_stream(io.BytesIO(data), SHARD)
    with pytest.raises((EOFError, *zstd.ZSTD_ERRORS), match="truncated|ended before"):
        stream.read()


def test_damaged_bytes_fail_the_content_checksum():
    raw = shard_tar(0, 30, payload_size=1000)
    data = bytearray(compress(raw))
    data[len(data) // 2] ^= 0xFF
    with pytest.raises(ShardFormatError, match="corrupt compressed stream"):
        members_of(bytes(data))


def test_bytes_that_are_no_zstd_frame_are_refused_by_the_walk():
    walk = zstd.FrameWalk()
    with pytest.raises(zstd.CorruptZstdError, match="no zstd frame"):
        walk.feed(b"PK\x03\x04rest")
    empty = zstd.FrameWalk()
    with pytest.raises(zstd.CorruptZstdError, match="truncated"):
        empty.check_end()


@settings(max_examples=40, deadline=None)
@given(st.binary(max_size=20_000), st.lists(st.integers(1, 5000), max_size=8))
def test_the_walk_ends_on_a_frame_end_however_the_bytes_are_fed(payload, pieces):
    data = compress(payload) + zstandard.ZstdCompressor(level=1).compress(payload[:100])
    walk = zstd.FrameWalk()
    position = 0
    for size in pieces:
        walk.feed(data[position : position + size])
        position += size
    walk.feed(data[position:])
    walk.check_end()
    short = zstd.FrameWalk()
    short.feed(data[:-1])
    with pytest.raises(zstd.CorruptZstdError):
        short.check_end()


def zeros_zstd(size: int) -> bytes:
    """A .tar.zst of one member of ``size`` zero bytes: a decompression bomb."""
    return compressed_zeros(size, zstandard.ZstdCompressor(level=3).compressobj())


def test_a_zstd_bomb_is_refused_after_the_grace_naming_member_and_limit(monkeypatch):
    monkeypatch.setattr(tar, "RATIO_GRACE", 1 << 20)
    monkeypatch.setattr(tar, "READ_PIECE_SIZE", 1 << 20)
    bomb = zeros_zstd(40 << 20)
    assert len(bomb) < (40 << 20) // 1000
    tracemalloc.start()
    try:
        with pytest.raises(ShardFormatError) as caught:
            members_of(bomb)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    error = caught.value
    assert error.shard == SHARD and error.offset == 0
    assert "zstd stream inflates" in error.reason and "'bomb.bin'" in error.reason
    assert "limit of 200x" in error.reason
    assert peak < 6 << 20


def test_the_ratio_limit_can_be_raised_for_zstd(monkeypatch):
    monkeypatch.setattr(tar, "RATIO_GRACE", 1 << 20)
    bomb = zeros_zstd(3 << 20)
    stream = open_shard_stream(io.BytesIO(bomb), SHARD, max_ratio=1_000_000)
    assert [len(member.data) for member in iter_members(stream, SHARD)] == [3 << 20]


def test_without_a_binding_zstd_says_what_to_install(monkeypatch):
    monkeypatch.setattr(zstd, "_STDLIB", None)
    monkeypatch.setattr(zstd, "_ZSTANDARD", None)
    with pytest.raises(ImportError, match=r"fsspec-shards\[zstd\]"):
        zstd.open_reader(io.BytesIO())
    with pytest.raises(ImportError, match=r"fsspec-shards\[zstd\]"):
        zstd.open_writer(io.BytesIO())
