"""Equal epoch lengths for every consumer, from known per-shard sample counts.

Distributed training needs every rank to take the same number of steps per epoch, but
consumers read different shards. Given ``{shard name: sample count}`` (a mapping, or a JSON
sidecar file read through fsspec), :func:`epoch_lengths` computes, for one epoch's shard
order, what each consumer would yield and the common length: the smallest (``"truncate"``:
every consumer stops there) or the largest (``"pad"``: shorter consumers continue with a
second pass over their own shards). Both depend on (seed, epoch) only, so all agree.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import fsspec

from fsspec_shards.redact import redact_text, redact_url

EQUALIZE_MODES = ("truncate", "pad")


def load_sample_counts(
    source: Mapping[str, int] | str, storage_options: Mapping[str, Any] | None = None
) -> dict[str, int]:
    """Sample counts from a mapping, or from a JSON file/URL holding one."""
    if isinstance(source, Mapping):
        return {str(name): int(count) for name, count in source.items()}
    try:
        with fsspec.open(source, "r", **dict(storage_options or {})) as handle:
            data = json.load(handle)
    except (OSError, ValueError) as exc:
        reason = redact_text(str(exc), source)
        raise ValueError(f"cannot read sample counts from {redact_url(source)}: {reason}") from None
    if not isinstance(data, dict):
        raise ValueError(f"sample counts in {redact_url(source)} must be a JSON object")
    return {str(name): int(count) for name, count in data.items()}


def shard_sizes(urls: Sequence[str], counts: Mapping[str, int]) -> list[int]:
    """The sample count of every URL, looked up by full URL, else by file name."""
    sizes, missing = [], []
    for url in urls:
        name = url.rsplit("/", 1)[-1]
        count = counts.get(url, counts.get(name))
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


def epoch_lengths(
    order: Sequence[int], sizes: Sequence[int], consumers: int, mode: str
) -> tuple[list[int], int]:
    """(samples each consumer's shards hold, the common length) for one epoch's order."""
    if mode not in EQUALIZE_MODES:
        raise ValueError(f"equalize must be one of {EQUALIZE_MODES} or None, got {mode!r}")
    totals = [sum(sizes[index] for index in order[c::consumers]) for c in range(consumers)]
    return totals, (min(totals) if mode == "truncate" else max(totals))
