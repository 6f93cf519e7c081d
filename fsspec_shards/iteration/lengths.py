"""Per-shard sample counts: from a mapping, a JSON sidecar, or a header-only scan.

Distributed training needs every rank to take the same number of steps per epoch, and
consumers that share shards by sample ranges need to know where the ranges fall: both come
from the sample count of every shard (:mod:`~fsspec_shards.iteration.plan` uses them). The
counts are ``{shard name: sample count}`` (a mapping, or a JSON sidecar such as
``fsspec-shards manifest --sample-counts`` writes, read through fsspec) looked up by full URL,
then by the longest trailing part of the path (the file name at least); or they are counted
by reading every shard's tar headers (:func:`count_samples`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import fsspec

from fsspec_shards.option_shapes import fsspec_arguments
from fsspec_shards.redact import redact_text, redact_url
from fsspec_shards.shard_names import by_trailing_path

logger = logging.getLogger("fsspec_shards.dataset")

COUNT_THREADS = 8


class SampleCountError(ValueError):
    """A shard holds fewer samples than its count says (a wrong sidecar, or a changed shard)."""


def load_sample_counts(
    source: Mapping[str, int] | str, storage_options: Mapping[str, Any] | None = None
) -> dict[str, int]:
    """Sample counts from a mapping, or from a JSON file/URL holding one."""
    if isinstance(source, Mapping):
        return {str(name): int(count) for name, count in source.items()}
    try:
        url, options = fsspec_arguments(source, storage_options)  # as the shards are opened
        with fsspec.open(url, "r", **options) as handle:
            data = json.load(handle)
    except (OSError, ValueError) as exc:
        reason = redact_text(str(exc), source)
        raise ValueError(f"cannot read sample counts from {redact_url(source)}: {reason}") from None
    if not isinstance(data, dict):
        raise ValueError(f"sample counts in {redact_url(source)} must be a JSON object")
    return {str(name): int(count) for name, count in data.items()}


def _lookup(counts: Mapping[str, int], url: str) -> int | None:
    """The count of ``url``: by full URL, else by its longest trailing path in ``counts``."""
    if url in counts:
        return counts[url]
    return by_trailing_path(counts, url.split("?", 1)[0].split("::")[-1])


def shard_sizes(urls: Sequence[str], counts: Mapping[str, int]) -> list[int]:
    """The sample count of every URL; ValueError naming the URLs without one."""
    sizes, missing = [], []
    for url in urls:
        count = _lookup(counts, url)
        if count is not None and count < 0:
            raise ValueError(f"negative sample count {count} for {redact_url(url)}")
        if count is None:
            missing.append(redact_url(url))
            count = 0
        sizes.append(count)
    if missing:
        shown = ", ".join(missing[:3]) + (
            f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        )
        raise ValueError(f"no sample count for {shown}")
    return sizes


def count_samples(
    urls: Sequence[str], scan: Callable[[str], Iterable[Any]], skip_failed: bool
) -> list[int]:
    """The sample count of every URL: the samples ``scan(url)`` (a header-only scan) yields,
    in threads.

    A shard that cannot be read raises, or with ``skip_failed`` counts the samples before the
    failure (what reading it will yield before the handler leaves the rest out), with a
    warning naming it.
    """

    def one(url: str) -> int:
        count = 0
        try:
            for _ in scan(url):
                count += 1
        except (OSError, ValueError) as exc:
            if not skip_failed:
                raise
            logger.warning(
                "counting samples: leaving out the rest of shard %s after %d samples: %s: %s",
                redact_url(url),
                count,
                type(exc).__name__,
                redact_text(str(exc), url),
            )
        return count

    if not urls:
        return []
    with ThreadPoolExecutor(max_workers=min(COUNT_THREADS, len(urls))) as pool:
        return list(pool.map(one, urls))
