"""Per-shard sample indexes: where each sample of a shard starts, for random access.

A shard's :class:`ShardIndex` holds the byte offset (in the uncompressed tar) where each
sample's first header begins, the end of its last sample, and the shard file's size (to tell
an index from another version of the shard). Sample ``k`` is read from the byte range
``[offsets[k], offsets[k + 1])``: any member between two samples that is no part of one
(a directory, a ``__meta__`` member) lies in the range and is passed over as the streaming
reader passes over it.

Stored as JSON, ``sample-index.json`` beside the shards (written by ``ShardWriter`` and by
``fsspec-shards manifest --index``)::

    {"format": "fsspec-shards sample index", "version": 1,
     "shards": {"train-000000.tar": {"size": 10240, "blocks": [0, 3, 3, 5]}}}

``blocks`` counts 512-byte tar blocks: the first sample's start, then the span of every
sample to the next one's start (the last one's: to its end), a few characters per sample.
Shards are looked up in it as the sample counts are (:mod:`.lengths`): by full URL, else by
the longest trailing part of the path.
"""

from __future__ import annotations

import json
import logging
from array import array
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

import fsspec

from fsspec_shards.iteration.lengths import MAX_SAMPLE_COUNT
from fsspec_shards.option_shapes import fsspec_arguments
from fsspec_shards.redact import redact_text, redact_url
from fsspec_shards.shard_names import by_trailing_path
from fsspec_shards.tar_blocks import BLOCK_SIZE

logger = logging.getLogger("fsspec_shards.dataset")

DEFAULT_INDEX = "sample-index.json"
FORMAT = "fsspec-shards sample index"
VERSION = 1


@dataclass(frozen=True)
class ShardIndex:
    """One shard's sample boundaries: ``offsets[k]`` is where sample ``k`` starts,
    ``offsets[-1]`` where the last one ends; ``size`` is the shard file's byte size."""

    size: int
    offsets: array

    @property
    def samples(self) -> int:
        return len(self.offsets) - 1

    def span(self, sample: int) -> tuple[int, int]:
        """The byte range ``[start, end)`` of the tar that holds sample ``sample``."""
        return self.offsets[sample], self.offsets[sample + 1]


def build_index(size: int, starts: Iterable[int], end: int) -> ShardIndex:
    """The index of a shard of ``size`` bytes whose samples start at ``starts`` and whose
    last sample ends at ``end`` (with no sample: ``end`` is ignored)."""
    offsets = array("q", starts)
    offsets.append(end if offsets else 0)
    return ShardIndex(size, offsets)


def index_of_samples(size: int, samples: Iterable[Any]) -> ShardIndex:
    """The index of a shard from its samples (anything with ``offset`` and ``end``, such as
    a header-only scan's :class:`~fsspec_shards.iteration.samples.RawSample`)."""
    starts: list[int] = []
    end = 0
    for sample in samples:
        starts.append(sample.offset)
        end = sample.end
    return build_index(size, starts, end)


def format_index(entries: Iterable[tuple[str, ShardIndex]]) -> str:
    """The JSON text of a sample index of the shards ``(name, index)``, in order."""
    shards = {}
    for name, index in entries:
        offsets = index.offsets
        blocks = [offsets[0] // BLOCK_SIZE] + [
            (offsets[k + 1] - offsets[k]) // BLOCK_SIZE for k in range(len(offsets) - 1)
        ]
        shards[name] = {"size": index.size, "blocks": blocks}
    document = {"format": FORMAT, "version": VERSION, "shards": shards}
    return json.dumps(document, separators=(",", ":")) + "\n"


def parse_index(text: str, where: str) -> dict[str, ShardIndex]:
    """``{shard name: ShardIndex}`` of an index's JSON text; ValueError naming ``where``
    (and the shard) when it is no index or a broken one."""
    try:
        document = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"{where} is not JSON: {exc}") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise ValueError(f'{where} is not a sample index (no "format": {FORMAT!r})')
    if document.get("version") != VERSION:
        raise ValueError(f"{where}: index version {document.get('version')!r} is not {VERSION}")
    shards = document.get("shards")
    if not isinstance(shards, dict):
        raise ValueError(f'{where}: "shards" must be an object')
    return {str(name): _entry(entry, f"{where}, shard {name!r}") for name, entry in shards.items()}


def _entry(entry: Any, where: str) -> ShardIndex:
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: the entry must be an object")
    size, blocks = entry.get("size"), entry.get("blocks")
    if not _is_count(size):
        raise ValueError(f'{where}: "size" must be a non-negative int')
    if not isinstance(blocks, list) or not blocks or not all(_is_count(b) for b in blocks):
        raise ValueError(f'{where}: "blocks" must be a non-empty list of non-negative ints')
    if len(blocks) - 1 > MAX_SAMPLE_COUNT or (len(blocks) > 1 and min(blocks[1:]) < 1):
        raise ValueError(f"{where}: every sample spans at least one block")
    return ShardIndex(size, array("q", (BLOCK_SIZE * b for b in accumulate(blocks))))


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def load_index(
    source: Mapping[str, ShardIndex] | str, storage_options: Mapping[str, Any] | None = None
) -> dict[str, ShardIndex]:
    """An index from a mapping, or from the JSON file/URL holding one (read through fsspec,
    with the storage options the shards are read with)."""
    if isinstance(source, Mapping):
        if not all(isinstance(entry, ShardIndex) for entry in source.values()):
            raise ValueError("index: a mapping must map shard names to ShardIndex")
        return dict(source)
    return parse_index(read_text(source, storage_options), f"sample index {redact_url(source)}")


def read_text(url: str, storage_options: Mapping[str, Any] | None) -> str:
    """The text of a small file through fsspec; FileNotFoundError when it is absent, else
    ValueError naming it (never a secret of ``url``)."""
    try:
        chained, options = fsspec_arguments(url, storage_options)
        with fsspec.open(chained, "r", encoding="utf-8", **options) as handle:
            return handle.read()
    except FileNotFoundError:
        raise FileNotFoundError(f"no sample index at {redact_url(url)}") from None
    except (OSError, ValueError) as exc:
        reason = redact_text(str(exc), url)
        raise ValueError(f"cannot read the sample index {redact_url(url)}: {reason}") from None


def find_index(table: Mapping[str, ShardIndex], url: str) -> ShardIndex | None:
    """The index of ``url`` in ``table``: by full URL, else by its longest trailing path."""
    if url in table:
        return table[url]
    return by_trailing_path(table, url.split("?", 1)[0].split("::")[-1])


def beside(url: str, name: str = DEFAULT_INDEX) -> str:
    """The URL of the file ``name`` in the directory of shard ``url`` (with its query, which
    signs every object of a container, as the writer adds it to what it writes)."""
    path, mark, query = url.partition("?")
    if "://" not in path.split("::")[-1]:
        mark = query = ""  # a local path: '?' is a character of the name
        path = url
    return f"{path.rsplit('/', 1)[0]}/{name}{mark}{query}"


def discover(
    urls: Iterable[str], storage_options: Mapping[str, Any] | None
) -> dict[str, ShardIndex]:
    """The indexes found beside the shards (``sample-index.json`` in each of their
    directories), keyed by full URL; a directory without one (or not readable) adds none."""
    found: dict[str, ShardIndex] = {}
    tables: dict[str, dict[str, ShardIndex] | None] = {}
    for url in urls:
        location = beside(url)
        if location not in tables:
            try:
                text = read_text(location, storage_options)
            except FileNotFoundError:
                tables[location] = None
                continue
            tables[location] = parse_index(text, f"sample index {redact_url(location)}")
            logger.debug("sample index found at %s", redact_url(location))
        table = tables[location]
        entry = find_index(table, url) if table is not None else None
        if entry is not None:
            found[url] = entry
    return found
