"""Per-shard work in parallel threads, yielding outcomes as they finish.

Invariant: every item given yields exactly one :class:`Outcome`, holding either the result or
the exception the work raised; an exception never ends the other items' work.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any


@dataclass
class Outcome:
    """What one item of parallel work gave: a result, or the exception it raised."""

    item: Any
    result: Any = None
    error: Exception | None = None


def run_parallel(function: Callable[[Any], Any], items: list, jobs: int) -> Iterator[Outcome]:
    """Yield ``function(item)`` outcomes as they finish, from ``jobs`` daemon threads.

    Daemon threads let Ctrl-C end the command at once instead of waiting for downloads in
    flight; the cache is safe against that by design (entries are whole or absent).
    """
    tasks: queue.Queue = queue.Queue()
    outcomes: queue.Queue = queue.Queue()
    for item in items:
        tasks.put(item)

    def work() -> None:
        while True:
            try:
                item = tasks.get_nowait()
            except queue.Empty:
                return
            try:
                outcomes.put(Outcome(item, result=function(item)))
            except Exception as exc:
                outcomes.put(Outcome(item, error=exc))

    for _ in range(max(1, min(jobs, len(items)))):
        threading.Thread(target=work, daemon=True, name="fsspec-shards-cli").start()
    for _ in items:
        yield outcomes.get()
