"""Expand shard URL patterns (``train-{0000..0999}.tar``) into lists of URLs.

Unlike webdataset, a string is never split at ``::``: that is how fsspec chains
filesystems (``wds::s3://bucket/train-{0..9}.tar``), so it stays part of each URL. Pass a
list to give several patterns. What webdataset accepts and fsspec would read otherwise is
refused with a ValueError that says what to write instead: ``::`` between two shard patterns
(fsspec would read only one of them) and ``pipe:`` commands (fsspec would look for a file).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

import braceexpand
import fsspec
from fsspec.archive import AbstractArchiveFileSystem

from fsspec_shards.redact import redact_url

SHARD_SUFFIXES = (".tar", ".tgz", ".tar.gz", ".tar.zst", ".tzst")
"""How the file name of a shard (or of a pattern of shards) ends."""
_URL_IN_COMMAND = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"]+")


def _names_shards(part: str) -> bool:
    """True when one ``::``-separated part of a pattern is itself a shard pattern, not a
    filesystem of a chain (``wds``) nor a member of an archive (``tar://inner.tar``)."""
    path = part.split("?", 1)[0].rstrip("/")
    if not path.endswith(SHARD_SUFFIXES):
        return False
    if "://" not in part:
        return True
    try:
        protocol_class = fsspec.get_filesystem_class(part.split("://", 1)[0])
    except (ImportError, ValueError):
        return True
    return not issubclass(protocol_class, AbstractArchiveFileSystem)


def check_pattern(pattern: str) -> None:
    """Refuse ``pipe:`` commands and ``::`` between shard patterns, saying what to write."""
    parts = pattern.split("::")
    if any(part.startswith("pipe:") for part in parts):
        found = _URL_IN_COMMAND.search(pattern)
        example = f" (e.g. 'wds::{redact_url(found.group())}')" if found else ""
        raise ValueError(f"pipe: URLs are not supported; use the URL itself{example}")
    if not any(_names_shards(part) for part in parts[:-1]):
        return
    patterns, chain = [], []
    for part in parts:
        chain.append(part)
        if _names_shards(part):
            patterns.append(redact_url("::".join(chain)))
            chain = []
    if chain:
        patterns[-1] = redact_url("::".join([patterns[-1], *chain]))
    raise ValueError(
        f"{redact_url(pattern)!r} joins shard patterns with '::', which fsspec reads as a chain "
        f"of filesystems (as in 'wds::s3://bucket/x.tar'), so only one would be read: give "
        f"several patterns as a list, {patterns!r}"
    )


def expand_pattern(pattern: str) -> list[str]:
    """Brace-expand one pattern: ``{a,b}`` alternatives and ``{000..123}`` ranges."""
    try:
        return list(braceexpand.braceexpand(pattern))
    except braceexpand.UnbalancedBracesError:
        raise ValueError(f"unbalanced braces in URL pattern {redact_url(pattern)!r}") from None


def expand_urls(urls: str | os.PathLike | Sequence[str | os.PathLike]) -> list[str]:
    """Return the shard URLs of a pattern or of a list of patterns, in order.

    Raises ValueError on an unbalanced pattern, on what :func:`check_pattern` refuses or
    when nothing is left, TypeError on anything that is not a string or path.
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
        check_pattern(pattern)
        expanded.extend(expand_pattern(pattern))
    if not expanded:
        raise ValueError("no shard URLs given")
    return expanded
