"""Exact resumption with the plain ``torch.utils.data.DataLoader``, which has no state API.

Each sample of a dataset made with ``annotate=True`` carries ``__worker__`` (its consumer's
worker index) and ``__index__`` (its position in that consumer's epoch stream). In the main
process a :class:`DeliveryTracker` reads them off every batch the training loop consumes and
keeps, per worker, how many samples were delivered, plus which worker's batch comes next.
``dataset.load_state_dict(tracker.state_dict())`` then makes every worker fast-forward to
its count by reading tar headers only (payloads are sought over), and rotates the workers so
that the DataLoader's round-robin continues with the worker that was next.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

TRACKER_STATE_KIND = "delivered-per-worker"


@dataclass(slots=True)
class DeliveredCounts:
    """Samples delivered per worker in one epoch, and the worker whose batch comes next."""

    fingerprint: dict[str, Any]
    epoch: int
    delivered: list[int]
    next_worker: int
    remainder: list | None = None
    """The pieces the epoch is the rest of (a regrouped epoch), as the dataset lists them."""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict."""
        state = {
            "kind": TRACKER_STATE_KIND,
            "fingerprint": dict(self.fingerprint),
            "epoch": self.epoch,
            "delivered": list(self.delivered),
            "next_worker": self.next_worker,
        }
        if self.remainder is not None:
            state["remainder"] = self.remainder
        return state

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DeliveredCounts:
        """Parse :meth:`to_dict` output; ValueError when it is not such a state."""
        try:
            counts = cls(
                fingerprint=dict(data["fingerprint"]),
                epoch=int(data["epoch"]),
                delivered=[int(count) for count in data["delivered"]],
                next_worker=int(data["next_worker"]),
                remainder=data.get("remainder"),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed DeliveryTracker state: {exc!r}") from None
        if not 0 <= counts.next_worker < max(len(counts.delivered), 1):
            raise ValueError(f"malformed DeliveryTracker state: next_worker {counts.next_worker}")
        return counts


def is_tracker_state(data: Any) -> bool:
    """True for a :class:`DeliveryTracker` state rather than a dataset state."""
    return isinstance(data, Mapping) and data.get("kind") == TRACKER_STATE_KIND


class DeliveryTracker:
    """Counts, in the main process, the samples each DataLoader worker delivered this epoch.

    ``dataset`` is the annotated ShardDataset given to the DataLoader and ``num_workers`` the
    DataLoader's. Call :meth:`update` with every batch the loop consumes (a collated dict or a
    list of sample dicts) and :meth:`set_epoch` along with ``dataset.set_epoch``. In an epoch
    that continues a regrouped remainder, :meth:`state_dict` carries that remainder (asked
    of the dataset), so that resuming it resumes the remainder.
    """

    def __init__(self, dataset: Any, num_workers: int) -> None:
        if not getattr(dataset, "annotate", False):
            raise ValueError("DeliveryTracker needs a ShardDataset made with annotate=True")
        self.workers = max(int(num_workers), 1) if dataset.split_by_worker else 1
        self.dataset = dataset
        self.fingerprint = dataset.tracker_fingerprint(self.workers)
        self.epoch = dataset.epoch
        self.delivered = [0] * self.workers
        self.next_worker = 0

    def set_epoch(self, epoch: int) -> None:
        """Start counting a new epoch."""
        self.epoch = int(epoch)
        self.delivered = [0] * self.workers
        self.next_worker = 0

    def update(self, batch: Any) -> Any:
        """Record the samples of a consumed batch; returns the batch unchanged."""
        workers, indices = _positions(batch)
        for worker, index in zip(workers, indices, strict=True):
            self.delivered[worker] = max(self.delivered[worker], index + 1)
        if workers:
            self.next_worker = (workers[-1] + 1) % self.workers
        return batch

    def state_dict(self) -> dict[str, Any]:
        """The counts, for ``dataset.load_state_dict`` before the resumed DataLoader starts."""
        remainder = self.dataset.remainder_segments(self.epoch)
        return DeliveredCounts(
            self.fingerprint, self.epoch, self.delivered, self.next_worker, remainder
        ).to_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue counting from a saved state."""
        counts = DeliveredCounts.from_dict(state)
        if len(counts.delivered) != self.workers:
            raise ValueError(
                f"the state counts {len(counts.delivered)} workers, this tracker {self.workers}"
            )
        self.epoch = counts.epoch
        self.delivered = list(counts.delivered)
        self.next_worker = counts.next_worker


def _as_ints(values: Any) -> list[int]:
    if hasattr(values, "tolist"):
        values = values.tolist()
    if isinstance(values, int):
        return [values]
    return [int(value) for value in values]


def _positions(batch: Any) -> tuple[list[int], list[int]]:
    """(worker, index) of every sample in a collated dict batch or a list of samples."""
    if isinstance(batch, Mapping):
        return _as_ints(batch["__worker__"]), _as_ints(batch["__index__"])
    samples = list(batch)
    return [int(s["__worker__"]) for s in samples], [int(s["__index__"]) for s in samples]
