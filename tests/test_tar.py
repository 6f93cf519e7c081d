"""The tar reader: every header form tarfile writes, offsets, resumption and malformed input."""

from __future__ import annotations

import gzip
import io
import os
import random
import subprocess
import sys
import tarfile
import threading
import tracemalloc
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fsspec_shards.errors import ShardFormatError
from fsspec_shards.iteration import tar
from fsspec_shards.iteration.tar import (
    TarMember,
    iter_members,
    open_shard_stream,
    parse_members,
    shard_compression,
)
from tests.shardmaker import compressed_zeros, make_tar, regular, shard_tar, special

FORMATS = {"ustar": tarfile.USTAR_FORMAT, "gnu": tarfile.GNU_FORMAT, "pax": tarfile.PAX_FORMAT}
SHARD = "memory://bucket/shard-0001.tar"


def tarfile_members(raw: bytes) -> list[tuple[str, bytes, int]]:
    """What Python's tarfile (and so webdataset) reads: regular files' names, bytes, offsets."""
    with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as archive:
        return [
            (info.name, archive.extractfile(info).read(), info.offset)
            for info in archive.getmembers()
            if info.isreg()
        ]


def read_all(raw: bytes, shard: str = SHARD, **options) -> list[TarMember]:
    return list(iter_members(io.BytesIO(raw), shard, **options))


def as_tuples(members: list[TarMember]) -> list[tuple[str, bytes, int]]:
    return [(member.name, member.data, member.offset) for member in members]


def rechecksum(header: bytearray) -> bytes:
    """Rewrite a header's checksum field after editing it."""
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\0 " % sum(header)
    return bytes(header)


def header_at(raw: bytes, offset: int) -> bytearray:
    return bytearray(raw[offset : offset + 512])


MIXED_ENTRIES = [
    regular("a.txt", b"hello"),
    regular("a.cls", b"7"),
    regular("b" * 140 + "/long.name.json", b"{}" * 300),
    regular("dir.with.dots/c.seg.png", b"\x89PNG" * 200),
    regular("empty.bin", b""),
    regular("exact.bin", b"x" * 1024),
    special("somedir", tarfile.DIRTYPE),
    special("link.txt", tarfile.SYMTYPE, linkname="target/" + "t" * 150),
    special("hard.txt", tarfile.LNKTYPE, linkname="a.txt"),
    special("fifo", tarfile.FIFOTYPE),
    regular("ünïcode/ключ.txt", "значение".encode()),
    regular("last.bin", b"\0" * 513),
]


@pytest.mark.parametrize("format_name", ["gnu", "pax"])
def test_members_equal_tarfiles_in_gnu_and_pax_formats(format_name):
    raw = make_tar(MIXED_ENTRIES, FORMATS[format_name])
    members = read_all(raw)
    assert as_tuples(members) == tarfile_members(raw)
    assert len(members) == 8


def test_members_equal_tarfiles_in_ustar_format_with_prefix_split_names():
    entries = [
        regular("p" * 90 + "/" + "q" * 60 + "/name.with.dots.txt", b"one"),
        regular("short.txt", b"two"),
        special("d", tarfile.DIRTYPE),
        special("s", tarfile.SYMTYPE, linkname="short.txt"),
    ]
    raw = make_tar(entries, tarfile.USTAR_FORMAT)
    members = read_all(raw)
    assert as_tuples(members) == tarfile_members(raw)
    assert members[0].name == "p" * 90 + "/" + "q" * 60 + "/name.with.dots.txt"


@pytest.mark.parametrize("format_name", FORMATS)
def test_each_member_ends_where_the_next_one_starts(format_name):
    entries = [entry for entry in MIXED_ENTRIES if entry[1] is not None]
    if format_name == "ustar":
        entries = [
            entry for entry in entries if len(entry[0].name) < 100 and entry[0].name.isascii()
        ]
    raw = make_tar(entries, FORMATS[format_name])
    members = read_all(raw)
    assert members[0].offset == 0
    for previous, following in zip(members, members[1:], strict=False):
        assert previous.end == following.offset
    assert raw[members[-1].end :].strip(b"\0") == b""
    assert all(member.end % 512 == 0 for member in members)


def test_long_names_over_100_chars_in_gnu_and_pax_take_their_first_header_offset():
    long_name = "deep/" * 40 + "file.txt"
    for tar_format in (tarfile.GNU_FORMAT, tarfile.PAX_FORMAT):
        raw = make_tar([regular("x.txt", b"1"), regular(long_name, b"payload")], tar_format)
        first, second = read_all(raw)
        assert second.name == long_name
        assert second.offset == first.end == 1024
        assert raw[second.offset + 156 : second.offset + 157] in (b"L", b"x")


def test_long_link_names_do_not_shift_the_following_members():
    entries = [
        special("link", tarfile.SYMTYPE, linkname="l" * 300),
        regular("after.txt", b"data"),
    ]
    for tar_format in (tarfile.GNU_FORMAT, tarfile.PAX_FORMAT):
        raw = make_tar(entries, tar_format)
        assert as_tuples(read_all(raw)) == tarfile_members(raw)


def test_pax_size_record_overrides_the_header_size():
    info, data = regular("big.bin", b"z" * 700)
    info.pax_headers = {"size": "700"}
    raw = make_tar([(info, data), regular("next.txt", b"n")], tarfile.PAX_FORMAT)
    pax_header_offset = 0
    assert raw[156:157] == b"x"
    member_header = header_at(raw, 1024)
    member_header[124:136] = b"00000000000\0"
    raw = raw[:1024] + rechecksum(member_header) + raw[1536:]
    big, following = read_all(raw)
    assert (big.name, big.data, big.offset) == ("big.bin", b"z" * 700, pax_header_offset)
    assert following.name == "next.txt"
    assert as_tuples([big, following]) == tarfile_members(raw)


def test_global_pax_headers_are_read_like_tarfile():
    plain = make_tar([regular("a.txt", b"1"), regular("b.txt", b"2")], pax_headers={"note": "x"})
    assert as_tuples(read_all(plain)) == tarfile_members(plain)
    renaming = make_tar([regular("a.txt", b"1")], pax_headers={"path": "global.txt"})
    assert as_tuples(read_all(renaming)) == tarfile_members(renaming)


def test_base256_size_field_is_decoded():
    raw = bytearray(make_tar([regular("a.bin", b"q" * 600), regular("b.txt", b"b")]))
    header = header_at(raw, 0)
    header[124:136] = b"\x80" + (600).to_bytes(11, "big")
    raw[0:512] = rechecksum(header)
    first, second = read_all(bytes(raw))
    assert (first.name, first.data) == ("a.bin", b"q" * 600)
    assert second.name == "b.txt"


def test_signed_checksum_of_old_tars_is_accepted():
    raw = bytearray(make_tar([regular("é.txt", b"x")], tarfile.USTAR_FORMAT))
    header = header_at(raw, 0)
    signed = sum(byte - 256 if byte >= 128 else byte for byte in header[:148] + header[156:]) + 256
    header[148:156] = b"%06o\0 " % signed
    raw[0:512] = header
    assert [member.name for member in read_all(bytes(raw))] == ["é.txt"]


def test_empty_members_yield_empty_bytes():
    raw = make_tar([regular("e.txt", b""), regular("f.txt", b"")])
    assert [(m.data, m.offset, m.end) for m in read_all(raw)] == [(b"", 0, 512), (b"", 512, 1024)]


def test_v7_directories_and_unknown_types_are_skipped_with_their_data():
    v7_dir, _ = regular("olddir/", b"")
    v7_dir.type = tarfile.AREGTYPE
    unknown, unknown_data = regular("volume", b"v" * 1000)
    unknown.type = b"V"
    raw = make_tar([(v7_dir, b""), (unknown, unknown_data), regular("kept.txt", b"k")])
    assert [member.name for member in read_all(raw)] == ["kept.txt"]
    assert as_tuples(read_all(raw)) == tarfile_members(raw)


def test_contiguous_type_members_are_regular_files():
    info, data = regular("contiguous.txt", b"c")
    info.type = tarfile.CONTTYPE
    assert [member.data for member in read_all(make_tar([(info, data)]))] == [b"c"]


def test_archive_without_end_blocks_ends_at_the_last_member():
    raw = make_tar([regular("a.txt", b"1"), regular("b.txt", b"2")])
    members = read_all(raw)
    assert as_tuples(read_all(raw[: members[-1].end])) == as_tuples(members)


def test_start_offset_resumes_at_a_member_with_absolute_offsets():
    raw = make_tar(MIXED_ENTRIES, tarfile.PAX_FORMAT)
    members = read_all(raw)
    for index, member in enumerate(members):
        stream = io.BytesIO(raw)
        stream.seek(member.offset)
        assert list(iter_members(stream, SHARD, start=member.offset)) == members[index:]


def test_parse_members_of_a_byte_range_reproduces_the_members():
    raw = make_tar(MIXED_ENTRIES, tarfile.GNU_FORMAT)
    members = read_all(raw)
    for first in range(len(members)):
        for last in range(first, len(members)):
            start, end = members[first].offset, members[last].end
            assert parse_members(raw[start:end], SHARD, start) == members[first : last + 1]


def test_members_larger_than_a_read_piece_are_read_in_pieces(monkeypatch):
    monkeypatch.setattr(tar, "READ_PIECE_SIZE", 1000)
    payload = bytes(range(256)) * 20
    raw = make_tar([regular("big.bin", payload), regular("small.txt", b"s")])
    assert [member.data for member in read_all(raw)] == [payload, b"s"]


@pytest.mark.parametrize("name", ["shard.tar.gz", "shard.tar", "shard.tgz"])
def test_gzip_is_detected_by_magic_bytes_whatever_the_name(name):
    raw = make_tar(MIXED_ENTRIES)
    with io.BytesIO(gzip.compress(raw)) as fileobj:
        assert shard_compression(name, fileobj) == "gzip" and fileobj.tell() == 0
        stream = open_shard_stream(fileobj, name)
        assert as_tuples(list(iter_members(stream, name))) == tarfile_members(raw)


def test_plain_tar_on_a_seekable_file_is_seekable_and_can_be_sought(tmp_path):
    raw = make_tar(MIXED_ENTRIES)
    path = tmp_path / "shard.tar"
    path.write_bytes(raw)
    members = read_all(raw)
    with open(path, "rb", buffering=0) as fileobj:
        assert shard_compression(str(path), fileobj) is None
        stream = open_shard_stream(fileobj, str(path))
        assert stream.seekable()
        stream.seek(members[3].offset)
        assert list(iter_members(stream, str(path), members[3].offset)) == members[3:]


class _NonSeekable(io.RawIOBase):
    """A pipe-like stream without peek or seek, as some network files are."""

    def __init__(self, data: bytes) -> None:
        self._source = io.BytesIO(data)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        return self._source.readinto(buffer)


def test_non_seekable_streams_fall_back_to_the_name_for_gzip():
    raw = make_tar([regular("a.txt", b"1")])
    assert shard_compression("x.tar", _NonSeekable(gzip.compress(raw))) is None
    assert shard_compression("x.tar.gz?sig=1", _NonSeekable(raw)) == "gzip"
    assert shard_compression("x.tar.zst?sig=1", _NonSeekable(raw)) == "zstd"
    stream = open_shard_stream(_NonSeekable(gzip.compress(raw)), "x.tar.gz")
    assert [member.name for member in iter_members(stream, "x.tar.gz")] == ["a.txt"]


# Malformed tars: each raises ShardFormatError at the offset of the damage.

GOOD = make_tar([regular("a.txt", b"A" * 100), regular("b.txt", b"B" * 700)], tarfile.USTAR_FORMAT)
SECOND_HEADER = 1024  # a.txt: one header block and one data block


def failure(raw: bytes, shard: str = SHARD, **options) -> ShardFormatError:
    with pytest.raises(ShardFormatError) as caught:
        read_all(raw, shard, **options)
    return caught.value


def test_bad_header_checksum_raises_at_that_header():
    raw = bytearray(GOOD)
    raw[SECOND_HEADER + 3] ^= 0x01
    error = failure(bytes(raw))
    assert (error.offset, error.reason) == (SECOND_HEADER, "bad header checksum")


def test_truncated_member_raises_at_the_member_header():
    error = failure(GOOD[: SECOND_HEADER + 512 + 300])
    assert error.offset == SECOND_HEADER
    assert "truncated member" in error.reason


def test_eof_inside_padding_raises_at_the_member_header():
    error = failure(GOOD[: SECOND_HEADER + 512 + 700 + 10])
    assert error.offset == SECOND_HEADER
    assert "padding" in error.reason


def test_truncated_header_raises_at_that_header():
    error = failure(GOOD[: SECOND_HEADER + 200])
    assert error.offset == SECOND_HEADER
    assert "truncated header" in error.reason


def test_garbage_raises_at_offset_zero():
    error = failure(b"this is not a tar archive at all" * 40)
    assert error.offset == 0


def test_invalid_octal_number_raises():
    header = header_at(GOOD, SECOND_HEADER)
    header[124:136] = b"0000000009z\0"
    raw = GOOD[:SECOND_HEADER] + rechecksum(header) + GOOD[SECOND_HEADER + 512 :]
    assert failure(raw).offset == SECOND_HEADER


def test_absurd_size_raises_before_reading():
    header = header_at(GOOD, SECOND_HEADER)
    header[124:136] = b"\x80" + (1 << 50).to_bytes(11, "big")
    raw = GOOD[:SECOND_HEADER] + rechecksum(header) + GOOD[SECOND_HEADER + 512 :]
    error = failure(raw)
    assert error.offset == SECOND_HEADER
    assert "exceeds limit" in error.reason


def test_size_beyond_max_member_size_option_raises_naming_the_member_and_the_limit():
    error = failure(GOOD, max_member_size=500)
    assert error.offset == SECOND_HEADER
    assert "'b.txt'" in error.reason and "exceeds limit 500 (max_member_size)" in error.reason


def test_default_member_limit_is_one_gib():
    header = header_at(GOOD, SECOND_HEADER)
    header[124:136] = b"%011o\0" % ((1 << 30) + 1)
    raw = GOOD[:SECOND_HEADER] + rechecksum(header) + GOOD[SECOND_HEADER + 512 :]
    error = failure(raw)
    assert tar.DEFAULT_MAX_MEMBER_SIZE == 1 << 30
    assert (error.offset, f"exceeds limit {1 << 30}" in error.reason) == (SECOND_HEADER, True)


def test_unknown_type_members_beyond_max_member_size_raise_too():
    unknown, data = regular("volume", b"v" * 1000)
    unknown.type = b"V"
    error = failure(make_tar([(unknown, data)]), max_member_size=999)
    assert "'volume'" in error.reason and "exceeds limit 999" in error.reason


def test_negative_base256_size_raises():
    header = header_at(GOOD, 0)
    header[124:136] = b"\xff" * 12
    assert "negative size" in failure(rechecksum(header) + GOOD[512:]).reason


def test_huge_declared_size_on_a_short_stream_fails_without_allocating_it(tmp_path):
    header = header_at(GOOD, 0)
    header[124:136] = b"\x80" + (1 << 39).to_bytes(11, "big")
    path = tmp_path / "short.tar"
    path.write_bytes(rechecksum(header) + b"x" * 10_000)
    tracemalloc.start()
    try:
        with open(path, "rb", buffering=0) as fileobj, pytest.raises(ShardFormatError) as caught:
            stream = open_shard_stream(fileobj, str(path))
            list(iter_members(stream, str(path), max_member_size=1 << 40))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert caught.value.offset == 0
    assert "truncated member" in caught.value.reason
    assert peak < 4 * tar.READ_PIECE_SIZE


def test_a_size_beyond_the_end_of_a_long_shard_fails_without_reading_the_rest(tmp_path):
    header = bytearray(make_tar([regular("a.bin", b"")])[:512])
    header[124:136] = b"\x80" + (1 << 39).to_bytes(11, "big")
    path = tmp_path / "long.tar"
    path.write_bytes(rechecksum(header) + b"x" * (5 * tar.READ_PIECE_SIZE))
    tracemalloc.start()
    try:
        with open(path, "rb") as fileobj, pytest.raises(ShardFormatError) as caught:
            stream = open_shard_stream(fileobj, str(path))
            list(iter_members(stream, str(path), max_member_size=1 << 40))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert caught.value.offset == 0
    assert f"got {5 * tar.READ_PIECE_SIZE}" in caught.value.reason
    assert peak < tar.READ_PIECE_SIZE


def test_extended_header_at_the_end_raises():
    long_name = make_tar([regular("n" * 200 + ".txt", b"x")], tarfile.GNU_FORMAT)
    error = failure(long_name[:1024])
    assert (error.offset, error.reason) == (0, "archive ends after an extended header")
    error = failure(long_name[:1024] + bytes(1024))
    assert error.offset == 0


def test_malformed_pax_record_raises():
    raw = bytearray(make_tar([regular("p" * 120 + ".txt", b"x")], tarfile.PAX_FORMAT))
    record_start = 512
    assert raw[record_start : record_start + 3].isdigit()
    raw[record_start : record_start + 3] = b"999"
    assert "pax record" in failure(bytes(raw)).reason


def test_gnu_sparse_members_are_rejected():
    header = header_at(GOOD, 0)
    header[156:157] = b"S"
    assert "sparse" in failure(rechecksum(header) + GOOD[512:]).reason


def test_corrupt_gzip_raises_shard_format_error():
    compressed = gzip.compress(GOOD)
    with pytest.raises(ShardFormatError, match="compressed"):
        list(iter_members(open_shard_stream(io.BytesIO(compressed[:-30]), "x.tar.gz"), "x"))


def test_error_names_the_shard_without_its_secrets():
    error = failure(b"garbage" * 100, shard="https://host/shard.tar?X-Amz-Signature=s3cr3t")
    assert "https://host/shard.tar" in str(error)
    assert "s3cr3t" not in str(error)


# Property-based fuzzing: damaged tars yield members and/or raise ShardFormatError, nothing else.

FUZZ_BASE = make_tar(
    [
        regular("a.txt", b"alpha" * 30),
        regular("n" * 130 + ".bin", b"\x01" * 600),
        special("dir", tarfile.DIRTYPE),
        regular("z.json", b"{}"),
    ],
    tarfile.GNU_FORMAT,
) + make_tar([regular("p" * 150 + ".cls", b"3")], tarfile.PAX_FORMAT)


def _consume(raw: bytes) -> None:
    try:
        for member in iter_members(io.BytesIO(raw), SHARD, max_member_size=1 << 20):
            assert member.end - member.offset >= 512 + len(member.data)
    except ShardFormatError as error:
        assert 0 <= error.offset <= len(raw)


FUZZ_SETTINGS = settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@FUZZ_SETTINGS
@given(cut=st.integers(min_value=0, max_value=len(FUZZ_BASE)))
def test_fuzz_truncation_yields_members_or_shard_format_error(cut):
    _consume(FUZZ_BASE[:cut])


@FUZZ_SETTINGS
@given(
    flips=st.lists(
        st.tuples(st.integers(0, len(FUZZ_BASE) - 1), st.integers(1, 255)), min_size=1, max_size=6
    ),
    fix_checksums=st.booleans(),
)
def test_fuzz_byte_flips_yield_members_or_shard_format_error(flips, fix_checksums):
    raw = bytearray(FUZZ_BASE)
    for position, mask in flips:
        raw[position] ^= mask
    if fix_checksums:
        for offset in range(0, len(raw), 512):
            block = bytearray(raw[offset : offset + 512])
            if block[257:262] == b"ustar":
                raw[offset : offset + 512] = rechecksum(block)
    _consume(bytes(raw))


@FUZZ_SETTINGS
@given(garbage=st.binary(min_size=0, max_size=3000), at=st.integers(0, len(FUZZ_BASE)))
def test_fuzz_garbage_yields_members_or_shard_format_error(garbage, at):
    _consume(FUZZ_BASE[:at] + garbage)
    _consume(garbage)


class _ShortReads:
    """A file-like object with only read(), returning at most 7 bytes per call."""

    def __init__(self, data: bytes) -> None:
        self._source = io.BytesIO(data)

    def read(self, size: int = -1) -> bytes:
        return self._source.read(min(size, 7) if size >= 0 else size)

    def seekable(self) -> bool:
        return False


@pytest.mark.parametrize("compress", [False, True])
def test_objects_with_only_short_reads_are_read_completely(compress):
    raw = make_tar(MIXED_ENTRIES)
    name = "s.tar.gz" if compress else "s.tar"
    stream = open_shard_stream(_ShortReads(gzip.compress(raw) if compress else raw), name)
    assert as_tuples(list(iter_members(stream, name))) == tarfile_members(raw)


def without_data(members: list[TarMember]) -> list[TarMember]:
    return [TarMember(member.name, b"", member.offset, member.end) for member in members]


@pytest.mark.parametrize("compress", [False, True])
def test_header_only_scan_gives_the_same_names_and_offsets(compress):
    raw = make_tar(MIXED_ENTRIES, tarfile.GNU_FORMAT)
    fileobj = io.BytesIO(gzip.compress(raw) if compress else raw)
    stream = open_shard_stream(fileobj, "s.tar")
    scanned = list(iter_members(stream, "s.tar", read_data=False))
    assert scanned == without_data(read_all(raw))


@pytest.mark.parametrize("compress", [False, True])
def test_header_only_scan_detects_a_truncated_last_member(compress, tmp_path):
    raw = make_tar([regular("a.txt", b"a"), regular("b.bin", b"b" * 5000)])
    cut = raw[: 1024 + 512 + 3000]
    path = tmp_path / "cut.tar"
    path.write_bytes(gzip.compress(cut) if compress else cut)
    with open(path, "rb") as fileobj, pytest.raises(ShardFormatError) as caught:
        list(iter_members(open_shard_stream(fileobj, str(path)), str(path), read_data=False))
    assert caught.value.offset == 1024
    assert "truncated member" in caught.value.reason


@pytest.mark.parametrize("compress", [False, True])
def test_header_only_scan_stops_before_a_truncated_member_as_the_full_read_does(compress, tmp_path):
    raw = make_tar([regular("a.txt", b"a"), regular("b.bin", b"b" * 5000), regular("c.txt", b"c")])
    cut = raw[: 1024 + 512 + 3000]
    path = tmp_path / "cut.tar"
    path.write_bytes(gzip.compress(cut) if compress else cut)
    yielded = {}
    for read_data in (True, False):
        yielded[read_data] = []
        with open(path, "rb") as fileobj, pytest.raises(ShardFormatError) as caught:
            stream = open_shard_stream(fileobj, str(path))
            for member in iter_members(stream, str(path), read_data=read_data):
                yielded[read_data].append((member.name, member.offset))
        assert caught.value.offset == 1024
    assert yielded[False] == yielded[True] == [("a.txt", 0)]


def scan_until_error(path, read_data: bool) -> tuple[list[tuple[str, int]], int | None]:
    """The members read from the shard at ``path`` until it fails, and the failure's offset."""
    members = []
    with open(path, "rb") as fileobj:
        try:
            for member in iter_members(
                open_shard_stream(fileobj, str(path)), str(path), 0, read_data=read_data
            ):
                members.append((member.name, member.offset))
        except ShardFormatError as error:
            return members, error.offset
    return members, None


def test_header_only_scan_of_a_damaged_gzip_shard_fails_where_the_full_read_does(tmp_path):
    compressed = gzip.compress(shard_tar(0, 60, payload_size=9000), mtime=0)
    path = tmp_path / "damaged.tar.gz"
    for position in range(200, len(compressed) - 8, 97):
        damaged = bytearray(compressed)
        damaged[position] ^= 0xFF
        path.write_bytes(bytes(damaged))
        full = scan_until_error(path, read_data=True)
        assert scan_until_error(path, read_data=False) == full, f"damage at {position}"


def test_header_only_scan_from_an_offset_on_a_seekable_file(tmp_path):
    raw = make_tar(MIXED_ENTRIES, tarfile.PAX_FORMAT)
    members = read_all(raw)
    path = tmp_path / "s.tar"
    path.write_bytes(raw)
    with open(path, "rb") as fileobj:
        stream = open_shard_stream(fileobj, str(path))
        stream.seek(members[2].offset)
        scanned = list(iter_members(stream, "s", members[2].offset, read_data=False))
    assert scanned == without_data(members[2:])


FUZZ_GZIP = gzip.compress(FUZZ_BASE, mtime=0)


@FUZZ_SETTINGS
@given(
    flips=st.lists(
        st.tuples(st.integers(0, len(FUZZ_GZIP) - 1), st.integers(1, 255)), min_size=1, max_size=4
    ),
    cut=st.integers(0, len(FUZZ_GZIP)),
)
def test_fuzz_damaged_gzip_yields_members_or_shard_format_error(flips, cut):
    raw = bytearray(FUZZ_GZIP[:cut])
    for position, mask in flips:
        if position < len(raw):
            raw[position] ^= mask
    try:
        for _ in iter_members(open_shard_stream(io.BytesIO(bytes(raw)), "f.tar.gz"), "f.tar.gz"):
            pass
    except ShardFormatError as error:
        assert error.offset >= 0


def test_memory_stays_bounded_by_a_member_not_the_shard(tmp_path):
    member_size = 100_000
    path = tmp_path / "many.tar"
    path.write_bytes(
        make_tar([regular(f"m{index:04d}.bin", b"m" * member_size) for index in range(150)])
    )
    assert path.stat().st_size > 15_000_000
    tracemalloc.start()
    try:
        with open(path, "rb", buffering=0) as fileobj:
            count = sum(1 for _ in iter_members(open_shard_stream(fileobj, str(path)), str(path)))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert count == 150
    assert peak < tar.STREAM_BUFFER_SIZE + 4 * member_size


# Hostile input: empty shards and decompression bombs are refused before memory is spent.


@pytest.mark.parametrize("compress", [False, True])
def test_an_empty_shard_is_a_shard_format_error(compress, tmp_path):
    path = tmp_path / ("empty.tar.gz" if compress else "empty.tar")
    path.write_bytes(gzip.compress(b"") if compress else b"")
    with open(path, "rb") as fileobj, pytest.raises(ShardFormatError) as caught:
        list(iter_members(open_shard_stream(fileobj, str(path)), str(path)))
    assert caught.value.offset == 0
    assert "empty shard" in caught.value.reason and str(path) in str(caught.value)


def test_an_archive_of_end_blocks_only_is_empty_but_valid():
    assert read_all(make_tar([])) == []


def test_reading_from_the_end_of_a_shard_yields_nothing_without_error():
    raw = make_tar([regular("a.txt", b"1")])
    end = read_all(raw)[-1].end
    assert list(iter_members(io.BytesIO(raw[end:]), SHARD, start=end)) == []
    assert list(iter_members(io.BytesIO(b""), SHARD, start=end)) == []


def zeros_gzip(size: int) -> bytes:
    """A gzip'd tar holding one member of ``size`` zero bytes: compresses about 1000x."""
    return compressed_zeros(size, zlib.compressobj(9, zlib.DEFLATED, 31))


def test_a_gzip_bomb_is_refused_after_the_grace_naming_member_and_limit(monkeypatch):
    monkeypatch.setattr(tar, "RATIO_GRACE", 1 << 20)
    monkeypatch.setattr(tar, "READ_PIECE_SIZE", 1 << 20)
    bomb = zeros_gzip(40 << 20)
    assert len(bomb) < (40 << 20) // 500
    tracemalloc.start()
    try:
        with pytest.raises(ShardFormatError) as caught:
            list(iter_members(open_shard_stream(io.BytesIO(bomb), SHARD), SHARD))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    error = caught.value
    assert error.offset == 0
    assert "'bomb.bin'" in error.reason and "limit of 200x" in error.reason
    assert peak < 6 << 20


def test_the_gzip_ratio_limit_can_be_raised(monkeypatch):
    monkeypatch.setattr(tar, "RATIO_GRACE", 1 << 20)
    bomb = zeros_gzip(3 << 20)
    with pytest.raises(ShardFormatError, match="limit of 200x"):
        list(iter_members(open_shard_stream(io.BytesIO(bomb), SHARD), SHARD))
    stream = open_shard_stream(io.BytesIO(bomb), SHARD, max_ratio=100_000)
    assert [len(member.data) for member in iter_members(stream, SHARD)] == [3 << 20]


def test_gzip_within_the_ratio_reads_whole_past_the_grace(monkeypatch):
    monkeypatch.setattr(tar, "RATIO_GRACE", 1 << 16)
    payload = bytes(random.Random(0).choices(b"abcdefgh", k=1 << 20))
    raw = make_tar([regular("a.bin", payload), regular("b.txt", b"b")])
    stream = open_shard_stream(io.BytesIO(gzip.compress(raw)), SHARD)
    assert as_tuples(list(iter_members(stream, SHARD))) == tarfile_members(raw)


def test_a_member_over_max_member_size_in_a_gzip_stream_fails_on_its_header():
    bomb = zeros_gzip(8 << 20)
    tracemalloc.start()
    try:
        with pytest.raises(ShardFormatError, match="exceeds limit 1048576") as caught:
            stream = open_shard_stream(io.BytesIO(bomb), SHARD)
            list(iter_members(stream, SHARD, max_member_size=1 << 20))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert caught.value.offset == 0
    assert peak < 1 << 20


# The bomb of issue 11 (a ~611 KB .tar.gz holding one 600 MiB member), end to end in fresh
# processes: the peak resident memory may grow by less than 300 MB while it is refused.

BOMB_SIZE = 600 << 20
RSS_GROWTH_LIMIT = 300_000_000
CHILD_TIMEOUT = 300


@pytest.fixture(scope="module")
def bomb_and_decoy(tmp_path_factory) -> tuple[Path, Path]:
    """The bomb, and a small good .tar.gz that the same commands read as a baseline."""
    directory = tmp_path_factory.mktemp("bomb")
    bomb = directory / "bomb.tar.gz"
    bomb.write_bytes(zeros_gzip(BOMB_SIZE))
    decoy = directory / "decoy.tar.gz"
    decoy.write_bytes(gzip.compress(shard_tar(0, 10), mtime=0))
    return bomb, decoy


def run_measured(command: list[str], workdir: Path) -> tuple[int, str, int]:
    """Run ``command``; its exit status, standard error and peak resident memory in bytes.

    Killed after ``CHILD_TIMEOUT`` seconds, so that a hang fails the test instead of the run.
    """
    with open(workdir / "out", "wb") as out, open(workdir / "err", "wb") as err:
        env = dict(os.environ, FSSPEC_SHARDS_CACHE=str(workdir / "cache"))
        process = subprocess.Popen(command, stdout=out, stderr=err, env=env)
        watchdog = threading.Timer(CHILD_TIMEOUT, process.kill)
        watchdog.start()
        try:
            _, status, usage = os.wait4(process.pid, 0)
        finally:
            watchdog.cancel()
        process.returncode = os.waitstatus_to_exitcode(status)
    return process.returncode, (workdir / "err").read_text(), usage.ru_maxrss * 1024


READ_WITH_DATASET = """
import sys
from fsspec_shards import ShardDataset, ShardFormatError

try:
    for _ in ShardDataset([sys.argv[1]], shuffle_shards=False, split_by_node=False):
        pass
except ShardFormatError as error:
    sys.exit(str(error))
"""


def test_the_bomb_in_shard_dataset_is_refused_within_300_mb(bomb_and_decoy, tmp_path):
    bomb, decoy = bomb_and_decoy
    command = [sys.executable, "-c", READ_WITH_DATASET]
    code, _, baseline = run_measured([*command, str(decoy)], tmp_path)
    assert code == 0
    code, error, peak = run_measured([*command, str(bomb)], tmp_path)
    assert code == 1
    assert "bomb.tar.gz" in error and "'bomb.bin'" in error and "limit of 200x" in error
    assert peak - baseline < RSS_GROWTH_LIMIT, f"grew {peak - baseline} bytes"


def test_the_bomb_in_cli_verify_is_refused_within_300_mb(bomb_and_decoy, tmp_path):
    bomb, decoy = bomb_and_decoy
    command = [sys.executable, "-m", "fsspec_shards", "verify"]
    code, _, baseline = run_measured([*command, str(decoy)], tmp_path)
    assert code == 0
    code, error, peak = run_measured([*command, str(bomb)], tmp_path)
    assert code != 0
    assert "'bomb.bin'" in (tmp_path / "out").read_text() + error
    assert peak - baseline < RSS_GROWTH_LIMIT, f"grew {peak - baseline} bytes"
