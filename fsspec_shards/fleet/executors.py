"""Executors: where per-shard work runs. Threads of this process here; dask workers in
:mod:`fsspec_shards.fleet.dask_executor`.

An executor has ``map(function, items)``, yielding ``function(item)`` for every item as it
finishes (in any order), and ``on_each_host(function)``, the results of ``function()`` run
once in each place that holds a cache (here: this process). Invariants: every item yields
exactly one result; per-shard problems are results (the work functions describe them), so an
exception out of ``function`` is unexpected and ends the map, raised in the caller.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any, Protocol


class Executor(Protocol):
    """What the chores need of an executor."""

    def map(self, function: Callable[[Any], Any], items: list) -> Iterator[Any]: ...

    def on_each_host(self, function: Callable[[], Any]) -> list[Any]: ...


class ThreadExecutor:
    """Per-shard work in ``jobs`` daemon threads of this process.

    Daemon threads let Ctrl-C end the command at once instead of waiting for downloads in
    flight; the cache is safe against that by design (entries are whole or absent).
    """

    def __init__(self, jobs: int) -> None:
        self.jobs = jobs

    def map(self, function: Callable[[Any], Any], items: list) -> Iterator[Any]:
        tasks: queue.Queue = queue.Queue()
        results: queue.Queue = queue.Queue()
        for item in items:
            tasks.put(item)

        def work() -> None:
            while True:
                try:
                    item = tasks.get_nowait()
                except queue.Empty:
                    return
                try:
                    results.put((True, function(item)))
                except Exception as exc:
                    results.put((False, exc))

        for _ in range(max(1, min(self.jobs, len(items)))):
            threading.Thread(target=work, daemon=True, name="fsspec-shards-fleet").start()
        for _ in items:
            done, value = results.get()
            if not done:
                raise value
            yield value

    def on_each_host(self, function: Callable[[], Any]) -> list[Any]:
        return [function()]
