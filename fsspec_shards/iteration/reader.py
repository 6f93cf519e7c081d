"""Read samples of one shard through fsspec: from a byte offset, or by byte ranges.

Shards are reached only through fsspec (``url_to_fs``, ``open``, ``cat_ranges``), never by
importing the storage layer. A plain tar on a seekable file is opened and sought to the
offset (compression is told by a four-byte ranged read first, so that no block is read from the
start); a gzip or zstd shard cannot seek, so it is decompressed from its start and the bytes before
the offset are dropped. Samples are streamed member by member: a shard is never held whole.
"""

from __future__ import annotations

import io
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import fsspec

from fsspec_shards.config import DEFAULT_MAX_MEMBER_SIZE, parse_max_member_size
from fsspec_shards.errors import ShardFormatError
from fsspec_shards.iteration.samples import RawSample, group_samples
from fsspec_shards.iteration.tar import (
    COMPRESSED_STREAM_ERRORS,
    is_compressed_file,
    iter_members,
    open_shard_stream,
    parse_members,
)
from fsspec_shards.option_shapes import LAYER, fsspec_arguments

_SKIP_PIECE = 1 << 20


class ShardReader:
    """Opens shard URLs with the dataset's storage options.

    ``max_member_size`` (bytes, or a size such as ``"1GiB"``) bounds every member read: a
    larger one is a :class:`ShardFormatError`, raised from its header before it is read.
    """

    def __init__(
        self,
        storage_options: Mapping[str, Any] | None = None,
        max_member_size: int | str = DEFAULT_MAX_MEMBER_SIZE,
    ) -> None:
        self.storage_options = dict(storage_options or {})
        self.max_member_size = parse_max_member_size(max_member_size)

    def locate(self, url: str) -> tuple[Any, str]:
        """The fsspec filesystem and path of ``url``: options in sections
        (``{"wds": {...}, "s3": {...}}``) read a plain backend URL through the layer, and
        sections the URL does not use are left out (see :mod:`fsspec_shards.option_shapes`)."""
        chained, options = fsspec_arguments(url, self.storage_options)
        if chained.startswith(LAYER + "::"):
            # the layer's from_url resolves what url_to_fs would without importing the
            # backend's class where it can (s3fs: 0.3-0.7 s); None: url_to_fs resolves it
            found = fsspec.get_filesystem_class(LAYER).from_url(chained, **options)
            if found is not None:
                return found
        return fsspec.core.url_to_fs(chained, **options)

    def warm(self, url: str) -> None:
        """Pay the one-time costs of reading ``url`` now: its backend's imports and, for
        ``wds``, its cache directory and index. Called where the dataset is made, so
        DataLoader workers forked later inherit the imports and find the index made instead
        of paying for them before their first sample (fsspec makes a forked child its own
        filesystem instances, so what an instance holds, such as a loaded checksum
        manifest, is not inherited). An error here is left for the first read to raise."""
        try:
            fs, _ = self.locate(url)
            getattr(fs, "shard_cache", None)
        except Exception:  # noqa: BLE001 - raised again by the read, through the handler
            return

    def samples(self, url: str, start: int = 0, headers_only: bool = False) -> Iterator[RawSample]:
        """Samples of the shard from uncompressed byte offset ``start`` (a sample boundary).

        With ``headers_only`` the samples carry empty fields and payloads are sought over (a
        stream that cannot seek reads them): a fast way to count samples or find offsets,
        parsed by the same reader, so offsets, keys and errors agree with a full read.
        """
        fs, path = self.locate(url)
        with fs.open(path, "rb") as raw:
            sought = start > 0 and raw.seekable() and not is_compressed_file(fs, path)
            if sought:
                if raw.seek(0, io.SEEK_END) < start:
                    raise ShardFormatError(url, start, "shard ends before the saved offset")
                raw.seek(start)
            stream = open_shard_stream(raw, url)
            if start and not sought:
                _skip_to(stream, url, start)
            limit = self.max_member_size
            members = iter_members(stream, url, start, not headers_only, max_member_size=limit)
            yield from group_samples(members, url)

    def samples_at(self, url: str, ranges: Sequence[tuple[int, int]]) -> list[RawSample]:
        """The samples at byte ranges ``[offset, end)`` of the shard, in the order given.

        A plain tar is read with one ``cat_ranges`` call; a compressed shard is scanned from its
        start until every range was seen.
        """
        if not ranges:
            return []
        fs, path = self.locate(url)
        if not is_compressed_file(fs, path):
            starts = [offset for offset, _ in ranges]
            ends = [end for _, end in ranges]
            blobs = fs.cat_ranges([path] * len(ranges), starts, ends)
            found = {}
            for (offset, end), blob in zip(ranges, blobs, strict=True):
                if isinstance(blob, BaseException):
                    raise blob
                found[(offset, end)] = self._single_sample(blob, url, offset, end)
        else:
            found = self._scan_for(url, set(ranges))
        return [found[item] for item in ranges]

    def _single_sample(self, blob: bytes, url: str, offset: int, end: int) -> RawSample:
        """The one sample that the byte range ``[offset, end)`` must hold."""
        members = parse_members(blob, url, offset, self.max_member_size)
        samples = list(group_samples(members, url))
        if len(blob) != end - offset or len(samples) != 1 or samples[0].end != end:
            raise ShardFormatError(
                url, offset, "no sample at this saved position; the shard changed since"
            )
        return samples[0]

    def _scan_for(self, url: str, wanted: set[tuple[int, int]]) -> dict:
        found: dict[tuple[int, int], RawSample] = {}
        for sample in self.samples(url):
            if (sample.offset, sample.end) in wanted:
                found[(sample.offset, sample.end)] = sample
                if len(found) == len(wanted):
                    return found
        missing = min(wanted - set(found))
        raise ShardFormatError(
            url, missing[0], "no sample at this saved position; the shard changed since"
        )


def _skip_to(stream, url: str, start: int) -> None:
    """Read and drop the first ``start`` bytes of a stream that cannot seek."""
    remaining = start
    try:
        while remaining:
            piece = stream.read(min(remaining, _SKIP_PIECE))
            if not piece:
                break
            remaining -= len(piece)
    except COMPRESSED_STREAM_ERRORS as exc:
        reason = f"corrupt compressed stream before the saved offset: {exc}"
    else:
        if not remaining:
            return
        reason = "shard ends before the saved offset"
    raise ShardFormatError(url, start - remaining, reason)
