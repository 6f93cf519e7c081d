"""The file objects ``WdsFileSystem.open`` returns.

They hold the filesystem as fsspec's base class (``AbstractFileSystem``): the wds filesystem
imports this module, so this one does not import it back, not even for annotations.

- :class:`CachedFile`: the verified local copy (or a spooled uncached one), pickled as
  "open this path again here", with fsspec's file interface (``size``, ``info()``,
  ``loc``, ``details``), as :class:`RetryingFile` has from fsspec's base class.
- :class:`RetryingFile`: ranged reads straight from the backend (``cache=False`` or
  ``ranged_reads="direct"``), each retried and resumed, every one of the version the file
  was opened on; read start to end, it is verified as the last byte arrives. A server whose
  answers prove no version (``versions.Unproven``) gets the object read whole once, into a
  temporary file the reads are then served from; if bytes were handed out before, the read
  fails instead.
- :class:`BlockCheckedFile`: a :class:`RetryingFile` whose reads are checked block by block
  against the block manifest (``cache=False`` with one), the rule of
  ``transfer/blocks.py`` on streamed reads.
- :class:`DropCachedOnClose`: a backend file open for writing; closing it, and committing or
  discarding it (a transaction's file is written at the commit), drops the cached copy, so
  no later read is served the old version.
"""

from __future__ import annotations

import errno
import hashlib
import io
import logging
import os
import tempfile
from typing import Any, BinaryIO

from fsspec.spec import AbstractBufferedFile, AbstractFileSystem

from fsspec_shards.checksums import BlockList
from fsspec_shards.errors import IntegrityError
from fsspec_shards.redact import raising_clean
from fsspec_shards.storage.backends.versions import Unproven, VersionMismatch
from fsspec_shards.storage.core.verification import WholeHasher
from fsspec_shards.storage.transfer import planner
from fsspec_shards.storage.transfer.one_stream import read_range
from fsspec_shards.storage.transfer.target import INTEGRITY_PASSES, Target
from fsspec_shards.storage.transfer.whole_file import check_listed_size

logger = logging.getLogger("fsspec_shards.storage.files")


class DropCachedOnClose(io.RawIOBase):
    """A backend file opened for writing; closing, committing or discarding it drops the
    cached copy of the path."""

    def __init__(self, handle: Any, drop: Any) -> None:
        super().__init__()
        self._handle = handle
        self._drop = drop

    def __getattr__(self, name: str) -> Any:
        if name == "_handle":  # not yet set: the constructor failed
            raise AttributeError(name)
        return getattr(self._handle, name)

    def writable(self) -> bool:
        return True

    def readable(self) -> bool:
        return False

    def seekable(self) -> bool:
        return False

    def write(self, data: Any) -> int:
        return self._handle.write(data)

    def flush(self) -> None:
        if not self._handle.closed:
            self._handle.flush()

    def tell(self) -> int:
        return self._handle.tell()

    def close(self) -> None:
        if self.closed:
            return
        try:
            self._handle.close()
        finally:
            super().close()
            self._drop()

    def commit(self) -> None:
        """Make the file written with ``autocommit=False`` (in a transaction) what the path
        holds; what was cached or read meanwhile is dropped after."""
        try:
            self._handle.commit()
        finally:
            self._drop()

    def discard(self) -> None:
        """Abandon the file written with ``autocommit=False``."""
        try:
            self._handle.discard()
        finally:
            self._drop()


class CachedFile(io.BufferedReader):
    """The cached copy of a file, open for reading. It pickles as "open this path again at
    this position", as fsspec's own files do (dask ships open files to its workers)."""

    def __init__(self, raw: io.RawIOBase, wds: AbstractFileSystem, path: str) -> None:
        super().__init__(raw)
        self.fs = wds
        self.path = path

    @property
    def size(self) -> int:
        """The size of the version open (a copy still filling has its final size)."""
        size = getattr(self.raw, "size", None)
        return os.fstat(self.raw.fileno()).st_size if size is None else size

    @property
    def loc(self) -> int:
        """The position, as fsspec's files name it."""
        return self.tell()

    def info(self) -> dict[str, Any]:
        """What fsspec's ``info()`` gives of the version open: name, size and type."""
        return {"name": self.path, "size": self.size, "type": "file"}

    @property
    def details(self) -> dict[str, Any]:
        return self.info()

    def __reduce__(self):
        return _reopen, (self.fs, self.path, 0 if self.closed else self.tell())


def _reopen(fs: AbstractFileSystem, path: str, position: int) -> BinaryIO:
    handle = fs.open(path, "rb")
    handle.seek(position)
    return handle


class RetryingFile(AbstractBufferedFile):
    """A seekable read-only file over the backend whose ranged reads are retried and resumed.

    Every read is of the version the file was opened on (identity and size checked on each
    response; another version raises an ``OSError``, never mixed bytes). When the file is
    read start to end, its checksum is checked as the last byte arrives and a mismatch
    raises ``IntegrityError``.
    """

    def __init__(
        self,
        wds: AbstractFileSystem,
        target: Target,
        info: dict,
        block_size: int,
        blocks: BlockList | None = None,
    ) -> None:
        self.target = target
        expected = target.expect(info, blocks)
        self.version = expected.version
        self._expected = expected.checksums
        self._identity = expected.identity
        self._hasher = WholeHasher(self._expected.algorithms) if self._expected else None
        self._hashed_until = 0
        self._info = info
        self._spool: BinaryIO | None = None  # the whole object, when answers prove nothing
        self._handed_out = False
        super().__init__(
            wds,
            target.path,
            mode="rb",
            block_size=block_size,
            cache_type="readahead",
            size=info.get("size"),
        )

    @raising_clean
    def _fetch_range(self, start: int, end: int) -> bytes:
        end = min(end, self.size)
        if start >= end:
            return b""
        if self._spool is None:
            try:
                data = read_range(
                    self.target,
                    start,
                    end,
                    self.version,
                    lambda n: self.target.incr("bytes_downloaded", n),
                )
            except Unproven as exc:
                self._spool = self._read_whole(exc)
            else:
                self._handed_out = True
                if self.version.unproven_whole and start == 0 and len(data) == self.size:
                    self._spool = io.BytesIO(data)  # one answer, whole: later reads from it
                self._hash(start, data)
                return data
        self._spool.seek(start)
        return self._spool.read(end - start)

    def close(self) -> None:
        if self._spool is not None:
            self._spool.close()
            self._spool = None
        super().close()

    def _read_whole(self, unproven: Unproven) -> BinaryIO:
        """The object read whole (and verified) into a temporary file: the one shape in
        which answers that prove no version are used. Refused once bytes were handed out
        (they could be another version's than the whole read gives)."""
        shown = self.target.shown
        if self._handed_out:
            raise Unproven(
                errno.ESTALE,
                f"{shown}: {unproven.strerror}; parts of it were read already, so it cannot "
                "be read whole now",
            ) from None
        spool = tempfile.TemporaryFile()  # noqa: SIM115 - kept open for the file's reads
        try:
            result = planner.fill(self.target, spool, self._info)
        except BaseException:
            spool.close()
            raise
        if result["identity"] != self._identity:
            spool.close()
            raise VersionMismatch(errno.ESTALE, f"{shown} changed while it was read")
        self._hasher = None  # verified whole by the download
        return spool

    def _hash(self, start: int, data: bytes) -> None:
        if self._hasher is None or start != self._hashed_until:
            return
        self._hasher.update(data)
        self._hashed_until += len(data)
        if self._hashed_until == self.size:
            mismatch = self._expected.mismatch(self._hasher.checksums())
            self._hasher = None
            if mismatch is not None:
                self.target.incr("integrity_failures")
                raise IntegrityError(
                    self.target.shown,
                    mismatch.expected,
                    mismatch.actual,
                    f"expected by {mismatch.source}; streamed without cache",
                )


class BlockCheckedFile(RetryingFile):
    """A streamed (uncached) file whose reads are checked block by block: each read fetches
    the whole blocks it touches and hands out only what matches the block manifest; a bad
    block is fetched again, and ``IntegrityError`` names it when it stays bad."""

    def __init__(
        self, wds: Any, target: Target, info: dict, block_size: int, blocks: BlockList
    ) -> None:
        self.blocks = blocks
        self._held: dict[int, bytes] = {}
        check_listed_size(target, blocks, info.get("size"))
        # every block is checked: answers need no proof (Target.expect with blocks)
        super().__init__(wds, target, info, max(block_size, blocks.block_size), blocks)

    @raising_clean
    def _fetch_range(self, start: int, end: int) -> bytes:
        end = min(end, self.size)
        if start >= end:
            return b""
        first, last = self.blocks.block_at(start), self.blocks.block_at(end - 1)
        pieces = self._blocks(first, last + 1)
        self._held = {index: pieces[index - first] for index in (first, last)}
        offset = self.blocks.bounds(first)[0]
        data = b"".join(pieces)[start - offset : end - offset]
        self._hash(start, data)  # read start to end: the whole file is checked too
        return data

    def _blocks(self, first: int, last: int) -> list[bytes]:
        """Blocks ``[first, last)``, verified: the ones not held read in one request, a bad
        one read again on its own."""
        held = [self._held.get(index) for index in range(first, last)]
        missing = [first + i for i, data in enumerate(held) if data is None]
        if missing:
            begin, end = self.blocks.bounds(missing[0])[0], self.blocks.bounds(missing[-1])[1]
            data = self._read(begin, end)
            for index in missing:
                start, stop = self.blocks.bounds(index)
                held[index - first] = self._verified(index, data[start - begin : stop - begin])
        return held

    def _read(self, start: int, end: int) -> bytes:
        return read_range(
            self.target, start, end, self.version, lambda n: self.target.incr("bytes_downloaded", n)
        )

    def _verified(self, index: int, data: bytes) -> bytes:
        """Block ``index`` as listed: ``data`` if it matches, else read again (until the
        passes are spent: then ``IntegrityError`` naming the block)."""
        start, end = self.blocks.bounds(index)
        for passes in range(1, INTEGRITY_PASSES + 1):
            actual = hashlib.sha256(data).hexdigest()
            if actual == self.blocks.blocks[index]:
                return data
            self.target.incr("integrity_failures")
            if passes == INTEGRITY_PASSES:
                raise IntegrityError(
                    self.target.shown,
                    f"sha256:{self.blocks.blocks[index]}",
                    f"sha256:{actual}",
                    f"block {index} (bytes {start}-{end}), after {passes} downloads, streamed "
                    "without cache; nothing past it was handed out",
                )
            logger.warning(
                "integrity check failed for %s block %d: fetching it again",
                self.target.shown,
                index,
            )
            data = self._read(start, end)
        raise AssertionError("unreachable")
