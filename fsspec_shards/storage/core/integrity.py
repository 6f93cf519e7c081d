"""Manifests and the choice of what to verify.

A manifest maps object paths to checksums; it comes from a mapping or from a
``SHA256SUMS``-style file whose names are relative to the file's own location. A block
manifest beside that file (``SHA256SUMS.blocks``) is found and loaded with it: it adds, per
object, a SHA-256 per block, so a reader can be handed each block once it is verified
(``transfer/blocks.py``). The formats
themselves (checksums, hashers, sums files) live in :mod:`fsspec_shards.checksums`; the
names storage uses are re-exported here.
"""

from __future__ import annotations

import functools
import logging
import posixpath
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fsspec_shards.checksums import (
    BlockList,
    Checksum,
    StreamingHasher,
    block_manifest_name,
    decode_text,
    parse_block_manifest,
    parse_checksum,
    parse_sums_file,
)
from fsspec_shards.redact import redact_url
from fsspec_shards.shard_names import by_trailing_path
from fsspec_shards.storage.core.verification import Known
from fsspec_shards.storage.deps.fsspec import strip_protocol

__all__ = [
    "Checksum",
    "Manifest",
    "StreamingHasher",
    "load_manifest",
    "manifest_from_mapping",
    "parse_checksum",
]

logger = logging.getLogger("fsspec_shards.storage.core.integrity")


class Manifest:
    """Expected checksums by object path.

    With ``base`` (the manifest file's directory, in the backend's path form) each relative
    name resolves against it, and an absolute name (``/path``, or a URL, turned into a backend
    path by ``strip_protocol`` when given) stands for itself: :attr:`entries` is then keyed by
    full backend paths. Without ``base`` (a mapping given in code), a key matches a path
    exactly, or as its trailing path components, e.g. ``"train-0001.tar"`` matches
    ``"bucket/data/train-0001.tar"``. ``blocks`` (from a block manifest) are keyed and
    looked up the same way.
    """

    def __init__(
        self,
        entries: Mapping[str, Checksum],
        base: str | None = None,
        strip_protocol: Any = None,
        blocks: Mapping[str, BlockList] | None = None,
        source: str = "the checksums option",
        blocks_source: str = "",
    ) -> None:
        self.base = base.rstrip("/") if base is not None else None
        self.entries = self._keyed(entries, strip_protocol)
        self.blocks = self._keyed(blocks or {}, strip_protocol)
        self.source = source
        """The manifest's name in messages (redacted)."""
        self.blocks_source = blocks_source
        """Its block manifest's name in messages (redacted; empty without one)."""

    def _keyed(self, entries: Mapping[str, Any], strip_protocol: Any) -> dict[str, Any]:
        if self.base is None:
            return dict(entries)
        return {
            _resolve_name(self.base, name, strip_protocol): value for name, value in entries.items()
        }

    def __len__(self) -> int:
        return len(self.entries)

    def lookup(self, path: str) -> Checksum | None:
        """The expected checksum of ``path`` (backend path form), or None if not listed.

        A URL's query string (a signed URL's signature, expiry...) is ignored when the path
        with it is not listed."""
        found = self._lookup(self.entries, path)
        if found is None and _without_query(path) != path:
            found = self._lookup(self.entries, _without_query(path))
        if found is None:
            blocks = self.lookup_blocks(path)
            return None if blocks is None else blocks.checksum
        return found

    def known(self, path: str) -> list[Known]:
        """Every checksum the manifests give ``path``: its sums file line and its block
        manifest's whole-file SHA-256, each named by its source (``verification.py``
        checks them all)."""
        found = []
        line = self._lookup(self.entries, path)
        if line is None and _without_query(path) != path:
            line = self._lookup(self.entries, _without_query(path))
        if line is not None:
            found.append(Known(line, f"manifest {self.source}"))
        blocks = self.lookup_blocks(path)
        if blocks is not None:
            found.append(Known(blocks.checksum, f"block manifest {self.blocks_source}"))
        return found

    def lookup_blocks(self, path: str) -> BlockList | None:
        """The block list of ``path`` from the block manifest, or None if it has none."""
        if not self.blocks:
            return None
        found = self._lookup(self.blocks, path)
        if found is None and _without_query(path) != path:
            found = self._lookup(self.blocks, _without_query(path))
        return found

    def _lookup(self, entries: dict[str, Any], path: str) -> Any:
        if self.base is not None:
            return entries.get(_normalize_path(path))
        return by_trailing_path(entries, path)


def _without_query(path: str) -> str:
    """``path`` without its query string when it is a URL (object keys may contain "?")."""
    return path.split("?", 1)[0] if "://" in path else path


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

    ``strip_protocol`` (the backend's) turns URL keys into backend paths;
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


def load_manifest(
    source: str | Mapping[str, str],
    backend: Any,
    read_own: Callable[[str], bytes] | None = None,
) -> Manifest:
    """Load the ``checksums`` option: a mapping, or the path/URL of a sums file and, when
    there is one beside it, its block manifest (``<sums file>.blocks``).

    A path without protocol, or a URL of the backend's own protocol, is read through the
    backend (``read_own`` of its backend path where given: the transport downloads use) and
    its names resolve against the file's directory; a URL of another protocol is read
    through fsspec and its names match object paths by their trailing components.
    A block manifest whose whole-file digest of an object disagrees with the sums file's is
    an error naming both (one of them is stale).
    """
    if isinstance(source, Mapping):
        return manifest_from_mapping(source, functools.partial(strip_protocol, backend))
    if not isinstance(source, str):
        raise ValueError(
            f"invalid value for option 'checksums': expected a mapping or a path, got {source!r}"
        )
    protocol = source.split("://", 1)[0] if "://" in source else None
    own = backend.protocol if isinstance(backend.protocol, tuple) else (backend.protocol,)
    if protocol is None or protocol in own:
        path = strip_protocol(backend, source)
        base = posixpath.dirname(_without_query(path))

        def read(location: str) -> bytes:
            return (read_own or backend.cat_file)(strip_protocol(backend, location))
    else:
        base = None

        def read(location: str) -> bytes:
            import fsspec

            with fsspec.open(location, "rb") as handle:
                return handle.read()

    blocks_source = _block_manifest_beside(source)
    # the two files are read at once: a DataLoader worker's first file waits for one GET
    with ThreadPoolExecutor(1, thread_name_prefix="wds-block-manifest") as beside:
        blocks_read = beside.submit(_read_block_manifest, read, blocks_source)
        entries = parse_sums_file(decode_text(read(source), "manifest", source), source)
        blocks = blocks_read.result()
    _check_agreement(entries, blocks, source, blocks_source)
    logger.info(
        "loaded %d checksums from %s%s",
        len(entries),
        redact_url(source),
        f" and {len(blocks)} block lists from its block manifest" if blocks else "",
    )

    def strip_own_protocol(url: str) -> str:
        return strip_protocol(backend, url) if url.split("://", 1)[0] in own else url

    return Manifest(
        entries,
        base,
        strip_own_protocol if base is not None else None,
        blocks,
        redact_url(source),
        redact_url(blocks_source) if blocks else "",
    )


def _block_manifest_beside(source: str) -> str:
    """Where the block manifest of the sums file ``source`` lies (a URL's query kept)."""
    location, mark, query = source.partition("?") if "://" in source else (source, "", "")
    return block_manifest_name(location) + mark + query


def _read_block_manifest(read: Any, location: str) -> dict[str, BlockList]:
    """The block manifest at ``location``; none when there is no such file (or it may not be
    read: then a warning names it, and objects are verified whole)."""
    try:
        data = read(location)
    except FileNotFoundError:
        logger.debug("no block manifest at %s", redact_url(location))
        return {}
    except PermissionError as exc:
        logger.warning(
            "block manifest %s cannot be read (%s): verifying whole files only",
            redact_url(location),
            exc.strerror or type(exc).__name__,
        )
        return {}
    return parse_block_manifest(decode_text(data, "block manifest", location), location)


def _check_agreement(
    entries: dict[str, Checksum], blocks: dict[str, BlockList], source: str, blocks_source: str
) -> None:
    for name, listed in blocks.items():
        checksum = entries.get(name)
        if checksum is not None and checksum.algorithm == "sha256" and checksum != listed.checksum:
            raise ValueError(
                f"block manifest {redact_url(blocks_source)} lists {redact_url(name)} with "
                f"sha256 {listed.sha256}, manifest {redact_url(source)} with {checksum.hexdigest}: "
                "one of them is stale (write both again, e.g. with fsspec-shards manifest --blocks)"
            )
