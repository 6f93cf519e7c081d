"""The ``verify`` chore: check every shard's checksum and tar structure.

Invariants: every shard the pattern names gets one row, saying which check it got and its
result (against a block manifest beside the manifest, the first bad block by number and
byte range); with a manifest, every entry the pattern names but storage lacks gets a row too. The
report says which rows are bad; what that means for an exit code is the caller's choice.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fsspec.core import strip_protocol

from fsspec_shards.checksums import BlockList
from fsspec_shards.config import DEFAULT_MAX_MEMBER_SIZE
from fsspec_shards.fleet.checks import ShardCheck, check_shards
from fsspec_shards.fleet.errors import InputError
from fsspec_shards.fleet.executors import Executor
from fsspec_shards.fleet.report import shown
from fsspec_shards.fleet.shards import (
    expand_braces,
    has_glob,
    open_filesystem,
    plain_url,
    shard_urls,
    wds_url,
)
from fsspec_shards.redact import redact_url
from fsspec_shards.storage import Manifest, load_manifest

CHORE = "verify"
MISSING = "not found: listed in the manifest, missing from storage"
NOT_READ = "-"


@dataclass
class ManifestFile:
    """A checksum manifest read for ``verify``, with the filesystem it was read from."""

    fs: Any
    manifest: Manifest

    def path_of(self, url: str) -> str:
        """A shard URL as the manifest's entries are keyed: a backend path of its own
        protocol, else the plain URL."""
        target = plain_url(url)
        protocols = self.fs.protocol if isinstance(self.fs.protocol, tuple) else (self.fs.protocol,)
        if target.split("://", 1)[0] in protocols:
            return strip_protocol(target)
        return target

    def named_by(self, pattern: str) -> list[str]:
        """The entries (backend paths) a URL pattern names, globs matched as fsspec does."""
        from fsspec.utils import glob_translate

        found = []
        for url in expand_braces(pattern):
            path = self.path_of(wds_url(url))
            if has_glob(url):
                matcher = re.compile(glob_translate(path))
                found += [entry for entry in self.manifest.entries if matcher.match(entry)]
            elif path in self.manifest.entries:
                found.append(path)
        return found


def read_manifest(location: str, options: dict[str, dict]) -> ManifestFile:
    """Read a ``sha256sum``-format manifest (path or URL); names resolve against its directory.

    A manifest that is missing or malformed is an :class:`InputError` naming it (and the
    line)."""
    target = plain_url(location)
    if "://" not in target:
        target = os.path.abspath(os.path.expanduser(target))
    protocol = target.split("://", 1)[0] if "://" in target else "file"
    fs, _ = open_filesystem(target, options.get(protocol, {}))
    try:
        manifest = load_manifest(target, fs)
    except FileNotFoundError:
        raise InputError(f"manifest not found: {redact_url(location)}") from None
    except UnicodeDecodeError:
        raise InputError(f"manifest {redact_url(location)} is not text") from None
    except ValueError as exc:
        raise InputError(str(exc)) from None
    return ManifestFile(fs, manifest)


@dataclass
class VerifyRow:
    """One row of the report: a shard (or a manifest entry storage lacks) and its verdict."""

    shard: str
    check: str
    problem: str | None = None
    samples: int = 0
    size: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "shard": self.shard,
            "check": self.check,
            "ok": self.problem is None,
            "problem": self.problem,
            "samples": self.samples,
            "size": self.size,
        }


@dataclass
class VerifyReport:
    """What ``verify`` found: rows in shard order, then missing manifest entries."""

    manifest: str | None
    rows: list[VerifyRow] = field(default_factory=list)

    @property
    def bad(self) -> list[VerifyRow]:
        return [row for row in self.rows if row.problem is not None]

    @property
    def samples(self) -> int:
        return sum(row.samples for row in self.rows)

    def summary(self) -> str:
        checks: dict[str, int] = {}
        for row in self.rows:
            if row.check != NOT_READ:
                checks[row.check] = checks.get(row.check, 0) + 1
        counted = ", ".join(f"{count} {check}" for check, count in checks.items())
        against = f" against manifest {redact_url(self.manifest)}" if self.manifest else ""
        return (
            f"verified {len(self.rows)} shards{against}: {len(self.rows) - len(self.bad)} ok, "
            f"{len(self.bad)} bad ({self.samples} samples in the readable shards; "
            f"checks: {counted})"
        )

    def failure_line(self) -> str:
        first = self.bad[0]
        return (
            f"{len(self.bad)} of {len(self.rows)} shards bad, first {first.shard}: {first.problem}"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "command": CHORE,
            "manifest": redact_url(self.manifest) if self.manifest else None,
            "shards": len(self.rows),
            "ok": len(self.rows) - len(self.bad),
            "bad": len(self.bad),
            "samples": self.samples,
            "results": [row.as_dict() for row in self.rows],
        }


def verify_shards(
    pattern: str,
    options: dict[str, dict],
    executor: Executor,
    manifest: str | None = None,
    max_member_size: int = DEFAULT_MAX_MEMBER_SIZE,
    advance: Callable[[int], Any] = lambda count: None,
    urls: list[str] | None = None,
) -> VerifyReport:
    """Check every shard ``pattern`` names (``urls``, when expanded already) on ``executor``.

    ``options`` should read with the cache off: verify checks storage, not a cached copy."""
    expected = read_manifest(manifest, options) if manifest else None
    urls = urls if urls is not None else shard_urls(pattern, options)
    algorithms: tuple[str, ...] = ()
    if expected is not None:
        algorithms = tuple(sorted({c.algorithm for c in expected.manifest.entries.values()}))
    block_size = None
    if expected is not None and expected.manifest.blocks:
        block_size = next(iter(expected.manifest.blocks.values())).block_size
    checks = check_shards(urls, options, executor, algorithms, max_member_size, advance, block_size)
    report = VerifyReport(manifest)
    report.rows = [verdict(check, expected) for check in checks]
    if expected is not None:
        present = {expected.path_of(url) for url in urls}
        for path in sorted(set(expected.named_by(pattern)) - present):
            report.rows.append(VerifyRow(shown(path), NOT_READ, MISSING))
    return report


def verdict(check: ShardCheck, expected: ManifestFile | None) -> VerifyRow:
    """The row of one checked shard: its problem, else the manifest's verdict on its digest."""
    row = VerifyRow(shown(check.url), check.storage_check, check.problem, check.samples, check.size)
    if expected is None:
        return row
    path = expected.path_of(check.url)
    wanted = expected.manifest.lookup(path)
    blocks = expected.manifest.lookup_blocks(path)
    row.check = f"{wanted.algorithm} (manifest)" if wanted else "manifest"
    if blocks is not None:
        row.check = f"{wanted.algorithm} (manifest, blocks)"
    if row.problem is not None:
        return row
    if wanted is None:
        row.problem = "not in the manifest"
    elif blocks is not None and check.blocks is not None and check.blocks != blocks:
        row.problem = bad_blocks(blocks, check.blocks)
    elif check.checksums.get(wanted.algorithm) != str(wanted):
        row.problem = f"integrity: expected {wanted}, got {check.checksums.get(wanted.algorithm)}"
    return row


def bad_blocks(listed: BlockList, found: BlockList) -> str:
    """What differs between a shard's blocks and its block manifest entry: the size, or the
    first bad block (number and byte range) and how many are bad."""
    if listed.size != found.size:
        return f"integrity: expected {listed.size} bytes (block manifest), got {found.size}"
    bad = [i for i, (a, b) in enumerate(zip(listed.blocks, found.blocks, strict=True)) if a != b]
    first = bad[0]
    start, end = listed.bounds(first)
    more = f" ({len(bad)} bad blocks)" if len(bad) > 1 else ""
    return (
        f"integrity: block {first} (bytes {start}-{end}): expected "
        f"sha256:{listed.blocks[first]}, got sha256:{found.blocks[first]}{more}"
    )
