"""Checksums: parsing, streaming hashers, manifests, and the choice of what to verify.

A checksum is written ``"<algorithm>:<hex>"`` with algorithm ``sha256``, ``md5`` or ``crc32c``
(crc32c as the 8 hex digits of its big-endian value). A manifest maps object paths to
checksums; it comes from a mapping or from a ``SHA256SUMS``-style file whose names are
relative to the file's own location.
"""

from __future__ import annotations

import hashlib
import logging
import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import google_crc32c

from fsspec_shards.config import bool_word
from fsspec_shards.redact import redact_text, redact_url

logger = logging.getLogger("fsspec_shards.storage.integrity")

ALGORITHMS = ("sha256", "md5", "crc32c")
"""Known algorithms, strongest first."""

_HEX_LENGTH = {"sha256": 64, "md5": 32, "crc32c": 8}
_ALGORITHM_BY_HEX_LENGTH = {length: name for name, length in _HEX_LENGTH.items()}
_HEX_RE = re.compile(r"^[0-9a-fA-F]+$")
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

    def update(self, data: bytes) -> None:
        self._hash.update(data)

    def checksum(self) -> Checksum:
        if self.algorithm == "crc32c":
            return Checksum("crc32c", self._hash.digest().hex())
        return Checksum(self.algorithm, self._hash.hexdigest())


def checksum_of_bytes(data: bytes, algorithm: str = "sha256") -> Checksum:
    """The checksum of ``data`` (a convenience for tests and small objects)."""
    hasher = StreamingHasher(algorithm)
    hasher.update(data)
    return hasher.checksum()


class Manifest:
    """Expected checksums by object path.

    With ``base`` (the manifest file's directory, in the backend's path form) each relative
    name resolves against it, and an absolute name (``/path``, or a URL, turned into a backend
    path by ``strip_protocol`` when given) stands for itself: :attr:`entries` is then keyed by
    full backend paths. Without ``base`` (a mapping given in code), a key matches a path
    exactly, or as its trailing path components, e.g. ``"train-0001.tar"`` matches
    ``"bucket/data/train-0001.tar"``.
    """

    def __init__(
        self,
        entries: Mapping[str, Checksum],
        base: str | None = None,
        strip_protocol: Any = None,
    ) -> None:
        self.base = base.rstrip("/") if base is not None else None
        if self.base is None:
            self.entries = dict(entries)
        else:
            self.entries = {
                _resolve_name(self.base, name, strip_protocol): checksum
                for name, checksum in entries.items()
            }

    def __len__(self) -> int:
        return len(self.entries)

    def lookup(self, path: str) -> Checksum | None:
        """The expected checksum of ``path`` (backend path form), or None if not listed.

        A URL's query string (a signed URL's signature, expiry...) is ignored when the path
        with it is not listed."""
        found = self._lookup(path)
        if found is None and _without_query(path) != path:
            found = self._lookup(_without_query(path))
        return found

    def _lookup(self, path: str) -> Checksum | None:
        if self.base is not None:
            return self.entries.get(_normalize_path(path))
        if path in self.entries:
            return self.entries[path]
        matches = [key for key in self.entries if path.endswith("/" + key.lstrip("/"))]
        if not matches:
            return None
        return self.entries[max(matches, key=len)]


def _without_query(path: str) -> str:
    """``path`` without its query string when it is a URL (object keys may contain "?")."""
    return path.split("?", 1)[0] if "://" in path else path


def _normalize_name(name: str) -> str:
    """A manifest name as written, tidied: ``./a/../b.tar`` -> ``b.tar``; URLs stay as they are."""
    name = name.strip()
    if "://" in name:
        return name
    name = posixpath.normpath(name)
    return name[2:] if name.startswith("./") else name


def _normalize_path(path: str) -> str:
    return path if "://" in path else posixpath.normpath(path)


def _resolve_name(base: str, name: str, strip_protocol: Any) -> str:
    """The full backend path a manifest name stands for, in a manifest whose directory is
    ``base``."""
    if "://" in name:
        return strip_protocol(name) if strip_protocol is not None else name
    if name.startswith("/"):
        return _normalize_path(name)
    return _normalize_path(f"{base}/{name}") if base else name


def manifest_from_mapping(mapping: Mapping[str, str], strip_protocol: Any = None) -> Manifest:
    """A manifest from ``{path_or_url: "sha256:<hex>", ...}``.

    ``strip_protocol`` (the backend's ``_strip_protocol``) turns URL keys into backend paths;
    other keys stay as written (a bare name matches by trailing path components).
    """
    entries = {}
    for key, value in mapping.items():
        if not isinstance(key, str):
            raise ValueError(f"invalid checksums key {key!r}: expected a path string")
        path = strip_protocol(key) if strip_protocol is not None and "://" in key else key
        try:
            entries[path] = value if isinstance(value, Checksum) else parse_checksum(value)
        except ValueError as exc:
            raise ValueError(f"checksums entry for {redact_url(key)}: {exc}") from None
    return Manifest(entries)


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
        name = _normalize_name(match.group("name"))
        if name in entries and entries[name] != checksum:
            raise ValueError(
                f"{where}: {redact_url(name)} is listed again with another checksum "
                f"(first on line {lines[name]})"
            )
        entries[name] = checksum
        lines.setdefault(name, number)
    return entries


def load_manifest(source: str | Mapping[str, str], backend: Any) -> Manifest:
    """Load the ``checksums`` option: a mapping, or the path/URL of a sums file.

    A path without protocol, or a URL of the backend's own protocol, is read through the
    backend and its names resolve against the file's directory; a URL of another protocol is
    read through fsspec and its names match object paths by their trailing components.
    """
    if isinstance(source, Mapping):
        return manifest_from_mapping(source, backend._strip_protocol)
    if not isinstance(source, str):
        raise ValueError(
            f"invalid value for option 'checksums': expected a mapping or a path, got {source!r}"
        )
    protocol = source.split("://", 1)[0] if "://" in source else None
    own = backend.protocol if isinstance(backend.protocol, tuple) else (backend.protocol,)
    if protocol is None or protocol in own:
        path = backend._strip_protocol(source)
        text = backend.cat_file(path).decode("utf-8")
        base = posixpath.dirname(_without_query(path))
    else:
        import fsspec

        with fsspec.open(source, "rt", encoding="utf-8") as handle:
            text = handle.read()
        base = None
    entries = parse_sums_file(text, source)
    logger.info("loaded %d checksums from %s", len(entries), redact_url(source))

    def strip_own_protocol(url: str) -> str:
        return backend._strip_protocol(url) if url.split("://", 1)[0] in own else url

    return Manifest(entries, base, strip_own_protocol if base is not None else None)


def format_sums_line(checksum: Checksum, name: str) -> str:
    """One manifest line in ``sha256sum`` format (binary marker), for writers of manifests."""
    digest = checksum.hexdigest if checksum.algorithm == "sha256" else str(checksum)
    return f"{digest} *{name}"


def choose_expected(
    manifest: Checksum | None, backend: list[Checksum], verify: str | bool
) -> Checksum | None:
    """The checksum to verify under ``verify``: the manifest's first, else the strongest the
    backend gives; None with ``verify="size"`` or ``False``."""
    if verify != "auto":
        return None
    if manifest is not None:
        return manifest
    if not backend:
        return None
    return max(backend, key=lambda checksum: checksum.strength)


def parse_verify(value: Any) -> str | bool:
    """Validate the ``verify`` option: ``"auto"``, ``"size"`` or ``False`` (strings from the
    environment like ``"false"``/``"0"`` mean False; ``True`` means ``"auto"``)."""
    if value is True:
        return "auto"
    if value is False or value is None:
        return False
    if isinstance(value, str):
        text = value.strip().lower()
        if text == "auto" or bool_word(text) is True:
            return "auto"
        if text == "size":
            return "size"
        if text == "none" or bool_word(text) is False:
            return False
    raise ValueError(
        f"invalid value {value!r} for option 'verify': expected 'auto', 'size' or False"
    )
