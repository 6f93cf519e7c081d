"""IndexedShardDataset: random access (``ds[i]``, ``len(ds)``) to the samples of shards.

Sample ``i`` is the ``i``-th sample of the shards taken in URL order and, inside a shard, in
tar order; ``ds[i]`` is the dict :class:`~fsspec_shards.ShardDataset` yields for it. Each
shard's sample offsets come from its index (:mod:`.shard_index`): given, found beside the
shards, or built from the tar headers. The dataset holds no position, so any sampler drives
it (``DistributedSampler`` included) and resuming is the sampler's business.

A sample of a plain tar is one ranged read of its bytes. Through ``wds::`` with the cache on
(``ranged_reads="cache"``, the default), the first read of a shard fills the cache with the
whole verified shard, whose cached copy stays open (up to ``OPEN_SHARDS`` per process, the
least recently read closed first): every later read is a local seek and read, with no cache
lookup. Otherwise each read is ``cat_file(path, start, end)``: with ``ranged_reads="direct"``
just the range from the backend (identity- and size-checked, not checksum-verified), and a
ranged GET on a backend read without ``wds::``. A compressed shard (``.tar.gz``,
``.tar.zst``) cannot be read at an offset: it is decompressed from its start (through the
cache, so downloaded once) to the sample, and the decompressed stream is kept open, so that
reading the samples of one shard in order decompresses it once.
"""

from __future__ import annotations

import bisect
import logging
import operator
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from itertools import accumulate
from typing import Any

from fsspec_shards.config import DEFAULT_MAX_MEMBER_SIZE
from fsspec_shards.errors import ShardFormatError
from fsspec_shards.iteration.reader import ShardReader
from fsspec_shards.iteration.samples import RawSample, group_samples, to_dict
from fsspec_shards.iteration.shard_index import (
    ShardIndex,
    discover,
    find_index,
    index_of_samples,
    load_index,
)
from fsspec_shards.iteration.tar import is_compressed_file, parse_members
from fsspec_shards.iteration.transforms import Batched
from fsspec_shards.iteration.urls import expand_urls
from fsspec_shards.redact import clean_error, redact_url

try:
    from torch.utils.data import Dataset as _DatasetBase
except ImportError:
    _DatasetBase = object

logger = logging.getLogger("fsspec_shards.dataset")

INDEX_THREADS = 8
OPEN_SHARDS = 8


class _Shard:
    """What one process learned of a shard on its first read: filesystem, path, kind, and
    whether its cached copy is worth keeping open (``wds::`` with the cache on)."""

    __slots__ = ("compressed", "fs", "keep_open", "path")

    def __init__(self, fs: Any, path: str, compressed: bool) -> None:
        self.fs = fs
        self.path = path
        self.compressed = compressed
        options = getattr(fs, "options", None)  # a wds filesystem's
        self.keep_open = getattr(options, "ranged_reads", None) == "cache"


class IndexedShardDataset(_DatasetBase):
    """A map-style dataset over webdataset-format shards: ``len(ds)`` and ``ds[i]``.

    ``urls`` and ``storage_options`` are as for ``ShardDataset``. ``transforms`` are
    per-sample callables applied to every sample dict (one returning ``None`` is an error:
    a map-style dataset cannot drop a sample). ``index`` is the sample index: a
    ``{shard name: ShardIndex}`` mapping or the path/URL of a ``sample-index.json``;
    ``None`` (default) looks for ``sample-index.json`` beside the shards; ``False`` looks
    nowhere. Shards the index does not name are indexed from their tar headers now.
    ``max_member_size`` bounds every member read, as in ``ShardDataset``.
    """

    def __init__(
        self,
        urls: str | os.PathLike | Sequence[str | os.PathLike],
        storage_options: Mapping[str, Any] | None = None,
        *,
        transforms: Sequence[Callable[[dict], Any]] = (),
        index: Mapping[str, ShardIndex] | str | os.PathLike | bool | None = None,
        max_member_size: int | str = DEFAULT_MAX_MEMBER_SIZE,
    ) -> None:
        self.urls = expand_urls(urls)
        self.transforms = tuple(transforms)
        if not all(callable(step) for step in self.transforms) or any(
            isinstance(step, Batched) for step in self.transforms
        ):
            raise ValueError(
                f"transforms must be per-sample callables (no batched()), got {self.transforms!r}"
            )
        self.reader = ShardReader(storage_options, max_member_size)
        self.indexes = self._indexes(index)
        self._ends = list(accumulate(entry.samples for entry in self.indexes))
        self._forget_opened()

    def _indexes(self, index: Any) -> list[ShardIndex]:
        """Every shard's index: from ``index``, else found beside the shards, else built."""
        if index is None:
            table = discover(self.urls, self.reader.storage_options)
        elif index is False:
            table = {}
        elif isinstance(index, (str, os.PathLike, Mapping)):
            source = os.fspath(index) if isinstance(index, os.PathLike) else index
            table = load_index(source, self.reader.storage_options)
        else:
            raise TypeError(f"index must be a mapping, a path/URL, None or False, not {index!r}")
        found = [find_index(table, url) for url in self.urls]
        missing = [number for number, entry in enumerate(found) if entry is None]
        if missing:
            logger.info("indexing %d shards from their tar headers", len(missing))
            with ThreadPoolExecutor(max_workers=min(INDEX_THREADS, len(missing))) as pool:
                built = pool.map(lambda number: self.index_shard(self.urls[number]), missing)
                for number, entry in zip(missing, built, strict=True):
                    found[number] = entry
        return found

    def index_shard(self, url: str) -> ShardIndex:
        """A shard's index, from a scan of its tar headers (payloads are sought over)."""
        try:
            fs, path = self.reader.locate(url)
            size = int(fs.size(path))
            return index_of_samples(size, self.reader.samples(url, headers_only=True))
        except Exception as exc:
            error = exc
        raise clean_error(error, url)

    def __len__(self) -> int:
        return self._ends[-1] if self._ends else 0

    def __getitem__(self, item: int) -> Any:
        """Sample ``item`` (negative counts from the end) as ``ShardDataset`` yields it."""
        try:
            number = operator.index(item)
        except TypeError:
            raise TypeError(f"sample indices must be integers, not {type(item).__name__}") from None
        total = len(self)
        if number < 0:
            number += total
        if not 0 <= number < total:
            raise IndexError(f"sample index {item} out of range for {total} samples")
        if self._pid != os.getpid():
            self._forget_opened()
        shard = bisect.bisect_right(self._ends, number)
        sample = number - (self._ends[shard - 1] if shard else 0)
        return self._prepare(self._read(shard, sample), number)

    def _forget_opened(self) -> None:
        """Start without what was opened: in a new dataset, and in a process forked from the
        one that opened it (a forked DataLoader worker), whose file offsets it would share."""
        self._pid = os.getpid()
        self._shards: dict[int, _Shard] = {}
        self._lock = threading.Lock()
        self._stream: tuple[int, Iterator[RawSample], int] | None = None
        self._handles: OrderedDict[int, Any] = OrderedDict()

    def __getstate__(self) -> dict[str, Any]:
        """Pickled for DataLoader workers without what one process opened."""
        state = self.__dict__.copy()
        for name in ("_pid", "_shards", "_lock", "_stream", "_handles"):
            del state[name]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._forget_opened()

    # --- reading -------------------------------------------------------------------------

    def _read(self, shard: int, sample: int) -> RawSample:
        url = self.urls[shard]
        start, end = self.indexes[shard].span(sample)
        try:
            opened = self._open(shard)
            if opened.compressed:
                return self._read_compressed(shard, start)
            if opened.keep_open:
                blob = self._read_open(shard, opened, start, end)
            else:
                blob = opened.fs.cat_file(opened.path, start=start, end=end)
            try:
                members = parse_members(blob, url, start, self.reader.max_member_size)
                samples = list(group_samples(members, url))
            except ShardFormatError as exc:
                reason = f"{exc.reason}, reading the range the sample index gives ({start}-{end})"
                raise ShardFormatError(url, exc.offset, reason) from None
            if len(blob) == end - start and len(samples) == 1 and samples[0].offset == start:
                return samples[0]
            raise _mismatch(url, start)
        except Exception as exc:
            error = exc
        raise clean_error(error, url)

    def _open(self, shard: int) -> _Shard:
        """The shard's filesystem and kind; on its first read here, its size is checked
        against the index (an index of another version of the shard is refused)."""
        opened = self._shards.get(shard)
        if opened is None:
            url = self.urls[shard]
            fs, path = self.reader.locate(url)
            size = int(fs.size(path))
            expected = self.indexes[shard].size
            if size != expected:
                raise ValueError(
                    f"the sample index of {redact_url(url)} is of another version of the shard: "
                    f"it says {expected} bytes, the shard has {size}; write the index again "
                    "(fsspec-shards manifest --index) or pass index=False"
                )
            opened = self._shards[shard] = _Shard(fs, path, is_compressed_file(fs, path))
        return opened

    def _read_open(self, shard: int, opened: _Shard, start: int, end: int) -> bytes:
        """``[start, end)`` of the shard's cached copy, opened on its first read and kept
        open among the ``OPEN_SHARDS`` most recently read."""
        with self._lock:
            handle = self._handles.get(shard)
            if handle is None:
                handle = self._handles[shard] = opened.fs.open(opened.path, "rb")
                if len(self._handles) > OPEN_SHARDS:
                    self._handles.popitem(last=False)[1].close()
            else:
                self._handles.move_to_end(shard)
            handle.seek(start)
            return handle.read(end - start)

    def _read_compressed(self, shard: int, start: int) -> RawSample:
        """The sample at ``start`` of a compressed shard: read on from the open stream when it
        is of this shard and not past ``start``, else decompressed from the shard's start."""
        url = self.urls[shard]
        with self._lock:
            stream = self._stream
            self._stream = None
            if stream is None or stream[0] != shard or stream[2] > start:
                if stream is not None:
                    stream[1].close()
                stream = (shard, self.reader.samples(url, start), start)
            samples = stream[1]
            for sample in samples:
                if sample.offset >= start:
                    break
            else:
                raise _mismatch(url, start)
            if sample.offset != start:
                samples.close()
                raise _mismatch(url, start)
            self._stream = (shard, samples, sample.end)
            return sample

    def _prepare(self, sample: RawSample, number: int) -> Any:
        """The sample dict, ``__url__`` shown without secrets, through the transforms."""
        result = to_dict(sample)
        result["__url__"] = redact_url(sample.url)
        for transform in self.transforms:
            result = transform(result)
            if result is None:
                raise ValueError(
                    f"a transform dropped sample {number} ({sample.key!r} of "
                    f"{redact_url(sample.url)}): a map-style dataset cannot drop samples"
                )
        return result

    def __repr__(self) -> str:
        return f"IndexedShardDataset({len(self.urls)} shards, {len(self)} samples)"


def _mismatch(url: str, start: int) -> ShardFormatError:
    return ShardFormatError(
        url, start, "no sample starts here as the sample index says: the shard changed since"
    )
