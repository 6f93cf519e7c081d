"""The fleet chores (``manifest``, ``verify``, ``prefetch``) fanned out over a dask cluster.

The command line's ``--dask SCHEDULER`` and the Python functions here run the very work
functions a local run runs in threads (:mod:`fsspec_shards.cli.checks`,
:mod:`fsspec_shards.cli.prefetch`); only the executor differs. Invariants:

- Shards go to the workers in batches (a few per worker thread, so that a cluster is kept
  busy without one task per shard); each shard's problem is part of its result, so a bad
  shard never fails its batch. A batch whose worker dies is run again elsewhere (dask
  reschedules it), and an exception in a batch is retried ``retries`` times.
- Results are reassembled in shard order, so the manifest bytes, the verify table and the
  exit codes equal a local run's.
- ``prefetch`` fills the cache of the host each batch runs on (``cache_dir`` from the
  options, else the worker's own default); the cache's single-flight lock makes the worker
  processes of one host share each download.
- dask is optional (``pip install 'fsspec-shards[dask]'``); without it these functions raise
  an ``ImportError`` saying so, and ``--dask`` is a usage error.

Example::

    from dask.distributed import Client
    from fsspec_shards import distributed

    client = Client("tcp://scheduler:8786")
    report = distributed.verify("s3://bucket/train-{0000..9999}.tar", client=client,
                                manifest="s3://bucket/SHA256SUMS")
    print(report.summary(), [row.shard for row in report.bad])
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from fsspec_shards.cli.errors import UsageError
from fsspec_shards.cli.manifest import build_manifest, manifest_location
from fsspec_shards.cli.options import DEFAULT_MAX_MEMBER_SIZE
from fsspec_shards.cli.parallel import Executor
from fsspec_shards.cli.prefetch import PrefetchReport, prefetch_shards
from fsspec_shards.cli.shards import shard_urls, write_text
from fsspec_shards.cli.verify import VerifyReport, verify_shards

__all__ = ["DaskExecutor", "dask_executor", "manifest", "prefetch", "verify"]

INSTALL_HINT = "dask fan-out needs dask.distributed: pip install 'fsspec-shards[dask]'"
BATCHES_PER_THREAD = 4
MAX_BATCH = 64
LOCAL_PREFIX = "local:"


def _distributed() -> Any:
    try:
        import distributed
    except ImportError:
        raise ImportError(INSTALL_HINT) from None
    return distributed


def run_batch(function: Callable[[Any], Any], batch: list) -> list:
    """Run ``function`` over one batch of shards on a worker, in order."""
    return [function(item) for item in batch]


class DaskExecutor:
    """Per-shard work on the workers of a dask ``Client``, in batches."""

    def __init__(self, client: Any, batch_size: int | None = None, retries: int = 2) -> None:
        self.client = client
        self.batch_size = batch_size
        self.retries = retries

    def _batch_size(self, count: int) -> int:
        if self.batch_size is not None:
            return self.batch_size
        threads = max(1, sum(self.client.nthreads().values()))
        return max(1, min(MAX_BATCH, math.ceil(count / (threads * BATCHES_PER_THREAD))))

    def map(self, function: Callable[[Any], Any], items: list) -> Iterator[Any]:
        """Yield ``function(item)`` for every item, a batch at a time as batches finish."""
        distributed = _distributed()
        size = self._batch_size(len(items))
        futures = [
            self.client.submit(
                run_batch, function, items[start : start + size], retries=self.retries, pure=False
            )
            for start in range(0, len(items), size)
        ]
        try:
            for future in distributed.as_completed(futures):
                yield from future.result()
        finally:
            self.client.cancel(futures)

    def on_each_host(self, function: Callable[[], Any]) -> list[Any]:
        """``function()`` on every worker (callers tell hosts apart by what it returns)."""
        return list(self.client.run(function, on_error="ignore").values())


@contextlib.contextmanager
def dask_executor(scheduler: str, jobs: int = 8) -> Iterator[DaskExecutor]:
    """A :class:`DaskExecutor` on the scheduler at ``scheduler``, or on a local cluster of N
    worker processes for ``local:N`` (``jobs`` threads in all); closed on exit.

    A bad scheduler text, or dask missing, is a :class:`UsageError` naming ``--dask``."""
    try:
        distributed = _distributed()
    except ImportError as exc:
        raise UsageError(f"--dask: {exc}") from None
    with contextlib.ExitStack() as stack:
        if scheduler.startswith(LOCAL_PREFIX):
            workers = _local_workers(scheduler)
            cluster = stack.enter_context(
                distributed.LocalCluster(
                    n_workers=workers,
                    threads_per_worker=max(1, jobs // workers),
                    processes=True,
                    dashboard_address=None,
                    silence_logs=logging.ERROR,
                )
            )
            client = stack.enter_context(distributed.Client(cluster))
        else:
            try:
                client = stack.enter_context(distributed.Client(scheduler, timeout="30s"))
            except (OSError, ValueError, TypeError) as exc:
                raise UsageError(f"--dask: cannot reach scheduler {scheduler!r}: {exc}") from None
        yield DaskExecutor(client)


def _local_workers(scheduler: str) -> int:
    text = scheduler[len(LOCAL_PREFIX) :]
    if not text.isdigit() or int(text) < 1:
        raise UsageError(f"--dask {scheduler!r}: expected local:N with N >= 1 worker processes")
    return int(text)


def _executor(client: Any, executor: Executor | None) -> Executor:
    if executor is not None:
        return executor
    if client is None:
        client = _distributed().get_client()
    return DaskExecutor(client)


def _options(storage_options: dict[str, dict] | None, cache: bool) -> dict[str, dict]:
    options = {protocol: dict(table) for protocol, table in (storage_options or {}).items()}
    if not cache:
        options.setdefault("wds", {})["cache"] = False
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
    one), or ``executor`` anything with the :class:`~fsspec_shards.cli.parallel.Executor`
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
) -> str:
    """Hash every shard on a dask cluster and write the ``sha256sum`` manifest to ``output``
    (a path or URL; names relative to its directory); returns the manifest's text."""
    options = _options(storage_options, cache=False)
    found = shard_urls(urls, options)
    output = manifest_location(output)
    made = build_manifest(found, output, options, _executor(client, executor), max_member_size)
    write_text(output, made.text, options)
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
