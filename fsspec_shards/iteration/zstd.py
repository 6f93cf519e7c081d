"""zstd for ``*.tar.zst`` shards: the binding, and a walk of the frames as their bytes pass.

The binding is the standard library's :mod:`compression.zstd` (Python 3.14) where present,
else the ``zstandard`` package (``pip install 'fsspec-shards[zstd]'``); both read in bounded
pieces, which the tar reader's decompression-bomb guard relies on. Shards are written with
a content checksum, so a damaged block fails the read.

Why the walk: ``zstandard``'s stream reader ends quietly at a frame cut short, so a shard
truncated at a member boundary would read as a shorter, valid tar. :class:`FrameWalk` follows
the frame and block headers of the compressed bytes as they are read (a few steps per block
of up to 128 KiB) and tells whether the stream ended on the end of a frame.
"""

from __future__ import annotations

from types import ModuleType
from typing import BinaryIO

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
ZSTD_SUFFIXES = (".zst", ".tzst")
COMPRESSION_LEVEL = 3
_SKIPPABLE_MAGIC_TAIL = b"\x2a\x4d\x18"  # skippable frames: 0x184D2A50..0x184D2A5F, little-endian
_FCS_SIZES = (0, 2, 4, 8)
_DICTIONARY_ID_SIZES = (0, 1, 2, 4)


def starts_zstd(head: bytes) -> bool:
    """True when ``head`` (a file's first four bytes) starts a zstd stream: the magic of a
    zstd frame or of a skippable frame."""
    return head == ZSTD_MAGIC or (head[1:4] == _SKIPPABLE_MAGIC_TAIL and head[0] & 0xF0 == 0x50)


class CorruptZstdError(Exception):
    """The compressed bytes are no zstd stream, or one cut short."""


def _stdlib() -> ModuleType | None:
    try:
        from compression import zstd
    except ImportError:
        return None
    return zstd


def _zstandard() -> ModuleType | None:
    try:
        import zstandard
    except ImportError:
        return None
    return zstandard


_STDLIB = _stdlib()
_ZSTANDARD = None if _STDLIB is not None else _zstandard()

ZSTD_ERRORS: tuple[type[BaseException], ...] = (CorruptZstdError,) + tuple(
    module.ZstdError for module in (_STDLIB, _ZSTANDARD) if module is not None
)
"""What reading a damaged zstd stream raises (besides EOFError), whichever binding reads."""


def _missing() -> ImportError:
    return ImportError(
        "zstd shards (.tar.zst) need the zstandard package: pip install 'fsspec-shards[zstd]' "
        "(or Python 3.14, whose compression.zstd is used)"
    )


def require() -> None:
    """Raise ImportError, saying what to install, when no zstd binding is present."""
    if _STDLIB is None and _ZSTANDARD is None:
        raise _missing()


def open_reader(source: BinaryIO) -> BinaryIO:
    """A reader of the decompressed bytes of ``source``, every frame in turn; ``readinto``
    fills at most the buffer it is given."""
    require()
    if _STDLIB is not None:
        return _STDLIB.ZstdFile(source, "rb")
    decompressor = _ZSTANDARD.ZstdDecompressor()
    return decompressor.stream_reader(source, read_across_frames=True, closefd=False)


def open_writer(target: BinaryIO) -> BinaryIO:
    """A writer compressing into ``target``, with a content checksum; ``close()`` ends the
    frame and leaves ``target`` open."""
    require()
    if _STDLIB is not None:
        parameter = _STDLIB.CompressionParameter
        options = {parameter.compression_level: COMPRESSION_LEVEL, parameter.checksum_flag: 1}
        return _STDLIB.ZstdFile(target, "wb", options=options)
    compressor = _ZSTANDARD.ZstdCompressor(level=COMPRESSION_LEVEL, write_checksum=True)
    return compressor.stream_writer(target, closefd=False)


class FrameWalk:
    """Follows the structure of a zstd stream (RFC 8878) fed to it piece by piece.

    :meth:`feed` raises :class:`CorruptZstdError` at bytes that are no frame; :meth:`check_end`
    raises it unless the bytes fed so far end on the end of a frame.
    """

    __slots__ = ("_checksum", "_frames", "_header", "_need", "_skip", "_state")

    def __init__(self) -> None:
        self._state = "magic"
        self._need = 4  # header bytes wanted by the state
        self._header = b""
        self._skip = 0  # bytes to pass over before the next header
        self._checksum = False
        self._frames = 0

    def feed(self, data: bytes) -> None:
        position, size = 0, len(data)
        while position < size:
            if self._skip:
                step = min(self._skip, size - position)
                self._skip -= step
                position += step
                continue
            take = min(self._need - len(self._header), size - position)
            self._header += data[position : position + take]
            position += take
            if len(self._header) == self._need:
                header, self._header = self._header, b""
                self._parse(header)

    def check_end(self) -> None:
        if self._state != "magic" or self._header or self._skip or not self._frames:
            raise CorruptZstdError("the zstd stream ends inside a frame (truncated)")

    def _parse(self, header: bytes) -> None:
        state = self._state
        if state == "magic":
            self._frames += 1
            if header == ZSTD_MAGIC:
                self._state, self._need = "descriptor", 1
            elif starts_zstd(header):
                self._state, self._need = "skippable", 4
            else:
                raise CorruptZstdError(f"no zstd frame: magic bytes {header.hex()}")
        elif state == "descriptor":
            descriptor = header[0]
            single_segment = bool(descriptor & 0x20)
            fcs = _FCS_SIZES[descriptor >> 6] or (1 if single_segment else 0)
            self._skip = (0 if single_segment else 1) + _DICTIONARY_ID_SIZES[descriptor & 3] + fcs
            self._checksum = bool(descriptor & 0x04)
            self._state, self._need = "block", 3
        elif state == "block":
            value = int.from_bytes(header, "little")
            kind, size = (value >> 1) & 3, value >> 3
            if kind == 3:
                raise CorruptZstdError("a zstd block of the reserved type")
            self._skip = 1 if kind == 1 else size
            if value & 1:  # the frame's last block
                self._skip += 4 if self._checksum else 0
                self._state, self._need = "magic", 4
        else:  # the size of a skippable frame
            self._skip = int.from_bytes(header, "little")
            self._state, self._need = "magic", 4
