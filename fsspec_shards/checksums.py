"""Checksum formats: digests, streaming hashers, ``SHA256SUMS`` files and block manifests.

Neutral ground: storage, the writer and the fleet chores all use these; this module imports
neither storage nor iteration.

- A checksum is written ``"<algorithm>:<hex>"`` with algorithm ``sha256``, ``md5`` or
  ``crc32c`` (crc32c as the 8 hex digits of its big-endian value).
- A sums file is GNU ``sha256sum`` output: one ``<hex>  <name>`` line per file (the
  reader also takes ``<hex> *<name>`` and ``algo:<hex>``). :func:`format_sums` is its one
  writer: ``ShardWriter``, ``fsspec-shards manifest`` and the demo write the same bytes for
  the same files.
- A block manifest (``SHA256SUMS.blocks``, beside and named after the sums file) lists, for
  each file, a SHA-256 per block of a fixed size plus the whole file's size and SHA-256, so a
  reader can verify and hand out each block as it arrives. Its format (JSON lines, UTF-8)::

      {"format":"fsspec-shards-blocks","version":1,"algorithm":"sha256","block_size":2097152}
      {"name":"train-000000.tar","size":5242880,"sha256":"<hex>","blocks":["<hex>","<hex>","<hex>"]}

  The first line is the header; each further line is one file, in the order written. Names
  are relative to the manifest's directory, as in the sums file. Block ``i`` covers bytes
  ``[i * block_size, min(size, (i + 1) * block_size))``; a file of ``n`` bytes has
  ``ceil(n / block_size)`` blocks (an empty file none). :func:`format_block_manifest` is its
  one writer (keys in this order, no spaces, one ``\\n`` after each line), so the same files
  and block size give the same bytes wherever they were hashed.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import google_crc32c

from fsspec_shards.config import is_int
from fsspec_shards.redact import redact_text, redact_url
from fsspec_shards.units import MiB

ALGORITHMS = ("sha256", "md5", "crc32c")
"""Known algorithms, strongest first."""

SUMS_NAME = "SHA256SUMS"
"""The usual name of a sums file (GNU ``sha256sum``'s): the one the writer and the demo write."""
BLOCK_MANIFEST_SUFFIX = ".blocks"
"""A block manifest is named after its sums file: ``SHA256SUMS`` -> ``SHA256SUMS.blocks``."""
BLOCK_MANIFEST_FORMAT = "fsspec-shards-blocks"
BLOCK_MANIFEST_VERSION = 1
DEFAULT_BLOCK_SIZE = 2 * MiB
"""Bytes per block: small enough that the first block of a far shard arrives within a couple
of webdataset's first-sample times, large enough that a 1 GB shard lists 512 digests (34 kB)."""
MIN_BLOCK_SIZE = 4096

_HEX_LENGTH = {"sha256": 64, "md5": 32, "crc32c": 8}
_ALGORITHM_BY_HEX_LENGTH = {length: name for name, length in _HEX_LENGTH.items()}
_HEX_RE = re.compile(r"^[0-9a-fA-F]+$")
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_SUMS_LINE_RE = re.compile(r"^(?P<digest>\S+) (?P<mode>[ *])(?P<name>.+)$")


@dataclass(frozen=True)
class Checksum:
    """One expected or computed digest."""

    algorithm: str
    hexdigest: str

    def __str__(self) -> str:
        return f"{self.algorithm}:{self.hexdigest}"

    @property
    def strength(self) -> int:
        """Higher is stronger: sha256 > md5 > crc32c."""
        return len(ALGORITHMS) - ALGORITHMS.index(self.algorithm)


def parse_checksum(text: str) -> Checksum:
    """Parse ``"sha256:<hex>"`` / ``"md5:<hex>"`` / ``"crc32c:<hex>"``; a bare hex digest is
    accepted when its length names the algorithm (64 sha256, 32 md5, 8 crc32c)."""
    if not isinstance(text, str):
        raise ValueError(f"invalid checksum {text!r}: expected a string like 'sha256:<hex>'")
    algorithm, sep, digest = text.strip().partition(":")
    if not sep:
        digest = algorithm
        algorithm = _ALGORITHM_BY_HEX_LENGTH.get(len(digest), "")
    algorithm = algorithm.lower()
    if algorithm not in _HEX_LENGTH:
        raise ValueError(
            f"invalid checksum {text!r}: expected 'sha256:<hex>', 'md5:<hex>' or 'crc32c:<hex>'"
        )
    if len(digest) != _HEX_LENGTH[algorithm] or not _HEX_RE.match(digest):
        raise ValueError(
            f"invalid checksum {text!r}: {algorithm} needs {_HEX_LENGTH[algorithm]} hex digits"
        )
    return Checksum(algorithm, digest.lower())


class StreamingHasher:
    """Hashes bytes as they stream past, so verification needs no second pass."""

    def __init__(self, algorithm: str) -> None:
        if algorithm not in _HEX_LENGTH:
            raise ValueError(f"unknown checksum algorithm {algorithm!r}; known: {ALGORITHMS}")
        self.algorithm = algorithm
        self._hash: Any = (
            google_crc32c.Checksum() if algorithm == "crc32c" else hashlib.new(algorithm)
        )

    def update(self, data: bytes | bytearray | memoryview) -> None:
        if self.algorithm == "crc32c" and not memoryview(data).readonly:
            data = bytes(data)  # google-crc32c takes read-only buffers only
        self._hash.update(data)

    def checksum(self) -> Checksum:
        if self.algorithm == "crc32c":
            return Checksum("crc32c", self._hash.digest().hex())
        return Checksum(self.algorithm, self._hash.hexdigest())


# -- sums files (sha256sum format) ---------------------------------------------------------


def decode_text(data: bytes, kind: str, source: str) -> str:
    """The UTF-8 text of a manifest file read as ``data``; a ValueError naming the file
    (``kind`` and ``source``, redacted) and the line of the first undecodable byte."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ValueError(
            f"{kind} {redact_url(source)} line {line}: not UTF-8 text (byte {exc.start})"
        ) from None


def normalize_name(name: str) -> str:
    """A manifest name as written, tidied: ``./a/../b.tar`` -> ``b.tar``; URLs stay as they are."""
    name = name.strip()
    if "://" in name:
        return name
    name = posixpath.normpath(name)
    return name[2:] if name.startswith("./") else name


def check_writable_name(name: str) -> str:
    """``name`` if a manifest line can hold it (no newline, no backslash: ``sha256sum`` would
    escape those), else ValueError naming it."""
    if not name or "\n" in name or "\r" in name or "\\" in name:
        raise ValueError(f"file name {redact_url(name)!r} cannot be written in sha256sum format")
    return name


def format_sums(entries: Iterable[tuple[str, Checksum]]) -> str:
    """The text of a sums file listing ``(name, checksum)`` in the order given: GNU
    ``sha256sum`` lines ``<hex>  <name>`` (a non-sha256 checksum as ``algo:<hex>``)."""
    lines = []
    for name, checksum in entries:
        digest = checksum.hexdigest if checksum.algorithm == "sha256" else str(checksum)
        lines.append(f"{digest}  {check_writable_name(name)}\n")
    return "".join(lines)


def parse_sums_file(text: str, source: str = "<manifest>") -> dict[str, Checksum]:
    """Parse ``sha256sum``-style lines (``<hex>  name`` or ``<hex> *name``) into name -> checksum.

    The algorithm follows from the digest length; ``algo:<hex>`` digests are accepted too.
    Names are tidied (``./a.tar`` is ``a.tar``). Blank lines and ``#`` comments are skipped.
    A malformed line, a digest that is not hex of its algorithm's length, and a name listed
    twice with different digests are errors naming the manifest and the line; the same entry
    twice is not.
    """
    entries: dict[str, Checksum] = {}
    lines: dict[str, int] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.rstrip("\r")
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        where = f"manifest {redact_url(source)} line {number}"
        match = _SUMS_LINE_RE.match(line)
        if not match:
            raise ValueError(f"{where}: expected '<hex>  <name>', got {redact_text(line[:80])!r}")
        try:
            checksum = parse_checksum(match.group("digest"))
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
        name = normalize_name(match.group("name"))
        if name in entries and entries[name] != checksum:
            raise ValueError(
                f"{where}: {redact_url(name)} is listed again with another checksum "
                f"(first on line {lines[name]})"
            )
        entries[name] = checksum
        lines.setdefault(name, number)
    return entries


# -- block manifests -----------------------------------------------------------------------


def block_manifest_name(sums_name: str) -> str:
    """The block manifest beside a sums file: ``SHA256SUMS`` -> ``SHA256SUMS.blocks``."""
    return sums_name + BLOCK_MANIFEST_SUFFIX


@dataclass(frozen=True)
class BlockList:
    """One file's entry in a block manifest: its size, whole SHA-256 and a SHA-256 per block."""

    size: int
    block_size: int
    sha256: str
    blocks: tuple[str, ...]

    def __post_init__(self) -> None:
        if self.size < 0 or self.block_size < 1:
            raise ValueError(f"invalid block list: size {self.size}, block size {self.block_size}")
        if len(self.blocks) != -(-self.size // self.block_size):
            raise ValueError(
                f"a file of {self.size} bytes in blocks of {self.block_size} has "
                f"{-(-self.size // self.block_size)} blocks, not {len(self.blocks)}"
            )

    @property
    def checksum(self) -> Checksum:
        """The whole file's checksum."""
        return Checksum("sha256", self.sha256)

    def __len__(self) -> int:
        return len(self.blocks)

    def bounds(self, index: int) -> tuple[int, int]:
        """Bytes ``[start, end)`` of block ``index``."""
        start = index * self.block_size
        return start, min(self.size, start + self.block_size)

    def block_at(self, offset: int) -> int:
        """The block holding byte ``offset``."""
        return offset // self.block_size

    def matches(self, index: int, data: bytes) -> bool:
        """Whether ``data`` is block ``index`` as listed."""
        return hashlib.sha256(data).hexdigest() == self.blocks[index]


class BlockHasher:
    """A file's :class:`BlockList` from its bytes streaming past, in any pieces."""

    def __init__(self, block_size: int = DEFAULT_BLOCK_SIZE) -> None:
        self.block_size = check_block_size(block_size)
        self._whole = hashlib.sha256()
        self._block = hashlib.sha256()
        self._in_block = 0
        self._blocks: list[str] = []
        self.size = 0

    def update(self, data: bytes) -> None:
        self._whole.update(data)
        view = memoryview(data)
        while view:
            take = min(len(view), self.block_size - self._in_block)
            self._block.update(view[:take])
            self._in_block += take
            view = view[take:]
            if self._in_block == self.block_size:
                self._blocks.append(self._block.hexdigest())
                self._block = hashlib.sha256()
                self._in_block = 0
        self.size += len(data)

    def block_list(self) -> BlockList:
        """The blocks of everything seen (the last one may be short)."""
        blocks = list(self._blocks)
        if self._in_block:
            blocks.append(self._block.hexdigest())
        return BlockList(self.size, self.block_size, self._whole.hexdigest(), tuple(blocks))


def check_block_size(block_size: Any) -> int:
    """A valid block size (an int >= 4096), else ValueError."""
    if not is_int(block_size):
        raise ValueError(f"block size must be an int, got {block_size!r}")
    if block_size < MIN_BLOCK_SIZE:
        raise ValueError(f"block size must be at least {MIN_BLOCK_SIZE} bytes, got {block_size}")
    return block_size


def format_block_manifest(entries: Iterable[tuple[str, BlockList]], block_size: int) -> str:
    """The text of a block manifest of ``(name, blocks)`` in the order given (module
    docstring); every entry must have ``block_size``."""
    header = {
        "format": BLOCK_MANIFEST_FORMAT,
        "version": BLOCK_MANIFEST_VERSION,
        "algorithm": "sha256",
        "block_size": check_block_size(block_size),
    }
    lines = [_json_line(header)]
    for name, blocks in entries:
        if blocks.block_size != block_size:
            raise ValueError(
                f"{redact_url(name)}: blocks of {blocks.block_size} bytes in a manifest of "
                f"{block_size}-byte blocks"
            )
        entry = {
            "name": check_writable_name(name),
            "size": blocks.size,
            "sha256": blocks.sha256,
            "blocks": list(blocks.blocks),
        }
        lines.append(_json_line(entry))
    return "".join(lines)


def _json_line(value: dict) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False) + "\n"


def parse_block_manifest(text: str, source: str = "<block manifest>") -> dict[str, BlockList]:
    """Parse a block manifest into name -> :class:`BlockList` (names tidied as in sums files).

    A missing or foreign header, a newer version, a malformed line, and a name listed twice
    with different blocks are errors naming the manifest and the line.
    """
    shown = redact_url(source)
    lines = text.splitlines()
    try:
        header = json.loads(lines[0]) if lines else None
    except ValueError:
        header = None
    if not isinstance(header, dict) or header.get("format") != BLOCK_MANIFEST_FORMAT:
        raise ValueError(
            f"block manifest {shown} line 1: expected the header "
            f'{{"format":"{BLOCK_MANIFEST_FORMAT}",...}}'
        )
    version = header.get("version")
    if version != BLOCK_MANIFEST_VERSION:
        raise ValueError(
            f"block manifest {shown}: format version {version!r}; this fsspec-shards reads "
            f"version {BLOCK_MANIFEST_VERSION} (a newer fsspec-shards wrote it?)"
        )
    if header.get("algorithm") != "sha256":
        raise ValueError(f"block manifest {shown}: unknown algorithm {header.get('algorithm')!r}")
    try:
        block_size = check_block_size(header.get("block_size"))
    except ValueError as exc:
        raise ValueError(f"block manifest {shown} line 1: {exc}") from None
    entries: dict[str, BlockList] = {}
    for number, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        try:
            name, blocks = _parse_block_entry(line, block_size)
        except (ValueError, TypeError, KeyError) as exc:
            raise ValueError(f"block manifest {shown} line {number}: {exc}") from None
        if name in entries and entries[name] != blocks:
            raise ValueError(
                f"block manifest {shown} line {number}: {redact_url(name)} is listed again "
                "with other blocks"
            )
        entries[name] = blocks
    return entries


def _parse_block_entry(line: str, block_size: int) -> tuple[str, BlockList]:
    try:
        entry = json.loads(line)
    except ValueError:
        raise ValueError(f"not a JSON object: {redact_text(line[:80])!r}") from None
    if not isinstance(entry, dict):
        raise ValueError("not a JSON object")
    name, size, whole, blocks = entry["name"], entry["size"], entry["sha256"], entry["blocks"]
    if not isinstance(name, str) or not name:
        raise ValueError("'name' must be a non-empty string")
    if not is_int(size):
        raise ValueError("'size' must be an int")
    if not isinstance(blocks, list):
        raise ValueError("'blocks' must be a list of sha256 digests")
    for digest in (whole, *blocks):
        if not isinstance(digest, str) or not _SHA256_RE.match(digest):
            raise ValueError(f"{digest!r} is not a lowercase sha256 hex digest")
    return normalize_name(name), BlockList(size, block_size, whole, tuple(blocks))
