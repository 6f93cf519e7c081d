"""One background thread of a process working through a queue, in order.

Work that must stay off a reader's path (making cached files durable: ``durability.py``;
deleting the files of a mass eviction: ``cache/deletion.py``) is queued here. The thread
starts with the first item and lives as long as the process (a daemon); :meth:`drain`
waits for everything queued so far. A forked child starts with an empty queue and no
thread: its parent finishes what it queued.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("fsspec_shards.storage.cache")


class WorkerThread:
    """Calls ``work(*item)`` for each submitted item, in order, on a thread named ``name``.

    ``work`` reports its own failures; one that escapes is logged and the queue goes on."""

    def __init__(self, name: str, work: Callable[..., None]) -> None:
        self._name = name
        self._work = work
        self._forget()
        os.register_at_fork(after_in_child=self._forget)

    def submit(self, *item: Any) -> None:
        with self._cond:
            self._queue.append(item)
            self._busy += 1
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def drain(self) -> None:
        """Wait until every item submitted so far is done (or failed)."""
        with self._cond:
            while self._busy:
                self._cond.wait()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue:
                    self._cond.wait()
                item = self._queue.popleft()
            try:
                self._work(*item)
            except Exception as error:
                logger.warning("%s: %r failed: %s", self._name, item, error)
            finally:
                with self._cond:
                    self._busy -= 1
                    self._cond.notify_all()

    def _forget(self) -> None:
        """(Also in a forked child: the parent does what it queued; the child starts afresh.)"""
        self._queue: deque[tuple[Any, ...]] = deque()
        self._busy = 0
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
