"""A fast, strict, streaming tar reader for webdataset shards.

Reads 512-byte headers straight from a buffered stream and slices their fields, which is
several times faster than :mod:`tarfile`. Member names follow :mod:`tarfile`'s rules
(ustar prefix, GNU long names, pax ``path``/``size`` records, global pax headers), so the
members equal what webdataset sees. Unlike :mod:`tarfile` in stream mode, which stops
silently at a damaged header, every malformation raises
:class:`~fsspec_shards.errors.ShardFormatError` with the byte offset of the damage.
Memory stays bounded by the member being read: data is read in bounded pieces, so a
header that claims a huge size on a short stream fails at truncation without allocating it.
Hostile input is refused before memory is spent: an empty (0-byte) shard, a member larger
than ``max_member_size`` (default 1 GiB, checked on its header) and a gzip or zstd stream
that inflates more than ``MAX_RATIO`` times its compressed size once past its first
``RATIO_GRACE`` bytes (a decompression bomb) all raise ShardFormatError.
"""

from __future__ import annotations

import gzip
import io
import logging
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO, NoReturn

from fsspec_shards import tar_blocks
from fsspec_shards.config import DEFAULT_MAX_MEMBER_SIZE
from fsspec_shards.errors import ShardFormatError
from fsspec_shards.iteration.zstd import (
    ZSTD_ERRORS,
    ZSTD_SUFFIXES,
    FrameWalk,
    open_reader,
    starts_zstd,
)
from fsspec_shards.redact import redact_url
from fsspec_shards.tar_blocks import BLOCK_SIZE

logger = logging.getLogger("fsspec_shards.tar")

MAX_RATIO = 200
RATIO_GRACE = 64 << 20
GUARDED_READ_SIZE = 1 << 20
STREAM_BUFFER_SIZE = 128 << 10
READ_PIECE_SIZE = 16 << 20
SMALL_MEMBER_SIZE = 64 << 10
MAX_EXTENDED_HEADER_SIZE = 8 << 20
GZIP_MAGIC = b"\x1f\x8b"
GZIP_SUFFIXES = (".gz", ".tgz")

_ZERO_BLOCK = bytes(BLOCK_SIZE)
_REGULAR_TYPES = frozenset((b"0", b"\0", b"7"))
# Regular types the fast loop takes: NUL is left out, as it may mark an old V7 directory.
_PLAIN_REGULAR_TYPES = frozenset((b"0", b"7"))
# Types that tarfile knows and treats as having no data blocks, whatever their size field says.
_DATALESS_TYPES = frozenset((b"1", b"2", b"3", b"4", b"5", b"6"))
_PAX_LOCAL_TYPES = frozenset((b"x", b"X"))
_EXTENDED_TYPES = frozenset((b"L", b"K", b"g")) | _PAX_LOCAL_TYPES
# What a damaged gzip or zstd stream raises while it is read (the reader turns them into
# ShardFormatError).
COMPRESSED_STREAM_ERRORS = (EOFError, zlib.error, gzip.BadGzipFile, *ZSTD_ERRORS)


@dataclass(slots=True)
class TarMember:
    """One regular file of a tar: its full name, its bytes and where it lies in the tar."""

    name: str
    data: bytes
    offset: int
    end: int


def _number(field: bytes) -> int:
    """Decode a numeric header field as tarfile does: GNU base-256, else octal up to a NUL."""
    lead = field[0]
    if lead == 0x80:
        return int.from_bytes(field[1:], "big")
    if lead == 0xFF:
        return int.from_bytes(field[1:], "big") - (1 << (8 * (len(field) - 1)))
    nul = field.find(0)
    if nul >= 0:
        field = field[:nul]
    return int(field.strip() or b"0", 8)


def _strict_numbers(header: bytes, shard: str, offset: int) -> tuple[int, int]:
    """The size and checksum fields by tarfile's full rules, or ShardFormatError."""
    try:
        return _number(header[124:136]), _number(header[148:156])
    except ValueError as exc:
        raise ShardFormatError(shard, offset, f"invalid number field: {exc}") from None


def _signed_checksum_ok(header: bytes, declared: int, unsigned: int) -> bool:
    """Old Sun/NeXT tars summed the header as signed chars; tarfile accepts that too.

    ``unsigned`` is the POSIX sum: every byte but the checksum field, which counts as
    8 spaces (256). It is computed in the reader with adler32 over pieces of at most
    256 bytes, where the low half of adler32 is exactly 1 + the byte sum.
    """
    high_bytes = sum(1 for i, byte in enumerate(header) if byte >= 0x80 and not 148 <= i < 156)
    return declared == unsigned - 256 * high_bytes


def _raise_truncated(shard: str, offset: int, data_start: int, size: int, got: int) -> NoReturn:
    if got < size:
        reason = f"truncated member: {size} data bytes declared at {data_start}, got {got}"
    else:
        reason = f"stream ends inside padding after the data at {data_start}"
    raise ShardFormatError(shard, offset, reason)


def _raise_too_large(shard: str, offset: int, name: str, size: int, limit: int) -> NoReturn:
    raise ShardFormatError(
        shard, offset, f"member {name!r} size {size} exceeds limit {limit} (max_member_size)"
    )


def _header_name(header: bytes) -> str:
    """The name in a header's own fields: the name, behind the ustar prefix if there is one."""
    nul = header.find(0, 0, 100)
    name = header[: nul if nul >= 0 else 100].decode("utf-8", "surrogateescape")
    if header[345] != 0:
        name = _name_field(header[345:500]) + "/" + name
    return name


def _name_field(raw: bytes) -> str:
    nul = raw.find(0)
    if nul >= 0:
        raw = raw[:nul]
    return raw.decode("utf-8", "surrogateescape")


def _parse_pax_records(payload: bytes, shard: str, offset: int) -> dict[str, str]:
    """Parse ``"<len> <keyword>=<value>\\n"`` records of a pax extended header."""
    records: dict[str, str] = {}
    pos = 0
    end = len(payload)
    while pos < end and payload[pos] != 0:
        space = payload.find(b" ", pos, pos + 24)
        length_text = payload[pos:space] if space > pos else b""
        if not length_text.isdigit():
            raise ShardFormatError(shard, offset, "malformed pax record length")
        length = int(length_text)
        record_end = pos + length
        if length <= len(length_text) + 1 or record_end > end or payload[record_end - 1] != 0x0A:
            raise ShardFormatError(shard, offset, "malformed pax record")
        keyword, sep, value = payload[space + 1 : record_end - 1].partition(b"=")
        if not sep:
            raise ShardFormatError(shard, offset, "pax record without '='")
        records[keyword.decode("utf-8", "surrogateescape")] = value.decode(
            "utf-8", "surrogateescape"
        )
        pos = record_end
    if any(key.startswith("GNU.sparse.") for key in records):
        raise ShardFormatError(shard, offset, "sparse members are not supported")
    return records


def _pax_size(records: dict[str, str], shard: str, offset: int) -> int | None:
    text = records.get("size")
    if text is None:
        return None
    if not text.isdigit():
        raise ShardFormatError(shard, offset, f"invalid pax size {text[:40]!r}")
    return int(text)


def iter_members(
    stream: BinaryIO,
    shard: str,
    start: int = 0,
    read_data: bool = True,
    *,
    max_member_size: int = DEFAULT_MAX_MEMBER_SIZE,
) -> Iterator[TarMember]:
    """Yield the regular files of the tar read from ``stream``, in archive order.

    ``stream`` is positioned at uncompressed offset ``start``, a header boundary (pass the
    result of :func:`open_shard_stream`). Offsets reported are absolute in the uncompressed
    tar. Directories, links, devices and unknown types are skipped, as tarfile/webdataset
    do. Iteration ends at the first all-zero block or at end of stream on a block boundary;
    anything else malformed raises :class:`ShardFormatError`, as do an empty stream read from
    ``start=0`` and a member larger than ``max_member_size`` (told by its header, before
    any of its data is read).

    With ``read_data=False`` members come with empty data and their payloads are sought
    over: a fast scan of names and offsets. A stream that cannot seek, or decompresses, is
    read exactly as with data, so that a damaged shard fails at the same member either way.

    The loop below handles the common case inline: a small regular member with no extended
    header pending (or, in a header scan, any such member, sought over). Everything else
    goes to the named helpers of :class:`_Entries`.
    """
    entries = _Entries(stream, shard, start, read_data, max_member_size)
    read = stream.read
    adler32 = zlib.adler32
    small = min(SMALL_MEMBER_SIZE, max_member_size) if read_data else -1  # else: rare path
    sought = max_member_size if entries.seek_over else -1  # a header scan seeks over data
    plain = True  # no extended header pending: the next regular member is named by its header
    position = start
    parsed = -1  # the offset of the last header parsed: tells what a decompression bomb hit
    round_up, align = BLOCK_SIZE - 1, -BLOCK_SIZE  # tar_blocks.padded in locals: hottest loop
    try:
        while True:
            header = read(BLOCK_SIZE)
            if len(header) != BLOCK_SIZE or header == _ZERO_BLOCK:
                header = entries.short_or_zero_block(header, position)
                if header is None:
                    return
            try:
                size = int(header[124:135], 8) if header[135] == 0 else _number(header[124:136])
                declared = int(header[148:154], 8) if header[154] == 0 else _number(header[148:156])
            except ValueError:
                size, declared = _strict_numbers(header, shard, position)
            unsigned = (
                (adler32(header[:148]) & 0xFFFF)
                + (adler32(header[156:400]) & 0xFFFF)
                + (adler32(header[400:]) & 0xFFFF)
                + 253
            )
            if declared != unsigned and not _signed_checksum_ok(header, declared, unsigned):
                raise ShardFormatError(shard, position, "bad header checksum")
            parsed = position
            kind = header[156:157]
            if plain and 0 <= size <= small and kind in _PLAIN_REGULAR_TYPES:
                # One read for data and padding: small members dominate the call count.
                padded = (size + round_up) & align
                data = read(padded)
                if len(data) != padded:
                    data = entries.rest_of_small_member(data, position, size)
                nul = header.find(0, 0, 100)
                name = header[: nul if nul >= 0 else 100].decode("utf-8", "surrogateescape")
                if header[345] != 0:
                    name = _name_field(header[345:500]) + "/" + name
                end = position + BLOCK_SIZE + padded
                yield TarMember(name, data if padded == size else data[:size], position, end)
                position = end
                continue
            if plain and 0 <= size <= sought and kind in _PLAIN_REGULAR_TYPES:
                member = entries.sought_member(header, position, size)
                position = member.end
                yield member
                continue
            position, member = entries.other_entry(header, position, size, kind)
            plain = entries.plain
            if member is not None:
                yield member
    except GeneratorExit:  # first: at interpreter exit the names below may be gone
        raise
    except COMPRESSED_STREAM_ERRORS as exc:
        failure = ShardFormatError(shard, position, f"corrupt compressed stream: {exc}")
    except DecompressionBombError as exc:
        failure = entries.bomb_failure(exc, position, header if parsed == position else None)
    # Only a caught error gets here; raised outside the except block, it carries no chain.
    raise failure


class _Entries:
    """The rare cases of a tar scan, and the state they share across headers.

    That state is what extended headers (GNU long names, pax records) leave pending for the
    member they precede, the global pax name, the limits, and how payloads are passed over
    (read, or sought when only headers are wanted on a plain seekable stream).
    """

    __slots__ = (
        "global_name",
        "long_name",
        "max_member_size",
        "member_offset",
        "pax_name",
        "pax_size",
        "plain",
        "read",
        "read_data",
        "seek_over",
        "shard",
        "stream",
        "tar_end",
    )

    def __init__(
        self, stream: BinaryIO, shard: str, start: int, read_data: bool, max_member_size: int
    ) -> None:
        self.stream = stream
        self.read = stream.read
        self.shard = shard
        self.read_data = read_data
        self.max_member_size = max_member_size
        self.seek_over = not read_data and _seekable(stream) and not _decompressing(stream)
        self.tar_end = 0
        if self.seek_over:
            # Where the tar ends, in tar offsets: a member past it is cut short and must fail
            # before it is yielded, as it does when its data is read.
            stream_start = stream.tell()
            self.tar_end = start + stream.seek(0, io.SEEK_END) - stream_start
            stream.seek(stream_start)
        self.member_offset: int | None = None
        self.long_name: str | None = None
        self.pax_name: str | None = None
        self.pax_size: int | None = None
        self.global_name: str | None = None
        self.plain = True

    def short_or_zero_block(self, block: bytes, offset: int) -> bytes | None:
        """A short read or an all-zero block at ``offset``: the header, or None at the end."""
        if len(block) != BLOCK_SIZE:
            if block:
                block += _read_exactly(self.read, BLOCK_SIZE - len(block))
            elif offset == 0:
                raise ShardFormatError(self.shard, 0, "empty shard: no tar data (0 bytes)")
            if block and len(block) != BLOCK_SIZE:
                reason = f"truncated header ({len(block)} of {BLOCK_SIZE} bytes)"
                raise ShardFormatError(self.shard, offset, reason)
            if block and block != _ZERO_BLOCK:
                return block
        if self.member_offset is not None:
            raise ShardFormatError(
                self.shard, self.member_offset, "archive ends after an extended header"
            )
        return None

    def rest_of_small_member(self, data: bytes, offset: int, size: int) -> bytes:
        """Complete a small member's data and padding from a short read, or raise."""
        padded = tar_blocks.padded(size)
        data += _read_exactly(self.read, padded - len(data))
        if len(data) != padded:
            _raise_truncated(self.shard, offset, offset + BLOCK_SIZE, size, len(data))
        return data

    def sought_member(self, header: bytes, offset: int, size: int) -> TarMember:
        """A plain regular member of a header scan on a seekable stream: its data sought over."""
        data_start = offset + BLOCK_SIZE
        padded = tar_blocks.padded(size)
        if data_start + padded > self.tar_end:
            self.member_offset = offset
            self._truncated(data_start, size, max(self.tar_end - data_start, 0))
        self.stream.seek(padded, io.SEEK_CUR)
        nul = header.find(0, 0, 100)
        name = header[: nul if nul >= 0 else 100].decode("utf-8", "surrogateescape")
        if header[345] != 0:
            name = _name_field(header[345:500]) + "/" + name
        return TarMember(name, b"", offset, data_start + padded)

    def other_entry(
        self, header: bytes, offset: int, size: int, kind: bytes
    ) -> tuple[int, TarMember | None]:
        """Any entry but a small regular member with nothing pending: (its end, a member)."""
        if size < 0:
            raise ShardFormatError(self.shard, offset, f"negative size {size}")
        if self.member_offset is None:
            self.member_offset = offset
        if kind == b"\0" and header[:100].split(b"\0", 1)[0].endswith(b"/"):
            kind = b"5"  # an old V7 directory: a regular-file type with a trailing slash
        if kind in _REGULAR_TYPES:
            return self._regular_member(header, offset, size)
        if kind in _DATALESS_TYPES:
            self._member_done()
            return offset + BLOCK_SIZE, None
        if kind == b"S":
            raise ShardFormatError(self.shard, offset, "sparse members are not supported")
        if kind in _EXTENDED_TYPES:
            return self._extended_header(offset, size, kind), None
        return self._unknown_type(header, offset, size), None

    def _regular_member(self, header: bytes, offset: int, size: int) -> tuple[int, TarMember]:
        """A regular member that is large, named by extended headers, or not to be read."""
        if self.pax_size is not None:
            size = self.pax_size
        name = self._name(header)
        if size > self.max_member_size:
            _raise_too_large(self.shard, offset, name, size, self.max_member_size)
        data_start = offset + BLOCK_SIZE
        if self.seek_over:
            data = b""
            end = self._seek_past(data_start, size)
        else:
            data = self._payload(data_start, size)
            end = data_start + tar_blocks.padded(size)
            if not self.read_data:
                data = b""
        member = TarMember(name, data, self.member_offset, end)
        self._member_done()
        return end, member

    def _payload(self, data_start: int, size: int) -> bytes:
        """A member's data read in bounded pieces, its padding read and dropped."""
        read = self.read
        padded = tar_blocks.padded(size)
        if size <= SMALL_MEMBER_SIZE:
            data = read(padded)
            if len(data) != padded:
                data += _read_exactly(read, padded - len(data))
                if len(data) != padded:
                    self._truncated(data_start, size, len(data))
            return data[:size]
        if size > READ_PIECE_SIZE:
            self._check_member_fits(data_start, size)
        data = read(size) if size <= READ_PIECE_SIZE else b""
        if len(data) != size:
            data += _read_exactly(read, size - len(data))
            if len(data) != size:
                self._truncated(data_start, size, len(data))
        padding = padded - size
        if padding:
            pad = read(padding)
            if len(pad) != padding:
                pad += _read_exactly(read, padding - len(pad))
                if len(pad) != padding:
                    self._truncated(data_start, size, size + len(pad))
        return data

    def _seek_past(self, data_start: int, size: int) -> int:
        """Seek over a member's data and padding; its end, or raise when the tar is cut short."""
        padded = tar_blocks.padded(size)
        if data_start + padded > self.tar_end:
            self._truncated(data_start, size, max(self.tar_end - data_start, 0))
        self.stream.seek(padded, io.SEEK_CUR)
        return data_start + padded

    def _check_member_fits(self, data_start: int, size: int) -> None:
        """Raise when a large member claims more bytes than a seekable plain stream holds.

        Checked before its pieces are read: a bogus size would read the rest of the shard.
        """
        stream = self.stream
        if not _seekable(stream) or _decompressing(stream):
            return
        here = stream.tell()
        available = stream.seek(0, io.SEEK_END) - here
        stream.seek(here)
        if available < size:
            self._truncated(data_start, size, available)

    def _truncated(self, data_start: int, size: int, got: int) -> NoReturn:
        _raise_truncated(self.shard, self.member_offset, data_start, size, got)

    def _extended_header(self, offset: int, size: int, kind: bytes) -> int:
        """Read a GNU long name or pax header; record what it says about the next member."""
        if size > MAX_EXTENDED_HEADER_SIZE:
            reason = f"extended header size {size} exceeds limit {MAX_EXTENDED_HEADER_SIZE}"
            raise ShardFormatError(self.shard, offset, reason)
        padded = tar_blocks.padded(size)
        payload = _read_exactly(self.read, padded)
        if len(payload) != padded:
            raise ShardFormatError(self.shard, offset, "truncated extended header")
        payload = payload[:size]
        named = self.long_name is not None or self.pax_name is not None
        if kind == b"L":
            if not named:
                self.long_name = _name_field(payload)
        elif kind in _PAX_LOCAL_TYPES:
            self._pax_header(_parse_pax_records(payload, self.shard, offset), offset, named)
        elif kind == b"g":
            self._global_header(_parse_pax_records(payload, self.shard, offset), offset, named)
        self.plain = False
        return offset + BLOCK_SIZE + padded

    def _pax_header(self, records: dict[str, str], offset: int, named: bool) -> None:
        """A pax header's path and size for the next member; the first of each counts."""
        if "path" in records and not named:
            self.pax_name = records["path"].rstrip("/")
        new_size = _pax_size(records, self.shard, offset)
        if new_size is not None and self.pax_size is None:
            self.pax_size = new_size

    def _global_header(self, records: dict[str, str], offset: int, named: bool) -> None:
        """A global pax header: its path names every later member, until replaced."""
        if "size" in records:
            reason = "size in a global pax header is not supported"
            raise ShardFormatError(self.shard, offset, reason)
        if "path" in records:
            self.global_name = records["path"].rstrip("/") or None
        if not named and self.pax_size is None:
            self.member_offset = None  # as tarfile: a global header is no member's part

    def _unknown_type(self, header: bytes, offset: int, size: int) -> int:
        """Skip an entry of an unknown type with its data, as tarfile does (webdataset too)."""
        if self.pax_size is not None:
            size = self.pax_size
        if size > self.max_member_size:
            _raise_too_large(self.shard, offset, self._name(header), size, self.max_member_size)
        padded = tar_blocks.padded(size)
        if _skip(self.read, padded) != padded:
            reason = "truncated member of unknown type"
            raise ShardFormatError(self.shard, self.member_offset, reason)
        self._member_done()
        return offset + BLOCK_SIZE + padded

    def _name(self, header: bytes) -> str:
        """A member's full name: a GNU long name, a pax path, a global pax path or its header's."""
        return self.long_name or self.pax_name or self.global_name or _header_name(header)

    def _member_done(self) -> None:
        """Clear what extended headers left pending; a global pax name stays in force."""
        self.member_offset = self.long_name = self.pax_name = self.pax_size = None
        self.plain = self.global_name is None

    def bomb_failure(
        self, bomb: DecompressionBombError, offset: int, header: bytes | None
    ) -> ShardFormatError:
        """The error for a decompression bomb hit at ``offset``, naming the member it inflated."""
        if header is not None:
            where = f"in member {self._name(header)!r}"
        else:
            where = f"in the header at byte {offset}"
        return ShardFormatError(self.shard, offset, f"{bomb.reason} ({where})")


def _read_exactly(read, count: int) -> bytes:
    """Read up to ``count`` bytes in bounded pieces; shorter only at end of stream."""
    pieces = []
    remaining = count
    while remaining > 0:
        piece = read(min(remaining, READ_PIECE_SIZE))
        if not piece:
            break
        pieces.append(piece)
        remaining -= len(piece)
    return pieces[0] if len(pieces) == 1 else b"".join(pieces)


def _skip(read, count: int) -> int:
    """Read and drop ``count`` bytes in bounded pieces; return how many there were."""
    skipped = 0
    while skipped < count:
        piece = read(min(count - skipped, READ_PIECE_SIZE))
        if not piece:
            break
        skipped += len(piece)
    return skipped


def parse_members(
    data: bytes, shard: str, base_offset: int, max_member_size: int = DEFAULT_MAX_MEMBER_SIZE
) -> list[TarMember]:
    """Parse the members in ``data``, the byte range ``[base_offset, base_offset+len(data))``
    of an uncompressed tar that starts and ends on member boundaries."""
    stream = io.BytesIO(data)
    return list(iter_members(stream, shard, base_offset, max_member_size=max_member_size))


def _peek(fileobj: BinaryIO, count: int) -> bytes | None:
    """Return the next ``count`` bytes without consuming them, or None if impossible."""
    peek = getattr(fileobj, "peek", None)
    if peek is not None:
        return peek(count)[:count]
    if _seekable(fileobj):
        position = fileobj.tell()
        head = fileobj.read(count)
        fileobj.seek(position)
        return head
    return None


def _decompressing(stream: BinaryIO) -> bool:
    """True for a compressed stream (as :func:`open_shard_stream` makes): seeking decompresses."""
    raw = getattr(stream, "raw", stream)
    return isinstance(raw, _GuardedDecompression)


def _seekable(fileobj: BinaryIO) -> bool:
    seekable = getattr(fileobj, "seekable", None)
    return bool(seekable is not None and seekable())


def _buffered(fileobj: BinaryIO) -> BinaryIO:
    """Wrap in a large read buffer (also over an 8 KiB-buffered file): a syscall per few
    small members would dominate; members larger than the buffer are read around it."""
    if isinstance(fileobj, io.BytesIO) or not hasattr(fileobj, "readinto"):
        return fileobj
    try:
        return io.BufferedReader(fileobj, STREAM_BUFFER_SIZE)
    except (AttributeError, ValueError):
        return fileobj


def is_compressed_file(fs: Any, path: str) -> bool:
    """True for a gzip or zstd shard on a filesystem, from its first four bytes (a small
    ranged read, not a block)."""
    head = fs.cat_file(path, start=0, end=4)
    return head.startswith(GZIP_MAGIC) or starts_zstd(head)


def shard_compression(shard: str, fileobj: BinaryIO) -> str | None:
    """``"gzip"``, ``"zstd"`` or None (a plain tar): by magic bytes, else by the name."""
    head = _peek(fileobj, 4)
    if head is not None and len(head) >= len(GZIP_MAGIC):
        if head.startswith(GZIP_MAGIC):
            return "gzip"
        return "zstd" if starts_zstd(head) else None
    name = shard.split("?", 1)[0].lower()
    if name.endswith(GZIP_SUFFIXES):
        return "gzip"
    return "zstd" if name.endswith(ZSTD_SUFFIXES) else None


def open_shard_stream(fileobj: BinaryIO, shard: str, *, max_ratio: float = MAX_RATIO) -> BinaryIO:
    """Return a buffered stream of the uncompressed tar in ``fileobj``.

    gzip and zstd are told by their magic bytes (or, when the file cannot be peeked, by a
    ``.gz``/``.tgz``/``.zst`` name) and decompressed under a guard: past its first
    ``RATIO_GRACE`` bytes, inflating more than ``max_ratio`` times the compressed bytes read
    raises :class:`DecompressionBombError`. A plain tar comes back buffered and as seekable
    as ``fileobj``.
    """
    buffered = _buffered(fileobj)
    compression = shard_compression(shard, buffered)
    if compression is not None:
        logger.debug("reading %s as %s", redact_url(shard), compression)
        guarded = _GuardedDecompression(buffered, shard, max_ratio, compression)
        return io.BufferedReader(guarded, STREAM_BUFFER_SIZE)
    return buffered


class DecompressionBombError(ShardFormatError):
    """A compressed stream inflated past its allowed ratio: a decompression bomb, refused."""


class _CountingReader:
    """The compressed source of a guarded stream, counting the bytes the decompressor takes
    (and showing them to ``walk``, a zstd stream's :class:`FrameWalk`)."""

    __slots__ = ("_read", "consumed", "walk")

    def __init__(self, fileobj: BinaryIO, walk: FrameWalk | None) -> None:
        self._read = fileobj.read
        self.consumed = 0
        self.walk = walk

    def read(self, size: int = -1) -> bytes:
        data = self._read(size)
        self.consumed += len(data)
        if self.walk is not None:
            self.walk.feed(data)
        return data

    def readable(self) -> bool:
        return True


class _GuardedDecompression(io.RawIOBase):
    """gzip or zstd decompression that refuses to inflate past ``max_ratio`` times its input.

    The ratio is checked after every read of at most ``GUARDED_READ_SIZE`` bytes once
    ``RATIO_GRACE`` bytes came out, so a bomb is stopped with at most that much (plus
    one read) inflated, whatever it claims.
    The compressed count includes the decompressor's read-ahead, erring on the safe side.
    A zstd stream that ends inside a frame raises (its binding may end quietly there).
    """

    def __init__(self, compressed: BinaryIO, shard: str, max_ratio: float, kind: str) -> None:
        super().__init__()
        walk = FrameWalk() if kind == "zstd" else None
        self._source = _CountingReader(compressed, walk)
        if walk is None:
            self._inner = gzip.GzipFile(fileobj=self._source, mode="rb")
        else:
            self._inner = open_reader(self._source)
        self._kind = kind
        self._shard = shard
        self._max_ratio = max_ratio
        self._inflated = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        with memoryview(buffer) as view:
            count = self._inner.readinto(view[:GUARDED_READ_SIZE])
        if not count and self._source.walk is not None:
            self._source.walk.check_end()
        self._inflated += count
        inflated = self._inflated
        if inflated > RATIO_GRACE and inflated > self._max_ratio * self._source.consumed:
            raise DecompressionBombError(
                self._shard,
                inflated - count,
                f"{self._kind} stream inflates {inflated} bytes from {self._source.consumed}, "
                f"past the limit of {self._max_ratio:g}x its compressed size after the first "
                f"{RATIO_GRACE} bytes",
            )
        return count
