"""Write samples into webdataset-format tar shards at any fsspec URL.

:class:`ShardWriter` fills ``pattern % index`` shards in turn, rolling over to the next
shard at ``max_count`` samples or before ``max_size`` bytes. Invariants:

- A shard appears under its final name only when it is complete. It is assembled in this
  writer's spool directory (:mod:`.spool`): on a local filesystem one beside the shards, then
  synced and renamed into place; on any other backend one under ``spool_dir``, then uploaded
  whole (object stores show an object only when its upload completes). An exception inside
  the ``with`` block, or a crash, leaves no partial shard under a final name, and the next
  writer over the same spool directory removes what a dead writer left there.
- Every member reads back as the key and field it was written from (:mod:`.encoding`), and a
  sample is never merged with the one before it: a repeated key in a row is refused.
- On a clean ``close()``, ``SHA256SUMS`` (GNU ``sha256sum`` format, names relative to the
  shards' directory), its block manifest ``SHA256SUMS.blocks`` (both written by
  :mod:`fsspec_shards.checksums`, as ``fsspec-shards manifest --blocks`` writes them), the
  sample-count sidecar ``sample-counts.json`` (``{shard file name: samples}``, as
  ``ShardDataset(samples_per_shard=...)`` reads it) and the sample index
  ``sample-index.json`` (:mod:`.shard_index`: where each sample starts, for
  ``IndexedShardDataset``) are written beside the shards, listing
  exactly the shards this writer wrote. Those names are removed when the writer starts, so
  they are present only after a clean close, and then describe exactly the shards that run
  wrote (shards of an earlier run past its last index stay, unlisted).
- No member is larger than readers take by default (``max_member_size``), and no error
  leaving the writer shows a secret of ``pattern`` (:func:`fsspec_shards.redact.clean_error`).

Writes go through fsspec only (``fsspec.core.url_to_fs``), so ``wds::`` URLs drop cached
copies of what they overwrite; the storage layer is never imported.
"""

from __future__ import annotations

import functools
import gzip
import json
import logging
import os
import tarfile
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, BinaryIO

import fsspec

from fsspec_shards.checksums import (
    DEFAULT_BLOCK_SIZE,
    SUMS_NAME,
    BlockHasher,
    BlockList,
    block_manifest_name,
    check_block_size,
    format_block_manifest,
    format_sums,
)
from fsspec_shards.config import DEFAULT_MAX_MEMBER_SIZE, is_int, parse_max_member_size, parse_size
from fsspec_shards.iteration import zstd
from fsspec_shards.iteration.encoding import encode_sample
from fsspec_shards.iteration.shard_index import DEFAULT_INDEX, build_index, format_index
from fsspec_shards.iteration.spool import Spool
from fsspec_shards.option_shapes import fsspec_arguments
from fsspec_shards.redact import clean_error, redact_url
from fsspec_shards.tar_blocks import BLOCK_SIZE, padded

logger = logging.getLogger("fsspec_shards.writer")

DEFAULT_COUNTS = "sample-counts.json"
_END_OF_ARCHIVE = bytes(2 * BLOCK_SIZE)
_GZIP_SUFFIXES = (".gz", ".tgz")
_LOCAL_PROTOCOLS = frozenset(("file", "local"))


@dataclass(frozen=True)
class WrittenShard:
    """A shard this writer completed: its URL, file name, samples, size, SHA-256, blocks and
    where each sample starts in the tar (``starts``) and the last one ends (``tar_end``)."""

    url: str
    name: str
    samples: int
    size: int
    sha256: str
    blocks: BlockList
    starts: tuple[int, ...] = ()
    tar_end: int = 0


class _HashingFile:
    """A write-only file that hashes and counts what passes through it."""

    def __init__(self, target: BinaryIO, block_size: int) -> None:
        self.target = target
        self.hasher = BlockHasher(block_size)

    @property
    def size(self) -> int:
        return self.hasher.size

    def write(self, data: bytes) -> int:
        self.hasher.update(data)
        return self.target.write(data)

    def flush(self) -> None:
        self.target.flush()


def _cleaned(method: Callable) -> Callable:
    """A writer method whose exceptions leave it without the secrets of its ``pattern``
    (a signed URL's query), raised outside the ``except`` block so nothing is chained."""

    @functools.wraps(method)
    def wrapper(self: ShardWriter, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except Exception as exc:
            error = exc
        # __init__ can fail before it sets `pattern` (a misspelt keyword): clean with the
        # pattern it was given
        pattern = getattr(self, "pattern", None) or (args[0] if args else kwargs.get("pattern"))
        raise clean_error(error, *([pattern] if isinstance(pattern, str) else []))

    return wrapper


class _OpenShard:
    """The shard being filled: its temporary file, tar stream and counts."""

    def __init__(
        self,
        url: str,
        name: str,
        handle: BinaryIO,
        spool: str,
        compression: str | None,
        block_size: int,
    ) -> None:
        self.url = url
        self.name = name
        self.handle = handle
        self.spool = spool  # the temporary file, in the writer's spool directory
        self.hashing = _HashingFile(handle, block_size)
        if compression == "gzip":
            self.output = gzip.GzipFile(fileobj=self.hashing, mode="wb", mtime=0)
        elif compression == "zstd":
            self.output = zstd.open_writer(self.hashing)
        else:
            self.output = self.hashing
        self.samples = 0
        self.tar_size = 0  # uncompressed tar bytes written, before the end-of-archive blocks
        self.starts: list[int] = []  # where each sample starts in the uncompressed tar
        self.last_key: str | None = None


class ShardWriter:
    """Write samples as webdataset tar shards: ``pattern % index`` for index 0, 1, 2...

    ``pattern`` is any fsspec URL or local path with one integer placeholder in its file name
    (``"s3://bucket/out/train-%06d.tar"``, ``"wds::gs://b/x-%04d.tar.gz"``: ``.gz``/``.tgz``
    shards are gzip-compressed, ``.zst`` ones zstd-compressed); a query (``?sv=...&sig=...``)
    is no part of the names: it is added to the URL of every file written, manifests included.
    A shard holds at most ``max_count`` samples and, unless one sample alone is larger, at
    most ``max_size`` bytes of uncompressed tar (an int or a size such as ``"1GB"``).
    ``storage_options`` go to fsspec as for ``ShardDataset``.
    ``manifest``, ``counts`` and ``index`` name the checksum manifest, the sample-count
    sidecar and the sample index (``IndexedShardDataset`` finds it there) written beside the
    shards on close (``None``: not written); the block manifest
    ``<manifest>.blocks`` lists a SHA-256 per ``manifest_block_size`` bytes of each shard
    (``None``: not written). ``mtime`` is every member's
    modification time (fixed by default, so equal samples make byte-identical shards).
    ``spool_dir`` holds the local temporary copy of a shard bound for a remote backend.
    ``max_member_size`` (default: the reader's default) refuses larger members at write time.

    Use it as a context manager, or call :meth:`close`. See :mod:`.encoding` for the values
    accepted in a sample.
    """

    @_cleaned
    def __init__(
        self,
        pattern: str,
        max_count: int = 100_000,
        max_size: int | str = "3GB",
        *,
        storage_options: Mapping[str, Any] | None = None,
        start_shard: int = 0,
        manifest: str | None = SUMS_NAME,
        counts: str | None = DEFAULT_COUNTS,
        index: str | None = DEFAULT_INDEX,
        manifest_block_size: int | None = DEFAULT_BLOCK_SIZE,
        mtime: float = 0,
        spool_dir: str | None = None,
        max_member_size: int | str = DEFAULT_MAX_MEMBER_SIZE,
    ) -> None:
        self.pattern = pattern
        self.max_member_size = parse_max_member_size(max_member_size)
        if not is_int(max_count) or max_count < 1:
            raise ValueError(f"max_count must be a positive int, got {max_count!r}")
        try:
            self.max_size = parse_size(max_size)
        except ValueError as exc:
            raise ValueError(f"max_size: {exc}") from None
        if self.max_size < 1:
            raise ValueError(f"max_size must be positive, got {max_size!r}")
        if not is_int(start_shard) or start_shard < 0:
            raise ValueError(f"start_shard must be a non-negative int, got {start_shard!r}")
        for option, name in (("manifest", manifest), ("counts", counts), ("index", index)):
            if name is not None and (not name or "/" in name or name.startswith(".")):
                raise ValueError(f"{option} must be a file name beside the shards, got {name!r}")
        if manifest_block_size is not None:
            check_block_size(manifest_block_size)
        self._local = _innermost_protocol(pattern) in _LOCAL_PROTOCOLS
        # A URL's query (a SAS token) signs every object written and is no part of their
        # names; in a local path, '?' is a character of the name.
        path_pattern, mark, query = pattern, "", ""
        if not self._local:
            path_pattern, mark, query = pattern.partition("?")
        self._query = mark + query
        directory, self._name_pattern = _split_pattern(path_pattern)
        self.max_count = max_count
        self.storage_options = dict(storage_options or {})
        self.manifest = manifest
        self.counts = counts
        self.index = index
        self.manifest_block_size = manifest_block_size
        self.mtime = mtime
        self.spool_dir = spool_dir
        self.directory_url = directory
        chained, options = fsspec_arguments(directory, self.storage_options)  # as the reader
        self._fs, self._directory = fsspec.core.url_to_fs(chained, **options)
        self._compression = _compression(self._name_pattern)
        if self._compression == "zstd":
            zstd.require()
        self._next_index = start_shard
        self._shard: _OpenShard | None = None
        self._closed = False
        self.shards: list[WrittenShard] = []
        if self._local:
            self._fs.makedirs(self._directory, exist_ok=True)
            self._spool = Spool(self._directory, "the shards' directory")
        else:
            self._spool = Spool(spool_dir or tempfile.gettempdir(), "spool_dir")
        try:  # last: a writer that cannot start leaves the earlier run's manifests
            self._remove_manifests()
        except BaseException:
            self._spool.close()
            raise

    # --- the user's side ----------------------------------------------------------------

    @_cleaned
    def write(self, sample: Mapping[str, Any]) -> None:
        """Add one sample (``{"__key__": ..., field: value}``) to the current shard."""
        if self._closed:
            raise ValueError("write to a closed ShardWriter")
        key, members = encode_sample(sample, self.max_member_size)
        entries = [(self._header(name, len(data)), data) for name, data in members]
        size = sum(len(header) + padded(len(data)) for header, data in entries)
        shard = self._shard
        if shard is not None and shard.tar_size + size + len(_END_OF_ARCHIVE) > self.max_size:
            self._finish_shard()
            shard = None
        if shard is None:
            shard = self._shard = self._open_shard()
        elif key == shard.last_key:
            raise ValueError(
                f"sample key {key!r} repeats the previous sample's key: readers would merge "
                "the two samples into one"
            )
        try:
            for header, data in entries:
                shard.output.write(header)
                shard.output.write(data)
                shard.output.write(bytes(padded(len(data)) - len(data)))
        except BaseException:
            self.abort()  # the shard holds part of a sample: it must never be published
            raise
        shard.starts.append(shard.tar_size)
        shard.tar_size += size
        shard.samples += 1
        shard.last_key = key
        if shard.samples >= self.max_count:
            self._finish_shard()

    @_cleaned
    def close(self) -> None:
        """Complete the last shard, then write the manifest and the sample-count sidecar."""
        if self._closed:
            return
        if self._shard is not None:
            self._finish_shard()
        self._closed = True
        try:
            self._publish_manifests()
        finally:
            self._spool.close()

    def _publish_manifests(self) -> None:
        if self.manifest is not None:
            sums = format_sums((shard.name, shard.blocks.checksum) for shard in self.shards)
            self._publish_bytes(self.manifest, sums.encode("utf-8"))
            if self.manifest_block_size is not None:
                blocks = format_block_manifest(
                    ((shard.name, shard.blocks) for shard in self.shards), self.manifest_block_size
                )
                self._publish_bytes(block_manifest_name(self.manifest), blocks.encode("utf-8"))
        if self.counts is not None:
            counts = {shard.name: shard.samples for shard in self.shards}
            self._publish_bytes(self.counts, (json.dumps(counts, indent=1) + "\n").encode())
        if self.index is not None:
            indexes = (
                (shard.name, build_index(shard.size, shard.starts, shard.tar_end))
                for shard in self.shards
            )
            self._publish_bytes(self.index, format_index(indexes).encode())

    @_cleaned
    def abort(self) -> None:
        """Drop the shard being written; write no manifest. Completed shards stay."""
        if self._closed:
            return
        self._closed = True
        shard, self._shard = self._shard, None
        try:
            if shard is not None:
                shard.handle.close()
        finally:
            self._spool.close()  # the shard's temporary file with it

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, kind, value, traceback) -> None:
        if kind is None:
            self.close()
        else:
            self.abort()

    @property
    def manifest_url(self) -> str | None:
        """Where the checksum manifest goes, or None."""
        return (
            None if self.manifest is None else f"{self.directory_url}/{self.manifest}{self._query}"
        )

    @property
    def counts_url(self) -> str | None:
        """Where the sample-count sidecar goes (``ShardDataset(samples_per_shard=...)``)."""
        return None if self.counts is None else f"{self.directory_url}/{self.counts}{self._query}"

    # --- shards -------------------------------------------------------------------------

    def _header(self, name: str, size: int) -> bytes:
        info = tarfile.TarInfo(name)
        info.size = size
        info.mtime = self.mtime
        info.mode = 0o444
        return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")

    def _final(self, name: str) -> str:
        """The backend path of file ``name`` beside the shards (with the pattern's query)."""
        return f"{self._directory}/{name}{self._query}"

    def _remove_manifests(self) -> None:
        """Remove the manifests and counts of an earlier run: beside shards this run may
        overwrite, they would describe other bytes unless this run closes cleanly."""
        names = [self.manifest, self.counts, self.index]
        if self.manifest is not None:
            names.append(block_manifest_name(self.manifest))
        for path in [self._final(name) for name in names if name is not None]:
            if self._fs.exists(path):  # asked first: some backends (HTTP) cannot delete
                self._fs.rm_file(path)

    def _open_shard(self) -> _OpenShard:
        name = self._name_pattern % self._next_index
        self._next_index += 1
        url = f"{self.directory_url}/{name}{self._query}"
        spool = self._spool.path(name)
        handle = open(spool, "wb")  # noqa: SIM115 - closed by _finish_shard or abort
        block_size = self.manifest_block_size or DEFAULT_BLOCK_SIZE
        return _OpenShard(url, name, handle, spool, self._compression, block_size)

    def _finish_shard(self) -> None:
        """End the tar, then move or upload it under its final name."""
        shard, self._shard = self._shard, None
        try:
            shard.output.write(_END_OF_ARCHIVE)
            if shard.output is not shard.hashing:
                shard.output.close()
            _sync(shard.handle)
            shard.handle.close()
            final = self._final(shard.name)
            started = time.monotonic()
            if self._local:
                self._fs.mv(shard.spool, final)
            else:
                self._fs.put_file(shard.spool, final)
                os.unlink(shard.spool)
        except BaseException:
            self._shard = shard
            self.abort()
            raise
        blocks = shard.hashing.hasher.block_list()
        written = WrittenShard(
            shard.url,
            shard.name,
            shard.samples,
            blocks.size,
            blocks.sha256,
            blocks,
            tuple(shard.starts),
            shard.tar_size,
        )
        self.shards.append(written)
        logger.info(
            "wrote %s: %d samples, %d bytes in %.1f s",
            redact_url(written.url),
            written.samples,
            written.size,
            time.monotonic() - started,
        )

    def _publish_bytes(self, name: str, data: bytes) -> None:
        """Write a small file beside the shards, whole or not at all."""
        final = self._final(name)
        if self._local:
            spool = self._spool.path(name)
            with open(spool, "wb") as handle:
                handle.write(data)
                _sync(handle)
            self._fs.mv(spool, final)
        else:
            self._fs.pipe_file(final, data)


def _compression(name_pattern: str) -> str | None:
    """How shards named by ``name_pattern`` are compressed: ``"gzip"``, ``"zstd"`` or None."""
    name = name_pattern.lower()
    if name.endswith(_GZIP_SUFFIXES):
        return "gzip"
    return "zstd" if name.endswith(zstd.ZSTD_SUFFIXES) else None


def _sync(handle: BinaryIO) -> None:
    """Flush a spool file to disk, so that a rename publishes whole bytes."""
    handle.flush()
    os.fsync(handle.fileno())


def _innermost_protocol(url: str) -> str:
    """The protocol of the storage a (possibly ``::``-chained) URL finally writes to."""
    target = url.rsplit("::", 1)[-1]
    return target.split("://", 1)[0] if "://" in target else "file"


def _split_pattern(pattern: str) -> tuple[str, str]:
    """(directory URL, file-name pattern), checking the placeholder names distinct files."""
    directory, _, name_pattern = pattern.rpartition("/")
    if "://" not in pattern and "::" not in pattern:
        directory = os.path.abspath(directory or ".")
    try:
        first, second = name_pattern % 0, name_pattern % 1
    except (TypeError, ValueError):
        first = second = None
    if first is None or first == second or "%" in directory or "\n" in first or "\\" in first:
        raise ValueError(
            f"pattern {redact_url(pattern)!r} needs one integer placeholder such as %06d in "
            "its file name (shards share one directory; no newline or backslash)"
        )
    return directory, name_pattern
