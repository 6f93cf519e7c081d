"""MixedDataset: samples drawn from several datasets by weight or by count, deterministic
and resumable.

Each sample of the mixture comes from a source chosen by a weighted draw of a
:class:`~fsspec_shards.iteration.rng.CounterRNG` keyed by (seed, epoch, rank, worker), so the
mixture is the same on every run and machine. Every source keeps its own shard order,
shuffle buffer and split over ranks and workers.

Invariant: after each delivered sample, the mixture's whole position is the draw counter,
per source how often it was restarted (``rounds``) and whether it is done, and each source's
own ``state_dict()``. :meth:`MixedDataset.state_dict` returns exactly that, and a fresh
mixture given it by :meth:`MixedDataset.load_state_dict` continues the same stream.

When a drawn source is exhausted, ``stop`` decides: ``"first_exhausted"`` ends the epoch,
``"all_exhausted"`` drops that source and draws among the rest (every sample of every source
once per epoch), ``"never"`` restarts it on its next round, an epoch of its own (round ``r``
of mixture epoch ``e`` is source epoch ``e + r * ROUND_EPOCH_STRIDE``), so the mixture is
endless.

With ``repeat=`` or ``choose=`` instead of weights, each consumer's epoch takes a fixed number
of samples of every source (its quota, :func:`quota`): the next sample comes from source
``i`` with chance proportional to what is left of its quota, so the epoch is a uniformly
random interleaving of the quotas; a source whose stream ends before its quota is done
restarts on its next round, as with ``"never"``.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import math
import numbers
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Any

from fsspec_shards.config import is_int
from fsspec_shards.iteration.epoch import EpochNumber
from fsspec_shards.iteration.order import Consumer, node_split, worker_split
from fsspec_shards.iteration.plan import proportional_shares
from fsspec_shards.iteration.rng import CounterRNG, derive_key

try:
    from torch.utils.data import IterableDataset as _DatasetBase
except ImportError:
    _DatasetBase = object

logger = logging.getLogger("fsspec_shards.mixing")

STOP_MODES = ("first_exhausted", "all_exhausted", "never")
ROUND_EPOCH_STRIDE = 1 << 20
MIX_STATE_KIND = "mixture"
_UNIT = 1.0 / (1 << 53)


def source_epoch(epoch: int, round_: int) -> int:
    """The epoch a source reads in its ``round_``-th pass of mixture epoch ``epoch``."""
    return epoch + round_ * ROUND_EPOCH_STRIDE


@dataclass(slots=True)
class MixState:
    """The mixer's own position: the draw counter, and per source its round, whether it is
    done, the samples it delivered this epoch and in its current round."""

    fingerprint: dict[str, Any]
    epoch: int
    rng_counter: int = 0
    rounds: list[int] = field(default_factory=list)
    exhausted: list[bool] = field(default_factory=list)
    delivered: list[int] = field(default_factory=list)
    round_delivered: list[int] = field(default_factory=list)
    finished: bool = False

    @classmethod
    def start(cls, fingerprint: dict[str, Any], epoch: int, sources: int) -> MixState:
        zeros = [0] * sources
        return cls(fingerprint, epoch, 0, list(zeros), [False] * sources, list(zeros), zeros)

    def to_dict(self, source_states: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "kind": MIX_STATE_KIND,
            "fingerprint": dict(self.fingerprint),
            "epoch": self.epoch,
            "rng_counter": self.rng_counter,
            "rounds": list(self.rounds),
            "exhausted": list(self.exhausted),
            "delivered": list(self.delivered),
            "round_delivered": list(self.round_delivered),
            "finished": self.finished,
            "sources": source_states,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], sources: int) -> MixState:
        """Parse and check :meth:`to_dict` output; ValueError naming the first bad field."""
        if not isinstance(data, Mapping) or data.get("kind") != MIX_STATE_KIND:
            raise ValueError("not a MixedDataset state (expected a dict with kind 'mixture')")
        counts = {
            name: [_item(name, value, int, 0) for value in _list(data, name, sources)]
            for name in ("rounds", "delivered", "round_delivered")
        }
        state = cls(
            fingerprint=_item("fingerprint", data.get("fingerprint"), dict),
            epoch=_item("epoch", data.get("epoch"), int, 0),
            rng_counter=_item("rng_counter", data.get("rng_counter"), int, 0),
            exhausted=[
                _item("exhausted", done, bool) for done in _list(data, "exhausted", sources)
            ],
            finished=_item("finished", data.get("finished"), bool),
            **counts,
        )
        _list(data, "sources", sources)
        pairs = zip(state.round_delivered, state.delivered, strict=True)
        if any(in_round > in_epoch for in_round, in_epoch in pairs):
            raise ValueError("MixedDataset state field 'round_delivered': above 'delivered'")
        if all(state.exhausted) and not state.finished:
            raise ValueError("MixedDataset state field 'finished': false with every source done")
        return state


class MixedDataset(_DatasetBase):
    """Samples of several datasets (``ShardDataset`` or any resumable iterable), by weight
    or by count.

    One of three ways per mixture: ``weights`` (positive, default equal) are the chances of
    each source per sample, among the sources still running, and ``stop`` is
    ``"first_exhausted"`` (default), ``"all_exhausted"`` or ``"never"``; ``repeat`` takes
    each source's epoch ``r`` times (0.5: half of it, 2: twice, the second pass in a new
    order); ``choose`` takes exactly ``n`` samples of each source per epoch (over all ranks
    and workers). ``repeat``/``choose`` need the sources' lengths (``len()``: ShardDataset
    with sample counts) and end the epoch when every quota is taken. ``seed`` and the epoch
    (:meth:`set_epoch`, given to every source too) decide the draws. See the module docstring
    and docs/mixing.md.

    Sources need ``set_epoch``, ``state_dict`` and ``load_state_dict`` to resume; each keeps
    its own shuffle and split. ``batch_size`` B (with weights, ``stop="all_exhausted"``;
    every source a ShardDataset made with ``batch_size=B``): each consumer's mixture is whole
    batches, so ``len(mix)`` gives an exact ``len(DataLoader(mix, batch_size=B))``. A
    ``torch.utils.data.IterableDataset`` when torch is installed: works in DataLoader workers
    and with torchdata's StatefulDataLoader.
    """

    def __init__(
        self,
        sources: Sequence[Any],
        weights: Sequence[float] | None = None,
        *,
        repeat: Sequence[float] | None = None,
        choose: Sequence[int] | None = None,
        seed: int = 0,
        stop: str | None = None,
        batch_size: int | None = None,
    ) -> None:
        self.datasets = list(sources)
        if not self.datasets:
            raise ValueError("MixedDataset needs at least one source")
        given = [name for name, value in _modes(weights, repeat, choose) if value is not None]
        if len(given) > 1:
            raise ValueError(
                f"MixedDataset takes one of weights=, repeat=, choose=, got {' and '.join(given)}"
            )
        self.repeat = _per_source("repeat", repeat, self.datasets, _check_repeat)
        self.choose = _per_source("choose", choose, self.datasets, _check_choose)
        counting = self.repeat is not None or self.choose is not None
        if counting and stop is not None:
            raise ValueError(
                f"stop= applies to weights; with {given[0]}= the epoch ends when every "
                f"source's quota is taken (got stop={stop!r})"
            )
        if weights is None:
            weights = [1.0] * len(self.datasets)
        self.weights = [float(weight) for weight in weights]
        if len(self.weights) != len(self.datasets):
            raise ValueError(
                f"weights has {len(self.weights)} values for {len(self.datasets)} datasets"
            )
        if not all(math.isfinite(weight) and weight > 0 for weight in self.weights):
            raise ValueError(f"weights must be positive and finite, got {list(weights)}")
        if stop is None and not counting:
            stop = "first_exhausted"
        if stop not in STOP_MODES and not counting:
            raise ValueError(f"stop must be one of {STOP_MODES}, got {stop!r}")
        if not is_int(seed):
            raise ValueError(f"seed must be an int, got {seed!r}")
        self.seed = seed
        self.stop = stop
        self.batch_size = _check_batch_size(batch_size, self.datasets, stop, counting)
        if counting:
            for index, dataset in enumerate(self.datasets):
                _length_of(dataset, index, given[0])
        self._epoch = EpochNumber()
        self._pending: MixState | None = None
        self._live: MixState | None = None

    # --- epochs and state ---------------------------------------------------------------

    @property
    def epoch(self) -> int:
        return self._epoch.value

    @property
    def by_count(self) -> bool:
        """Whether the epoch takes quotas (``repeat``/``choose``; ``stop`` is then None)."""
        return self.stop is None

    @epoch.setter
    def epoch(self, epoch: int) -> None:
        self._epoch.set(epoch)

    def __len__(self) -> int:
        """Samples of one epoch of this consumer (in the main process, this rank's): the
        quotas added with ``repeat``/``choose``, the sources' lengths added when every sample
        of every source is delivered (``stop="all_exhausted"``); else TypeError."""
        if self.by_count:
            return sum(self.quotas(self.epoch))
        if self.stop != "all_exhausted":
            raise TypeError(f"len() of a MixedDataset needs stop='all_exhausted', not {self.stop}")
        return sum(len(dataset) for dataset in self.datasets)

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch of the next iteration, for the draws and every source."""
        self.epoch = int(epoch)
        for dataset in self.datasets:
            dataset.set_epoch(self.epoch)

    def state_dict(self) -> dict[str, Any]:
        """The position after the last delivered sample, as a JSON-serialisable dict."""
        for state in (self._live, self._pending):
            if state is not None and state.epoch == self.epoch:
                return state.to_dict([dataset.state_dict() for dataset in self.datasets])
        start = MixState.start(self._fingerprint(), self.epoch, len(self.datasets))
        return start.to_dict([dataset.state_dict() for dataset in self.datasets])

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state`` at the next iteration; ValueError if made otherwise."""
        loaded = MixState.from_dict(state, len(self.datasets))
        expected = self._fingerprint()
        for name in sorted(set(expected) | set(loaded.fingerprint)):
            if loaded.fingerprint.get(name) != expected.get(name):
                raise ValueError(
                    f"the MixedDataset state was made with {name}="
                    f"{loaded.fingerprint.get(name)!r}, this mixture has {expected.get(name)!r}"
                )
        if not (self.stop == "never" or self.by_count) and any(loaded.rounds):
            raise ValueError("MixedDataset state field 'rounds': restarts happen only with 'never'")
        if self.stop == "first_exhausted" and any(loaded.exhausted) and not loaded.finished:
            raise ValueError(
                "MixedDataset state field 'finished': false with a source done under "
                "'first_exhausted'"
            )
        for dataset, source_state in zip(self.datasets, state["sources"], strict=True):
            dataset.load_state_dict(source_state)
        self._pending = loaded
        self._live = None
        self.epoch = loaded.epoch

    get_state = state_dict
    set_state = load_state_dict

    def quotas(self, epoch: int) -> list[int]:
        """With ``repeat``/``choose``: the samples this consumer takes from each source in
        ``epoch`` (in the main process, this rank's); see :func:`quota`."""
        if not self.by_count:
            raise TypeError("quotas are those of a mixture made with repeat= or choose=")
        name = "repeat" if self.repeat is not None else "choose"
        return [
            quota(dataset, epoch, index, self.repeat, self.choose, self.batch_size, name)
            for index, dataset in enumerate(self.datasets)
        ]

    def _fingerprint(self) -> dict[str, Any]:
        rank, world_size, worker, num_workers = _consumer(self.datasets)
        counts = {}
        if self.by_count:
            counts = {"repeat": self.repeat, "choose": self.choose, "batch_size": self.batch_size}
        return {
            **counts,
            "sources": len(self.datasets),
            "weights": list(self.weights),
            "seed": self.seed,
            "stop": self.stop,
            "rank": rank,
            "world_size": world_size,
            "worker": worker,
            "num_workers": num_workers,
        }

    # --- iteration ----------------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:
        self._epoch.follow()
        state = self._start_state()
        self._live = state
        for index, dataset in enumerate(self.datasets):
            dataset.set_epoch(source_epoch(state.epoch, state.rounds[index]))
        return self._mix(state)

    def _start_state(self) -> MixState:
        """The loaded state when it is for this epoch, else the start of this epoch."""
        pending, self._pending = self._pending, None
        if pending is not None and pending.epoch == self.epoch:
            return pending
        if pending is not None:
            logger.info(
                "dropping the loaded mixture state of epoch %d: set_epoch(%d) chose another",
                pending.epoch,
                self.epoch,
            )
        return MixState.start(self._fingerprint(), self.epoch, len(self.datasets))

    def _mix(self, state: MixState) -> Iterator[Any]:
        rank, _, worker, _ = _consumer(self.datasets)
        rng = CounterRNG(derive_key("mix", self.seed, state.epoch, rank, worker), state.rng_counter)
        iterators: list[Iterator[Any] | None] = [
            None if done else iter(dataset)
            for dataset, done in zip(self.datasets, state.exhausted, strict=True)
        ]
        if self.by_count:
            yield from self._count(state, rng, iterators)
        else:
            yield from self._weigh(state, rng, iterators)

    def _count(
        self, state: MixState, rng: CounterRNG, iterators: list[Iterator[Any] | None]
    ) -> Iterator[Any]:
        """The ``repeat``/``choose`` mixture: each draw picks a source with chance in
        proportion to what is left of its quota, until every quota is taken."""
        left = [
            max(0, quota - done)
            for quota, done in zip(self.quotas(state.epoch), state.delivered, strict=True)
        ]
        try:
            while not state.finished:
                running = [0 if done else n for n, done in zip(left, state.exhausted, strict=True)]
                total = sum(running)
                if total == 0:
                    state.finished = True
                    break
                point = (rng.next_u64() * total) >> 64
                state.rng_counter = rng.counter
                index = 0
                while point >= running[index]:
                    point -= running[index]
                    index += 1
                sample = next(iterators[index], _END)
                if sample is _END:
                    iterators[index] = self._source_ended(state, index)
                    continue
                state.delivered[index] += 1
                state.round_delivered[index] += 1
                left[index] -= 1
                yield sample
        finally:
            _close(iterators)

    def _weigh(
        self, state: MixState, rng: CounterRNG, iterators: list[Iterator[Any] | None]
    ) -> Iterator[Any]:
        """The ``weights`` mixture: each draw picks a running source by weight."""
        choose = _WeightedChoice(self.weights, state.exhausted)
        draw = rng.next_u64
        delivered, round_delivered = state.delivered, state.round_delivered
        try:
            while not state.finished:
                index = choose(draw())
                state.rng_counter = rng.counter
                sample = next(iterators[index], _END)
                if sample is _END:
                    iterators[index] = self._source_ended(state, index)
                    choose = _WeightedChoice(self.weights, state.exhausted)
                    continue
                delivered[index] += 1
                round_delivered[index] += 1
                yield sample
        finally:
            _close(iterators)

    def _source_ended(self, state: MixState, index: int) -> Iterator[Any] | None:
        """Apply ``stop`` to an exhausted source: its next iterator, or None when it is done."""
        if self.stop == "first_exhausted":
            state.finished = True
            return None
        if (self.stop == "never" or self.by_count) and state.round_delivered[index]:
            state.rounds[index] += 1
            state.round_delivered[index] = 0
            dataset = self.datasets[index]
            dataset.set_epoch(source_epoch(state.epoch, state.rounds[index]))
            return iter(dataset)
        if self.stop == "never" or self.by_count:
            logger.warning("mixture source %d yields no samples: leaving it out", index)
        state.exhausted[index] = True
        state.finished = all(state.exhausted)
        return None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_live"] = None
        return state


_END = object()


def _close(iterators: Sequence[Iterator[Any] | None]) -> None:
    for iterator in iterators:
        close = getattr(iterator, "close", None)
        if close is not None:
            close()


def quota(
    source: Any,
    epoch: int,
    index: int,
    repeat: Sequence[float] | None,
    choose: Sequence[int] | None,
    batch_size: int | None,
    name: str,
) -> int:
    """The samples this consumer takes from ``source`` in ``epoch``.

    A rank's quota, in units of ``batch_size`` (or of one sample): with ``repeat`` ``r``,
    ``floor(r * K)`` of the rank's ``K`` units of the source's epoch; with ``choose`` ``n``,
    the rank's even share of ``n`` (ranks differ by at most one sample; with ``batch_size``
    every rank takes ``floor(n // world_size / batch_size)`` batches). A DataLoader worker
    takes a part of its rank's quota in proportion to its own part of the source, in whole
    units, so the workers of a rank together take the rank's quota for any worker count,
    and ``repeat=1`` takes every sample once.
    """
    unit = batch_size or 1
    consumer, parts = _parts(source, epoch, index, name)
    units = [part // unit for part in parts]
    if repeat is not None:
        rank_units = math.floor(Fraction(repr(repeat[index])) * sum(units))  # 0.29 * 100 = 29
    elif batch_size is None:
        rank_units = choose[index] // consumer.world_size + (
            consumer.rank < choose[index] % consumer.world_size
        )
    else:
        rank_units = choose[index] // consumer.world_size // batch_size
    return proportional_shares(rank_units, units)[consumer.worker] * unit


def _parts(source: Any, epoch: int, index: int, name: str) -> tuple[Consumer, list[int]]:
    """This consumer, and the samples each DataLoader worker of its rank reads from
    ``source`` in one pass of ``epoch``: from the source's plans when it has them (a
    ShardDataset), else ``len(source)`` as this consumer's alone."""
    plan = getattr(source, "plan", None)
    consumer_of = getattr(source, "consumer", None)
    if callable(plan) and callable(consumer_of):
        consumer = consumer_of()
        parts = []
        for worker in range(consumer.num_workers):
            found = plan(epoch, replace(consumer, worker=worker))
            parts.append(found.own if found.length is None else found.length)
        if None not in parts:
            return consumer, parts
    rank, world_size, _, _ = _consumer([source])
    return Consumer(rank, world_size, 0, 1), [_length_of(source, index, name)]


def _length_of(source: Any, index: int, name: str) -> int:
    """``len(source)``; ValueError saying that ``name=`` needs it."""
    try:
        return len(source)
    except TypeError:
        raise ValueError(
            f"{name}= needs the length of source {index}: make a ShardDataset with "
            "samples_per_shard= or count_samples=True, or give the source a __len__"
        ) from None


def _modes(weights: Any, repeat: Any, choose: Any) -> list[tuple[str, Any]]:
    return [("weights", weights), ("repeat", repeat), ("choose", choose)]


def _per_source(name: str, values: Any, sources: Sequence[Any], check: Any) -> list | None:
    """``values`` (one per source) each checked by ``check``; None when not given."""
    if values is None:
        return None
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise ValueError(f"{name} must be a list of one value per source, got {values!r}")
    if len(values) != len(sources):
        raise ValueError(f"{name} has {len(values)} values for {len(sources)} sources")
    checked = [check(name, value) for value in values]
    if not any(checked):
        raise ValueError(f"{name} takes no sample of any source: {list(values)}")
    return checked


def _check_repeat(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} values must be numbers, got {value!r}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} values must be finite and >= 0, got {value!r}")
    return float(value)


def _check_choose(name: str, value: Any) -> int:
    if not is_int(value) or value < 0:
        raise ValueError(f"{name} values must be ints >= 0, got {value!r}")
    return int(value)


def _check_batch_size(
    batch_size: Any, sources: Sequence[Any], stop: str | None, counting: bool
) -> int | None:
    """``batch_size``, when whole batches per source add up to an exact mixture length."""
    if batch_size is None:
        return None
    if not counting and stop != "all_exhausted":
        raise ValueError(f"batch_size= needs stop='all_exhausted' (every sample once), not {stop}")
    for index, source in enumerate(sources):
        if getattr(source, "batch_size", None) != batch_size:
            raise ValueError(
                f"source {index} has batch_size={getattr(source, 'batch_size', None)!r}: make "
                f"every source with batch_size={batch_size!r}, so each gives whole batches"
            )
    return batch_size


class _WeightedChoice:
    """Picks a source among those not exhausted, with chances proportional to weights.

    A 64-bit draw becomes a point in ``[0, total weight)`` (its top 53 bits, exactly), and
    the source is the one whose share of the cumulative weights holds the point. The weights
    are first scaled by the power of two that brings the largest into ``[0.5, 1)``: their sum
    cannot overflow nor the point underflow (``[1.7e308] * 2``, ``[5e-324] * 2``), and the
    scaling is exact, so ordinary weights draw exactly as unscaled ones.
    """

    __slots__ = ("cumulative", "running", "scale")

    def __init__(self, weights: Sequence[float], exhausted: Sequence[bool]) -> None:
        self.running = [index for index, done in enumerate(exhausted) if not done]
        top = max((weights[index] for index in self.running), default=1.0)
        shift = -math.frexp(top)[1]
        self.cumulative = list(
            itertools.accumulate(math.ldexp(weights[index], shift) for index in self.running)
        )
        self.scale = _UNIT * self.cumulative[-1] if self.running else 0.0

    def __call__(self, draw: int) -> int:
        position = bisect.bisect_right(self.cumulative, (draw >> 11) * self.scale)
        return self.running[min(position, len(self.running) - 1)]


def _consumer(sources: Sequence[Any]) -> tuple[int, int, int, int]:
    """(rank, world size, DataLoader worker id, workers) of this process, as the first source
    sees it (its ``rank``/``group`` arguments included): the first and third key the draws
    of each consumer; all four must match for a state to resume."""
    consumer = getattr(sources[0], "consumer", None)
    if callable(consumer):
        found = consumer()
        return found.rank, found.world_size, found.worker, found.num_workers
    try:
        rank, world_size = node_split()
    except ValueError:
        rank, world_size = 0, 1  # the sources decide whether a missing RANK is an error
    return (rank, world_size, *worker_split())


def _item(name: str, value: Any, kind: type, minimum: int | None = None) -> Any:
    """``value`` of state field ``name``, checked to be a ``kind`` (and at least ``minimum``)."""
    if isinstance(value, bool) is not (kind is bool) or not isinstance(value, kind):
        raise ValueError(f"MixedDataset state field {name!r}: expected {kind.__name__} values")
    if minimum is not None and value < minimum:
        raise ValueError(f"MixedDataset state field {name!r}: {value} is below {minimum}")
    return value


def _list(data: Mapping[str, Any], name: str, length: int) -> list:
    value = data.get(name)
    if not isinstance(value, list) or len(value) != length:
        raise ValueError(f"MixedDataset state field {name!r}: expected a list of {length}")
    return value
