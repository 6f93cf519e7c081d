"""URL patterns to the ``wds::`` URLs of shards, and filesystems to read them.

Invariant: every URL a command reads goes through ``wds::`` (retries, checks, cache) unless the
user gave an fsspec chain (``::``) of their own; local paths become absolute ``file://`` URLs.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fsspec_shards.fleet.errors import InputError
from fsspec_shards.redact import redact_url

GLOB_CHARACTERS = frozenset("*?[")


def plain_url(url: str) -> str:
    """The backend URL of a possibly chained URL: ``wds::s3://b/k`` -> ``s3://b/k``."""
    return url.rsplit("::", 1)[-1]


def comparable(url: str) -> str:
    """A shard URL in the form manifests name it: plain, local paths without ``file://``."""
    target = plain_url(url)
    return target[len("file://") :] if target.startswith("file://") else target


def wds_url(url: str) -> str:
    """Read ``url`` through ``wds::`` unless it already is a chained URL.

    Local paths become absolute ``file://`` URLs so they do not depend on the cache's
    working directory.
    """
    if "::" in url:
        return url
    if "://" not in url:
        url = "file://" + os.path.abspath(os.path.expanduser(url))
    return "wds::" + url


def has_glob(url: str) -> bool:
    """True when ``url`` holds glob characters to expand (never for http(s) query strings)."""
    target = plain_url(url)
    if target.startswith(("http://", "https://")):
        return False
    return any(character in GLOB_CHARACTERS for character in target)


def expand_braces(patterns: str | Sequence[str]) -> list[str]:
    """The URLs and globs a pattern (or a list of them) names once braces are expanded."""
    from fsspec_shards.iteration.urls import expand_urls

    try:
        return expand_urls(patterns)
    except ValueError as exc:
        raise InputError(str(exc)) from None


def shard_urls(patterns: str | Sequence[str], options: dict[str, dict]) -> list[str]:
    """Expand braces and globs in ``patterns`` into the ``wds::`` URLs of the shards."""
    expanded: list[str] = []
    for url in expand_braces(patterns):
        expanded.extend(glob_url(url, options) if has_glob(url) else [wds_url(url)])
    if not expanded:
        given = [patterns] if isinstance(patterns, str) else list(patterns)
        raise InputError(f"no shards match {', '.join(repr(redact_url(p)) for p in given)}")
    return expanded


def glob_url(url: str, options: dict[str, dict]) -> list[str]:
    """The ``wds::`` URLs of the files matching a glob, listed on the backend."""
    import fsspec

    target = plain_url(wds_url(url))
    prefix = url[: len(url) - len(plain_url(url))] or "wds::"
    protocol = target.split("://", 1)[0]
    try:
        fs, path = fsspec.core.url_to_fs(target, **options.get(protocol, {}))
    except (ValueError, ImportError) as exc:
        raise InputError(f"cannot list {redact_url(target)}: {exc}") from None
    return [prefix + fs.unstrip_protocol(match) for match in sorted(fs.glob(path))]


def open_filesystem(url: str, options: dict[str, dict]) -> tuple[Any, str]:
    """The filesystem and path of a (chained) URL; a bad protocol is an :class:`InputError`."""
    import fsspec

    try:
        return fsspec.core.url_to_fs(url, **options)
    except (ValueError, ImportError) as exc:
        raise InputError(f"cannot open {redact_url(url)}: {exc}") from None


def write_text(location: str, text: str, options: dict[str, dict]) -> None:
    """Write ``text`` to a local path or an fsspec URL (straight to the backend)."""
    import fsspec

    if "://" not in location:
        Path(location).write_text(text)
        return
    protocol = location.split("://", 1)[0]
    with fsspec.open(location, "wt", **options.get(protocol, {})) as handle:
        handle.write(text)
