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
import numbers
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
    """A shard holds other than the samples its count says (a wrong sidecar, or a changed shard)."""


MAX_SAMPLE_COUNT = 2**32
"""The largest count believed: every sample is at least one 512-byte tar header, so more
would be a shard of over 2 TiB; a count past it is a broken sidecar, refused when read
rather than planned (an epoch of 10**10 samples per shard exhausts memory first)."""


def load_sample_counts(
    source: Mapping[str, int] | str, storage_options: Mapping[str, Any] | None = None
) -> dict[str, int]:
    """Sample counts from a mapping, or from a JSON file/URL holding one, each checked to
    be an int from 0 to :data:`MAX_SAMPLE_COUNT` (a ValueError names the source and shard)."""
    if isinstance(source, Mapping):
        return _checked(source.items(), "samples_per_shard")
    where = f"sample counts in {redact_url(source)}"
    try:
        url, options = fsspec_arguments(source, storage_options)  # as the shards are opened
        with fsspec.open(url, "r", **options) as handle:
            data = json.load(handle, object_pairs_hook=_unique_names)
    except (OSError, ValueError) as exc:
        reason = redact_text(str(exc), source)
        raise ValueError(f"cannot read sample counts from {redact_url(source)}: {reason}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{where} must be a JSON object")
    return _checked(data.items(), where)


def _unique_names(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object, refused when a name appears twice (which count would be the lie?)."""
    result: dict[str, Any] = {}
    for name, value in pairs:
        if name in result:
            raise ValueError(f"the shard {redact_url(name)!r} is given twice")
        result[name] = value
    return result


def _checked(pairs: Iterable[tuple[Any, Any]], where: str) -> dict[str, int]:
    """``{name: count}`` of ``pairs``, every count an int in range and every name once."""
    counts: dict[str, int] = {}
    for name, count in pairs:
        name = str(name)
        if not isinstance(count, numbers.Integral) or isinstance(count, bool):
            problem = f"is not an int: {_shown(count)} ({type(count).__name__})"
        elif not 0 <= count <= MAX_SAMPLE_COUNT:
            problem = f"is out of range: {_shown(count)} (counts are 0 to 2**32)"
        elif name in counts:
            problem = "is given twice"
        else:
            counts[name] = int(count)
            continue
        raise ValueError(f"{where}: the sample count of {redact_url(name)!r} {problem}")
    return counts


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


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
