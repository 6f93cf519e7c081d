"""The ``check`` chore: read every shard once, hash it and walk its tar members (what
``verify`` and ``manifest`` are made of).

Invariants: a shard is read start to end straight from storage (no cache), so its digests are
of the bytes the backend holds, and every member is parsed by the reader ``ShardDataset``
uses. A shard's storage or format problem is part of its :class:`ShardCheck` (described
without secrets), never an exception: the work runs in threads or on dask workers alike.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, BinaryIO

from fsspec_shards.checksums import BlockHasher, BlockList, StreamingHasher
from fsspec_shards.config import DEFAULT_MAX_MEMBER_SIZE
from fsspec_shards.errors import ShardFormatError
from fsspec_shards.fleet.errors import describe_error
from fsspec_shards.fleet.executors import Executor
from fsspec_shards.fleet.shards import comparable, open_filesystem

HASH_BLOCK_SIZE = 1 << 20


class HashingReader(io.RawIOBase):
    """A raw stream over ``source`` that hashes and counts every byte read through it (and,
    with ``block_size``, hashes each block of that size for a block manifest)."""

    def __init__(
        self, source: BinaryIO, algorithms: Iterable[str], block_size: int | None = None
    ) -> None:
        self.source = source
        self.hashers = [StreamingHasher(algorithm) for algorithm in algorithms]
        self.blocks = BlockHasher(block_size) if block_size is not None else None
        self.size = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        data = self.source.read(len(buffer))
        count = len(data)
        buffer[:count] = data
        for hasher in self.hashers:
            hasher.update(data)
        if self.blocks is not None:
            self.blocks.update(data)
        self.size += count
        return count

    def digests(self) -> dict[str, str]:
        return {hasher.algorithm: str(hasher.checksum()) for hasher in self.hashers}


@dataclass
class ShardCheck:
    """What reading one shard found.

    ``checksums`` maps each algorithm asked for to ``"<algorithm>:<hex>"``; ``storage_check``
    says what the storage layer verified while reading (``size only``, ``backend md5``...);
    ``problem`` describes why the shard is bad (None when it read cleanly); ``blocks`` are
    its block digests when they were asked for; ``starts`` are where its samples start in
    the uncompressed tar and ``tar_end`` where the last one ends (its sample index).
    """

    url: str
    storage_check: str = "none"
    size: int = 0
    samples: int = 0
    checksums: dict[str, str] = field(default_factory=dict)
    problem: str | None = None
    blocks: BlockList | None = None
    starts: list[int] = field(default_factory=list)
    tar_end: int = 0


def check_shard(
    url: str,
    options: dict[str, dict],
    algorithms: tuple[str, ...],
    max_member_size: int,
    block_size: int | None = None,
) -> ShardCheck:
    """Read one shard through the wds filesystem, hashing it (with ``block_size``, block by
    block too) and parsing every tar member."""
    from fsspec_shards.iteration.samples import group_samples
    from fsspec_shards.iteration.tar import iter_members, open_shard_stream

    check = ShardCheck(url)
    name = comparable(url)  # how the tar reader's errors name the shard
    fs, path = open_filesystem(url, options)
    try:
        check.storage_check = storage_check(fs, path)
        with fs.open(path, "rb") as source:
            raw = HashingReader(source, algorithms, block_size)
            stream = open_shard_stream(io.BufferedReader(raw, HASH_BLOCK_SIZE), name)
            members = iter_members(stream, name, max_member_size=max_member_size)
            for sample in group_samples(members, name):
                check.starts.append(sample.offset)
                check.tar_end = sample.end
            check.samples = len(check.starts)
            while stream.read(HASH_BLOCK_SIZE):
                pass
            while raw.read(HASH_BLOCK_SIZE):
                pass
    except (OSError, ShardFormatError) as exc:
        check.problem = describe_error(exc)
        return check
    check.size = raw.size
    check.checksums = raw.digests()
    check.blocks = raw.blocks.block_list() if raw.blocks is not None else None
    return check


def storage_check(fs: Any, path: str) -> str:
    """What the ``wds`` layer verifies when it reads ``path`` without a manifest: every
    checksum the backend gives, else only the size (local files, most HTTP)."""
    from fsspec_shards.storage import backend_checks

    mode = getattr(getattr(fs, "options", None), "verify", None)
    if mode is None:
        return "none (not read through wds::)"
    if mode is False:
        return "none (verify off)"
    algorithms = backend_checks(fs, path)
    return f"backend {', '.join(algorithms)}" if algorithms else "size only"


def check_shards(
    urls: list[str],
    options: dict[str, dict],
    executor: Executor,
    algorithms: tuple[str, ...] = ("sha256",),
    max_member_size: int = DEFAULT_MAX_MEMBER_SIZE,
    advance: Callable[[int], Any] = lambda count: None,
    block_size: int | None = None,
) -> list[ShardCheck]:
    """Check every shard on ``executor``; the checks in URL order. ``advance(1)`` per shard.
    With ``block_size`` each check carries its block digests."""
    work = partial(
        check_shard,
        options=options,
        algorithms=algorithms,
        max_member_size=max_member_size,
        block_size=block_size,
    )
    checks: dict[str, ShardCheck] = {}
    for check in executor.map(work, urls):
        checks[check.url] = check
        advance(1)
    return [checks[url] for url in urls]
