"""The fleet chores (``manifest``, ``verify``, ``prefetch``) on a dask cluster: the dask face
of :mod:`fsspec_shards.fleet`.

These functions run the very chores a local run runs in threads; only the executor differs
(:class:`~fsspec_shards.fleet.dask_executor.DaskExecutor`, in batches, retried, results in
shard order), so the manifest bytes, the verify report and the prefetch numbers equal a local
run's. ``prefetch`` fills the cache of the host each batch runs on (``cache_dir`` from the
options, else the worker's own default); the cache's single-flight lock makes the worker
processes of one host share each download. Without dask (``pip install
'fsspec-shards[dask]'``) they raise an ``ImportError`` saying so.

Example::

    from dask.distributed import Client
    from fsspec_shards import distributed

    client = Client("tcp://scheduler:8786")
    report = distributed.verify("s3://bucket/train-{0000..9999}.tar", client=client,
                                manifest="s3://bucket/SHA256SUMS")
    print(report.summary(), [row.shard for row in report.bad])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fsspec_shards.config import DEFAULT_MAX_MEMBER_SIZE
from fsspec_shards.fleet.dask_executor import DaskExecutor, dask_executor, default_dask_executor
from fsspec_shards.fleet.executors import Executor
from fsspec_shards.fleet.manifest import make_manifest
from fsspec_shards.fleet.prefetch import PrefetchReport, prefetch_shards
from fsspec_shards.fleet.shards import shard_urls
from fsspec_shards.fleet.verify import VerifyReport, verify_shards
from fsspec_shards.option_shapes import LAYER

__all__ = ["DaskExecutor", "dask_executor", "manifest", "prefetch", "verify"]


def _executor(client: Any, executor: Executor | None) -> Executor:
    return executor if executor is not None else default_dask_executor(client)


def _options(storage_options: dict[str, dict] | None, cache: bool) -> dict[str, dict]:
    options = {protocol: dict(table) for protocol, table in (storage_options or {}).items()}
    if not cache:
        options.setdefault(LAYER, {})["cache"] = False
    return options


def verify(
    urls: str | Sequence[str],
    *,
    client: Any = None,
    executor: Executor | None = None,
    storage_options: dict[str, dict] | None = None,
    manifest: str | None = None,
    max_member_size: int = DEFAULT_MAX_MEMBER_SIZE,
) -> VerifyReport:
    """Check every shard (checksum and tar structure) on a dask cluster, as ``verify`` does.

    ``urls`` is a pattern or a list of them; ``client`` a dask Client (default: the current
    one), or ``executor`` anything with the :class:`~fsspec_shards.fleet.executors.Executor`
    methods. ``storage_options`` maps protocol to options, ``{"s3": {...}, "wds": {...}}``."""
    options = _options(storage_options, cache=False)
    pattern = urls if isinstance(urls, str) else list(urls)
    return verify_shards(pattern, options, _executor(client, executor), manifest, max_member_size)


def manifest(
    urls: str | Sequence[str],
    output: str,
    *,
    client: Any = None,
    executor: Executor | None = None,
    storage_options: dict[str, dict] | None = None,
    max_member_size: int = DEFAULT_MAX_MEMBER_SIZE,
    block_size: int | None = None,
) -> str:
    """Hash every shard on a dask cluster and write the ``sha256sum`` manifest to ``output``
    (a path or URL; names relative to its directory), with ``block_size`` its block manifest
    ``<output>.blocks`` too; returns the manifest's text."""
    options = _options(storage_options, cache=False)
    found = shard_urls(urls, options)
    executor = _executor(client, executor)
    made = make_manifest(found, output, options, executor, max_member_size, block_size=block_size)
    return made.text


def prefetch(
    urls: str | Sequence[str],
    *,
    client: Any = None,
    executor: Executor | None = None,
    storage_options: dict[str, dict] | None = None,
) -> PrefetchReport:
    """Fill the cache of every worker host with the shards its workers fetch."""
    options = _options(storage_options, cache=True)
    found = shard_urls(urls, options)
    return prefetch_shards(found, options, _executor(client, executor))
