"""The ``manifest`` chore: hash every shard and write a checksum manifest.

Invariants: the manifest lists the shards in pattern order, in ``sha256sum`` format
(:func:`~fsspec_shards.checksums.format_sums`, the writer ``ShardWriter`` uses too), names
relative to its own directory when the shards lie below it; it is written only when every
shard was read, so the same shards give the same bytes wherever the hashing ran (threads
here, or dask workers). With a block size, the block manifest ``<manifest>.blocks``
(:func:`~fsspec_shards.checksums.format_block_manifest`) is written beside it, after it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from fsspec_shards.checksums import (
    block_manifest_name,
    check_block_size,
    format_block_manifest,
    format_sums,
    parse_checksum,
)
from fsspec_shards.config import DEFAULT_MAX_MEMBER_SIZE
from fsspec_shards.fleet.checks import check_shards
from fsspec_shards.fleet.errors import InputError, ShardsFailed
from fsspec_shards.fleet.executors import Executor
from fsspec_shards.fleet.report import shown
from fsspec_shards.fleet.shards import comparable, write_text
from fsspec_shards.iteration.shard_index import DEFAULT_INDEX, build_index, format_index


@dataclass
class ManifestText:
    """A manifest ready to write, its block manifest (None when not asked for), the
    sample counts of its shards by sidecar key and their sample index (JSON text)."""

    text: str
    counts: dict[str, int]
    blocks: str | None = None
    index: str = ""


def build_manifest(
    urls: Sequence[str],
    output: str,
    options: dict[str, dict],
    executor: Executor,
    max_member_size: int = DEFAULT_MAX_MEMBER_SIZE,
    advance: Callable[[int], Any] = lambda count: None,
    block_size: int | None = None,
) -> ManifestText:
    """Hash ``urls`` on ``executor`` into the text of a manifest to be written at ``output``
    (and with ``block_size``, of its block manifest).

    When shards cannot be read, :class:`ShardsFailed` carries their (shard, problem) rows: no
    manifest with holes. A shard name the format cannot hold is an :class:`InputError`."""
    manifest_dir = comparable(output).rsplit("/", 1)[0]
    if block_size is not None:
        try:
            check_block_size(block_size)
        except ValueError as exc:
            raise InputError(str(exc)) from None
    checks = check_shards(
        list(urls), options, executor, ("sha256",), max_member_size, advance, block_size
    )
    failures = [(shown(check.url), check.problem) for check in checks if check.problem]
    if failures:
        raise ShardsFailed(
            f"{len(failures)} shards could not be read; no manifest written", sorted(failures)
        )
    names = [manifest_name(check.url, manifest_dir) for check in checks]
    checksums = [parse_checksum(check.checksums["sha256"]) for check in checks]
    try:
        text = format_sums(zip(names, checksums, strict=True))
    except ValueError as exc:
        raise InputError(str(exc)) from None
    blocks = None
    if block_size is not None:
        listed = [(name, check.blocks) for name, check in zip(names, checks, strict=True)]
        blocks = format_block_manifest(listed, block_size)
    keys = count_keys(names)
    counts = {key: check.samples for key, check in zip(keys, checks, strict=True)}
    index = format_index(
        (key, build_index(check.size, check.starts, check.tar_end))
        for key, check in zip(keys, checks, strict=True)
    )
    return ManifestText(text, counts, blocks, index)


def make_manifest(
    urls: Sequence[str],
    output: str,
    options: dict[str, dict],
    executor: Executor,
    max_member_size: int = DEFAULT_MAX_MEMBER_SIZE,
    advance: Callable[[int], Any] = lambda count: None,
    sample_counts: str | None = None,
    block_size: int | None = None,
    index: str | None = None,
) -> ManifestText:
    """Hash ``urls`` and write their manifest at ``output`` (a path or URL), with
    ``block_size`` its block manifest ``<output>.blocks``, with ``sample_counts`` the
    ``{shard name: samples}`` sidecar there, and with ``index`` the sample index there (``""``:
    ``sample-index.json`` beside the manifest); returns what was written."""
    output = manifest_location(output)
    made = build_manifest(urls, output, options, executor, max_member_size, advance, block_size)
    write_text(output, made.text, options)
    if made.blocks is not None:
        write_text(block_manifest_name(output), made.blocks, options)
    if sample_counts:
        write_text(sample_counts, json.dumps(made.counts, indent=1) + "\n", options)
    if index is not None:
        write_text(index_location(output, index), made.index, options)
    return made


def index_location(output: str, index: str) -> str:
    """Where the sample index goes: ``index``, or ``sample-index.json`` beside the manifest."""
    return index or f"{output.rsplit('/', 1)[0]}/{DEFAULT_INDEX}"


def manifest_location(output: str) -> str:
    """Where a manifest goes: a URL as given, a local path made absolute."""
    return output if "://" in output else os.path.abspath(os.path.expanduser(output))


def manifest_name(url: str, manifest_dir: str) -> str:
    """The name of a shard in a manifest in ``manifest_dir``: relative when below it."""
    name = comparable(url)
    if name.startswith(manifest_dir.rstrip("/") + "/"):
        return name[len(manifest_dir.rstrip("/")) + 1 :]
    return name


def count_keys(names: list[str]) -> list[str]:
    """Keys of the sample-counts sidecar, in shard order: file names when they are unique
    (ShardDataset's ``samples_per_shard`` finds shards by file name), else manifest names."""
    basenames = [name.rsplit("/", 1)[-1] for name in names]
    return basenames if len(set(basenames)) == len(basenames) else names
