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
than ``max_member_size`` (default 1 GiB, checked on its header) and a gzip stream that
inflates more than ``MAX_GZIP_RATIO`` times its compressed size once past its first
``GZIP_RATIO_GRACE`` bytes (a decompression bomb) all raise ShardFormatError.
"""

from __future__ import annotations

import gzip
import io
import logging
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO, NoReturn

from fsspec_shards.errors import ShardFormatError
from fsspec_shards.redact import redact_url

logger = logging.getLogger("fsspec_shards.tar")

BLOCK_SIZE = 512
DEFAULT_MAX_MEMBER_SIZE = 1 << 30
MAX_GZIP_RATIO = 200
GZIP_RATIO_GRACE = 64 << 20
GUARDED_READ_SIZE = 1 << 20
STREAM_BUFFER_SIZE = 128 << 10
READ_PIECE_SIZE = 16 << 20
SMALL_MEMBER_SIZE = 64 << 10
MAX_EXTENDED_HEADER_SIZE = 8 << 20
GZIP_MAGIC = b"\x1f\x8b"
GZIP_SUFFIXES = (".gz", ".tgz")

_ZERO_BLOCK = bytes(BLOCK_SIZE)
_REGULAR_TYPES = frozenset((b"0", b"\0", b"7"))
# Types that tarfile knows and treats as having no data blocks, whatever their size field says.
_DATALESS_TYPES = frozenset((b"1", b"2", b"3", b"4", b"5", b"6"))
_GNU_LONG_TYPES = frozenset((b"L", b"K"))
_PAX_LOCAL_TYPES = frozenset((b"x", b"X"))
_COMPRESSED_STREAM_ERRORS = (EOFError, zlib.error, gzip.BadGzipFile)


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


def _member_name(
    header: bytes, long_name: str | None, pax_name: str | None, global_name: str | None
) -> str:
    """A member's full name: a GNU long name, a pax path, a global pax path or its header's."""
    return long_name or pax_name or global_name or _header_name(header)


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
    """
    read = stream.read
    seek_over = not read_data and _seekable(stream) and not _decompressing(stream)
    if seek_over:
        # Where the tar ends, in tar offsets: a member past it is cut short and must fail
        # before it is yielded, as it does when its data is read.
        stream_start = stream.tell()
        tar_end = start + stream.seek(0, io.SEEK_END) - stream_start
        stream.seek(stream_start)
    adler32 = zlib.adler32
    position = start
    header_offset = start
    member_offset: int | None = None
    long_name: str | None = None
    pax_name: str | None = None
    pax_size: int | None = None
    global_name: str | None = None
    try:
        while True:
            header_offset = position
            header = read(BLOCK_SIZE)
            if len(header) != BLOCK_SIZE:
                if header:
                    header += _read_exactly(read, BLOCK_SIZE - len(header))
                if not header:
                    if header_offset == 0:
                        raise ShardFormatError(shard, 0, "empty shard: no tar data (0 bytes)")
                    if member_offset is not None:
                        raise ShardFormatError(
                            shard, member_offset, "archive ends after an extended header"
                        )
                    return
                if len(header) != BLOCK_SIZE:
                    raise ShardFormatError(
                        shard, header_offset, f"truncated header ({len(header)} of 512 bytes)"
                    )
            if header == _ZERO_BLOCK:
                if member_offset is not None:
                    raise ShardFormatError(
                        shard, member_offset, "archive ends after an extended header"
                    )
                return
            position += BLOCK_SIZE
            try:
                size = int(header[124:135], 8) if header[135] == 0 else _number(header[124:136])
                declared = int(header[148:154], 8) if header[154] == 0 else _number(header[148:156])
            except ValueError:
                size, declared = _strict_numbers(header, shard, header_offset)
            unsigned = (
                (adler32(header[:148]) & 0xFFFF)
                + (adler32(header[156:400]) & 0xFFFF)
                + (adler32(header[400:]) & 0xFFFF)
                + 253
            )
            if declared != unsigned and not _signed_checksum_ok(header, declared, unsigned):
                raise ShardFormatError(shard, header_offset, "bad header checksum")
            if size < 0:
                raise ShardFormatError(shard, header_offset, f"negative size {size}")
            kind = header[156:157]
            if member_offset is None:
                member_offset = header_offset

            if kind == b"\0" and header[:100].split(b"\0", 1)[0].endswith(b"/"):
                kind = b"5"  # an old V7 directory: a regular-file type with a trailing slash
            if kind in _REGULAR_TYPES:
                if pax_size is not None:
                    size = pax_size
                if size > max_member_size:
                    name = _member_name(header, long_name, pax_name, global_name)
                    _raise_too_large(shard, header_offset, name, size, max_member_size)
                if seek_over:
                    padded = (size + 511) & -512
                    if position + padded > tar_end:
                        got = max(tar_end - position, 0)
                        _raise_truncated(shard, member_offset, position, size, got)
                    stream.seek(padded, io.SEEK_CUR)
                    position += padded
                    data = b""
                elif size <= SMALL_MEMBER_SIZE:
                    # One read for data and padding: small members dominate the call count.
                    padded = (size + 511) & -512
                    data = read(padded)
                    if len(data) != padded:
                        data += _read_exactly(read, padded - len(data))
                        if len(data) != padded:
                            _raise_truncated(shard, member_offset, position, size, len(data))
                    if padded != size:
                        data = data[:size]
                    position += padded
                else:
                    if size > READ_PIECE_SIZE:
                        _check_member_fits(stream, shard, member_offset, position, size)
                    data = read(size) if size <= READ_PIECE_SIZE else b""
                    if len(data) != size:
                        data += _read_exactly(read, size - len(data))
                    if len(data) != size:
                        _raise_truncated(shard, member_offset, position, size, len(data))
                    padding = -size % BLOCK_SIZE
                    if padding:
                        pad = read(padding)
                        if len(pad) != padding:
                            pad += _read_exactly(read, padding - len(pad))
                            if len(pad) != padding:
                                _raise_truncated(
                                    shard, member_offset, position, size, size + len(pad)
                                )
                    position += size + padding
                if not read_data:
                    data = b""
                name = long_name or pax_name or global_name
                if name is None:
                    nul = header.find(0, 0, 100)
                    name = header[: nul if nul >= 0 else 100].decode("utf-8", "surrogateescape")
                    if header[345] != 0:
                        name = _name_field(header[345:500]) + "/" + name
                yield TarMember(name, data, member_offset, position)
                member_offset = long_name = pax_name = pax_size = None
                continue

            if kind in _DATALESS_TYPES:
                member_offset = long_name = pax_name = pax_size = None
                continue
            if kind == b"S":
                raise ShardFormatError(shard, header_offset, "sparse members are not supported")
            if kind in _GNU_LONG_TYPES or kind in _PAX_LOCAL_TYPES or kind == b"g":
                if size > MAX_EXTENDED_HEADER_SIZE:
                    raise ShardFormatError(
                        shard,
                        header_offset,
                        f"extended header size {size} exceeds limit {MAX_EXTENDED_HEADER_SIZE}",
                    )
                payload = _read_exactly(read, size + (-size % BLOCK_SIZE))
                if len(payload) != size + (-size % BLOCK_SIZE):
                    raise ShardFormatError(shard, header_offset, "truncated extended header")
                position += len(payload)
                payload = payload[:size]
                if kind == b"L":
                    if long_name is None and pax_name is None:
                        long_name = _name_field(payload)
                elif kind in _PAX_LOCAL_TYPES:
                    records = _parse_pax_records(payload, shard, header_offset)
                    if "path" in records and long_name is None and pax_name is None:
                        pax_name = records["path"].rstrip("/")
                    new_size = _pax_size(records, shard, header_offset)
                    if new_size is not None and pax_size is None:
                        pax_size = new_size
                elif kind == b"g":
                    records = _parse_pax_records(payload, shard, header_offset)
                    if "size" in records:
                        raise ShardFormatError(
                            shard, header_offset, "size in a global pax header is not supported"
                        )
                    if "path" in records:
                        global_name = records["path"].rstrip("/") or None
                    if long_name is None and pax_name is None and pax_size is None:
                        member_offset = None  # as tarfile: a global header is no member's part
                continue
            # An unknown type: tarfile skips its data blocks and webdataset ignores it.
            if pax_size is not None:
                size = pax_size
            if size > max_member_size:
                name = _member_name(header, long_name, pax_name, global_name)
                _raise_too_large(shard, header_offset, name, size, max_member_size)
            skipped = _skip(read, size + (-size % BLOCK_SIZE))
            if skipped != size + (-size % BLOCK_SIZE):
                raise ShardFormatError(shard, member_offset, "truncated member of unknown type")
            position += skipped
            member_offset = long_name = pax_name = pax_size = None
    except _COMPRESSED_STREAM_ERRORS as exc:
        raise ShardFormatError(shard, header_offset, f"corrupt compressed stream: {exc}") from None
    except GzipBombError as exc:
        bomb = exc
    # Raised outside the except block: the error names the member the bomb inflated.
    if position > header_offset:
        where = f"in member {_member_name(header, long_name, pax_name, global_name)!r}"
    else:
        where = f"in the header at byte {header_offset}"
    raise ShardFormatError(shard, header_offset, f"{bomb.reason} ({where})")


def _check_member_fits(
    stream: BinaryIO, shard: str, offset: int, data_start: int, size: int
) -> None:
    """Raise when a large member claims more bytes than a seekable plain stream holds.

    Checked before its pieces are read: a bogus size would read the rest of the shard.
    """
    if not _seekable(stream) or _decompressing(stream):
        return
    here = stream.tell()
    available = stream.seek(0, io.SEEK_END) - here
    stream.seek(here)
    if available < size:
        _raise_truncated(shard, offset, data_start, size, available)


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
    """True for a gzip stream (as :func:`open_shard_stream` makes): seeking decompresses."""
    raw = getattr(stream, "raw", stream)
    return isinstance(raw, _GuardedGzip)


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


def is_gzip_shard(shard: str, fileobj: BinaryIO) -> bool:
    """True when the shard is gzip-compressed: by magic bytes, else by its name."""
    head = _peek(fileobj, 2)
    if head is not None and len(head) == 2:
        return head == GZIP_MAGIC
    return shard.split("?", 1)[0].lower().endswith(GZIP_SUFFIXES)


def open_shard_stream(
    fileobj: BinaryIO, shard: str, *, max_gzip_ratio: float = MAX_GZIP_RATIO
) -> BinaryIO:
    """Return a buffered stream of the uncompressed tar in ``fileobj``.

    gzip is detected by its magic bytes (or, when the file cannot be peeked, by a
    ``.gz``/``.tgz`` name) and decompressed under a guard: past its first
    ``GZIP_RATIO_GRACE`` bytes, inflating more than ``max_gzip_ratio`` times the compressed
    bytes read raises :class:`GzipBombError`. A plain tar comes back buffered and as
    seekable as ``fileobj``.
    """
    buffered = _buffered(fileobj)
    if is_gzip_shard(shard, buffered):
        logger.debug("reading %s as gzip", redact_url(shard))
        guarded = _GuardedGzip(buffered, shard, max_gzip_ratio)
        return io.BufferedReader(guarded, STREAM_BUFFER_SIZE)
    return buffered


class GzipBombError(ShardFormatError):
    """A gzip stream inflated past its allowed ratio: a decompression bomb, refused."""


class _CountingReader:
    """The compressed source of a guarded gzip stream, counting the bytes gzip takes."""

    __slots__ = ("_read", "consumed")

    def __init__(self, fileobj: BinaryIO) -> None:
        self._read = fileobj.read
        self.consumed = 0

    def read(self, size: int = -1) -> bytes:
        data = self._read(size)
        self.consumed += len(data)
        return data


class _GuardedGzip(io.RawIOBase):
    """gzip decompression that refuses to inflate past ``max_ratio`` times its input.

    The ratio is checked after every read of at most ``GUARDED_READ_SIZE`` bytes once
    ``GZIP_RATIO_GRACE`` bytes came out, so a bomb is stopped with at most that much (plus
    one read) inflated, whatever it claims.
    The compressed count includes gzip's read-ahead (a few KiB), erring on the safe side.
    """

    def __init__(self, compressed: BinaryIO, shard: str, max_ratio: float) -> None:
        super().__init__()
        self._source = _CountingReader(compressed)
        self._gzip = gzip.GzipFile(fileobj=self._source, mode="rb")
        self._shard = shard
        self._max_ratio = max_ratio
        self._inflated = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        with memoryview(buffer) as view:
            count = self._gzip.readinto(view[:GUARDED_READ_SIZE])
        self._inflated += count
        inflated = self._inflated
        if inflated > GZIP_RATIO_GRACE and inflated > self._max_ratio * self._source.consumed:
            raise GzipBombError(
                self._shard,
                inflated - count,
                f"gzip stream inflates {inflated} bytes from {self._source.consumed}, past the "
                f"limit of {self._max_ratio:g}x its compressed size after the first "
                f"{GZIP_RATIO_GRACE} bytes",
            )
        return count


def is_seekable_shard(shard: str, fileobj: BinaryIO) -> bool:
    """True when a reader may seek to a member offset: plain tar on a seekable file.

    False for gzip: resuming a compressed shard must re-read it from the start.
    """
    return _seekable(fileobj) and not is_gzip_shard(shard, fileobj)
