"""The epoch a dataset reads, set in the main process and seen by its DataLoader workers.

A DataLoader with ``persistent_workers=True`` keeps the workers' copies of the dataset from
one epoch to the next, so ``dataset.set_epoch(e)`` in the main process changes only the main
copy. :class:`EpochNumber` keeps the epoch in a shared 8-byte value (a
``multiprocessing.RawValue``, made with the dataset, before any worker starts, so a forked
worker inherits it and a spawned one receives it with the dataset) besides a local copy.
The process that made it publishes every epoch set there; another process (a worker) takes
the published epoch at the start of each iteration (:meth:`EpochNumber.follow`) when it
changed since that process last looked, else keeps the epoch it set itself (a mixture's
source rounds, a loaded state).

A process that is handed the value and is not a DataLoader worker (a trainer started by
``torch.multiprocessing.spawn(train, args=(dataset,))``, a deepcopy, a dask task) makes a
value of its own at its first ``set``, for the workers it starts after: it shares nothing
with the process it came from. When no shared value can be made, a worker that starts the
same epoch a second time warns: ``set_epoch`` in the main process cannot reach it.

Uses the standard library's ``multiprocessing.context.get_spawning_popen`` (undocumented):
the check a shared value's own pickling makes, to tell a worker's start from other pickling.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
from multiprocessing.context import get_spawning_popen
from typing import Any

from fsspec_shards.iteration.order import in_dataloader_worker

logger = logging.getLogger("fsspec_shards.dataset")


class EpochNumber:
    """An epoch number that DataLoader workers (persistent ones included) follow."""

    __slots__ = ("_iterated", "_owner", "_seen", "_shared", "value")

    def __init__(self, epoch: int = 0) -> None:
        self.value = int(epoch)
        self._own()
        self._iterated: int | None = None

    def _own(self) -> None:
        """Make this process the owner of a new shared value holding its epoch."""
        self._owner: int | None = os.getpid()
        try:
            self._shared: Any = multiprocessing.RawValue("q", self.value)
        except OSError as exc:  # no shared memory (a read-only /dev/shm and temp directory)
            logger.debug("no shared epoch value: %s", exc)
            self._shared = None
        self._seen = self.value

    def set(self, epoch: int) -> None:
        """Make ``epoch`` this process's epoch; published to the workers from the owner."""
        self.value = int(epoch)
        if os.getpid() != self._owner and not in_dataloader_worker():
            self._own()
        if self._shared is None:
            return
        if os.getpid() == self._owner:
            self._shared.value = self.value
        self._seen = self._shared.value

    def follow(self) -> int:
        """The epoch an iteration starting now reads: the owner's latest when it changed
        since this process looked, else this process's own."""
        if os.getpid() == self._owner or self._owner is None:
            return self.value
        if self._shared is None:
            if self._iterated == self.value:
                logger.warning(
                    "a DataLoader worker starts epoch %d again: set_epoch() in the main process "
                    "cannot reach a persistent worker here (no shared memory), so every epoch "
                    "repeats this order; use persistent_workers=False",
                    self.value,
                )
            self._iterated = self.value
            return self.value
        published = self._shared.value
        if published != self._seen:
            self._seen = self.value = published
        return self.value

    def __getstate__(self) -> dict[str, Any]:
        state = {name: getattr(self, name) for name in self.__slots__}
        if get_spawning_popen() is None:
            state["_shared"] = None
            state["_owner"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        for name, value in state.items():
            setattr(self, name, value)
