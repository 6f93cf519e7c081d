"""The dask executor: per-shard work on the workers of a dask cluster, in batches.

Invariants:

- Shards go to the workers in batches (a few per worker thread, so that a cluster is kept
  busy without one task per shard); each shard's problem is part of its result, so a bad
  shard never fails its batch. A batch whose worker dies is run again elsewhere (dask
  reschedules it), and an exception in a batch is retried ``retries`` times.
- The chores reassemble results in shard order, so the manifest bytes, the verify table and
  the exit codes equal a run on :class:`~fsspec_shards.fleet.executors.ThreadExecutor`.
- dask is optional (``pip install 'fsspec-shards[dask]'``); without it the executor raises an
  ``ImportError`` saying so when it is used.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable, Iterator
from typing import Any

from fsspec_shards.fleet.errors import InputError

__all__ = ["DaskExecutor", "dask_executor", "default_dask_executor"]

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

    A bad scheduler text, or one that cannot be reached, is an :class:`InputError`; dask
    missing an ``ImportError`` saying what to install."""
    distributed = _distributed()
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
                raise InputError(f"cannot reach dask scheduler {scheduler!r}: {exc}") from None
        yield DaskExecutor(client)


def _local_workers(scheduler: str) -> int:
    text = scheduler[len(LOCAL_PREFIX) :]
    if not text.isdigit() or int(text) < 1:
        raise InputError(
            f"dask scheduler {scheduler!r}: expected an address or local:N with N >= 1 "
            "worker processes"
        )
    return int(text)


def default_dask_executor(client: Any = None) -> DaskExecutor:
    """A :class:`DaskExecutor` on ``client``, else on the current dask client."""
    return DaskExecutor(client if client is not None else _distributed().get_client())
