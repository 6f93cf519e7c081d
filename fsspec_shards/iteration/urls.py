"""Expand shard URL patterns (``train-{0000..0999}.tar``) into lists of URLs.

Unlike webdataset, a string is never split at ``::``: that is how fsspec chains
filesystems (``wds::s3://bucket/train-{0..9}.tar``), so it stays part of each URL. Pass a
list to give several patterns.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import braceexpand

from fsspec_shards.redact import redact_url


def expand_pattern(pattern: str) -> list[str]:
    """Brace-expand one pattern: ``{a,b}`` alternatives and ``{000..123}`` ranges."""
    try:
        return list(braceexpand.braceexpand(pattern))
    except braceexpand.UnbalancedBracesError:
        raise ValueError(f"unbalanced braces in URL pattern {redact_url(pattern)!r}") from None


def expand_urls(urls: str | os.PathLike | Sequence[str | os.PathLike]) -> list[str]:
    """Return the shard URLs of a pattern or of a list of patterns, in order.

    Raises ValueError on an unbalanced pattern or when nothing is left, TypeError on
    anything that is not a string or path.
    """
    patterns = [urls] if isinstance(urls, (str, os.PathLike)) else list(urls)
    expanded: list[str] = []
    for pattern in patterns:
        if isinstance(pattern, os.PathLike):
            pattern = os.fspath(pattern)
        if not isinstance(pattern, str):
            raise TypeError(f"a shard URL must be a string, not {type(pattern).__name__}")
        pattern = pattern.strip()
        if not pattern:
            raise ValueError("empty shard URL")
        expanded.extend(expand_pattern(pattern))
    if not expanded:
        raise ValueError("no shard URLs given")
    return expanded
