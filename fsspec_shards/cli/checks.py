"""Reading every shard once, for ``verify`` and ``manifest``: hash it and walk its tar members.

Invariant: a shard is read start to end straight from storage (no cache), so its digest is of
the bytes the backend holds, and every member is parsed by the reader ``ShardDataset`` uses.
"""

from __future__ import annotations

import argparse
import hashlib
import io
from dataclasses import dataclass
from typing import BinaryIO

from fsspec_shards.cli.parallel import Outcome, run_parallel
from fsspec_shards.cli.report import progress
from fsspec_shards.cli.shards import open_filesystem

HASH_BLOCK_SIZE = 1 << 20


class HashingReader(io.RawIOBase):
    """A raw stream over ``source`` that hashes and counts every byte read through it."""

    def __init__(self, source: BinaryIO) -> None:
        self.source = source
        self.digest = hashlib.sha256()
        self.size = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        data = self.source.read(len(buffer))
        count = len(data)
        buffer[:count] = data
        self.digest.update(data)
        self.size += count
        return count


@dataclass
class ShardCheck:
    """What reading one shard found: its SHA-256, size and number of samples."""

    url: str
    sha256: str
    size: int
    samples: int


def check_shard(url: str, options: dict[str, dict]) -> ShardCheck:
    """Read one shard through the wds filesystem, hashing it and parsing every tar member."""
    from fsspec_shards.iteration.samples import group_samples
    from fsspec_shards.iteration.tar import iter_members, open_shard_stream

    fs, path = open_filesystem(url, options)
    with fs.open(path, "rb") as source:
        raw = HashingReader(source)
        stream = open_shard_stream(io.BufferedReader(raw, HASH_BLOCK_SIZE), url)
        samples = sum(1 for _ in group_samples(iter_members(stream, url), url))
        while stream.read(HASH_BLOCK_SIZE):
            pass
        while raw.read(HASH_BLOCK_SIZE):
            pass
    return ShardCheck(url, raw.digest.hexdigest(), raw.size, samples)


def check_all(
    args: argparse.Namespace, urls: list[str], options: dict[str, dict], title: str
) -> tuple[list[ShardCheck], list[Outcome]]:
    """Check every shard in parallel with a progress bar; (checks in URL order, failures)."""
    checks: dict[str, ShardCheck] = {}
    failures: list[Outcome] = []
    with progress(args, desc=title, unit=" shards", total=len(urls)) as bar:
        for outcome in run_parallel(lambda url: check_shard(url, options), urls, args.jobs):
            if outcome.error is None:
                checks[outcome.item] = outcome.result
            else:
                failures.append(outcome)
            bar.update()
    return [checks[url] for url in urls if url in checks], failures
