"""Epoch planning: which samples each consumer reads in one epoch (pure functions, and a
:class:`Planner` that applies them with a dataset's arguments).

An epoch's work is a list of pieces, each a :class:`Segment` of one shard with its sample
count when known: the whole shards in the epoch's shard order, or what is left of an
interrupted epoch (:mod:`~fsspec_shards.iteration.resume.regroup`). :func:`plan_epoch` gives one
consumer its :class:`EpochPlan`:

- ``split="shards"``: consumer ``c`` of ``n`` takes pieces ``c, c + n, ...``.
- ``split="samples"`` (needs counts): the pieces' samples, concatenated, are cut into ``n``
  contiguous ranges whose sizes differ by at most one; a range may start or end inside a
  shard (a segment that skips samples or stops after a count).
- ``split="auto"`` (the dataset's default): ``"samples"`` when the counts are known, so that
  padding is at most one sample per consumer; ``"shards"`` otherwise.

Invariants: the consumers' segments together hold every sample of the pieces exactly once;
with counts known and ``equalize`` set, every consumer's plan has the same ``length``
(``"pad"``: the largest share, shorter consumers read their own segments again, and a
remainder's consumer with none of its own reads the remainder's;
``"truncate"``: the smallest). Everything depends on the arguments only, so every rank and
worker computes the same plans.

With ``batch_size`` B (:func:`batch_quotas`), every rank gets the same number K of whole
batches (its equal share rounded up to whole batches with ``"pad"``, down with
``"truncate"``), its workers K // W or K // W + 1 batches each, so the rank's batch count
does not depend on the worker count W; the samples are cut in proportion to these quotas.
A DataLoader over W workers then yields K batches, all full, and ``len(dataset)`` in the
main process (one worker) is K * B: ``len(loader)`` is exact for every W.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from fsspec_shards.iteration.order import Consumer, shard_order

EQUALIZE_MODES = ("pad", "truncate")
SPLIT_MODES = ("auto", "shards", "samples")
PLANS_KEPT = 8
"""Epoch plans a :class:`Planner` keeps: computing one orders every shard."""


@dataclass(frozen=True, slots=True)
class Segment:
    """Samples of shard ``shard`` (an index into the dataset's URLs) to read.

    Reading starts at byte ``start`` (a sample boundary), passes over ``skip`` samples, then
    reads ``count`` samples, or (``count`` None) every sample before byte ``end`` (None: the
    shard's end).
    """

    shard: int
    start: int = 0
    end: int | None = None
    skip: int = 0
    count: int | None = None

    @property
    def needs_index(self) -> bool:
        """Whether the byte range must be found by counting samples (a header scan)."""
        return self.skip > 0 or self.count is not None

    def part(self, first: int, stop: int, samples: int) -> Segment:
        """Samples ``[first, stop)`` of this segment, which holds ``samples`` samples."""
        if first == 0 and stop == samples:
            return self
        to_end = stop == samples and self.count is None
        return Segment(
            self.shard, self.start, self.end, self.skip + first, None if to_end else stop - first
        )

    def to_list(self) -> list[int]:
        """``[shard, start, end, skip, count]``, -1 for an open end or count (JSON)."""
        return [
            self.shard,
            self.start,
            -1 if self.end is None else self.end,
            self.skip,
            -1 if self.count is None else self.count,
        ]

    @classmethod
    def from_list(cls, item: Sequence[int]) -> Segment:
        """Parse :meth:`to_list` output (no range checks: see the dataset's validation)."""
        shard, start, end, skip, count = (int(value) for value in item)
        return cls(shard, start, None if end == -1 else end, skip, None if count == -1 else count)


Piece = tuple[Segment, "int | None"]
"""A segment and the number of samples it holds, None when unknown."""


@dataclass(frozen=True, slots=True)
class EpochPlan:
    """One consumer's epoch: its segments, read ``passes`` times, until ``length`` samples.

    Segment indices run from 0 to :attr:`limit`; index ``i`` reads ``segments[i % len]``.
    ``samples`` holds each segment's sample count (None: unknown); ``own`` is the samples of
    one pass when known: what is delivered beyond it is padding.
    """

    segments: tuple[Segment, ...]
    samples: tuple[int | None, ...] = ()
    length: int | None = None
    passes: int = 1
    own: int | None = None

    @property
    def limit(self) -> int:
        return len(self.segments) * self.passes

    def segment(self, index: int) -> Segment:
        return self.segments[index % len(self.segments)]

    @property
    def own_segments(self) -> int:
        """Segment indices before the padding: one pass, none when the segments are
        another consumer's (``own`` 0)."""
        return 0 if self.own == 0 else len(self.segments)

    def is_padding(self, index: int) -> bool:
        """Whether segment index ``index`` repeats samples (a later pass, or borrowed)."""
        return index >= self.own_segments


def shard_pieces(order: Sequence[int], sizes: Sequence[int] | None) -> list[Piece]:
    """Whole shards in ``order``, with their sample counts when ``sizes`` are known."""
    return [(Segment(index), None if sizes is None else sizes[index]) for index in order]


def choose_split(requested: str, pieces: int, consumers: int, counts_known: bool) -> str:
    """The split to use: ``requested``, or ``"samples"`` when there are fewer pieces than
    consumers (some would read nothing); ValueError when that needs counts that are unknown."""
    if requested not in SPLIT_MODES:
        raise ValueError(f"split must be one of {SPLIT_MODES}, got {requested!r}")
    if requested == "auto":
        requested = "samples" if counts_known else "shards"
    if requested == "samples" or pieces >= consumers:
        if requested == "samples" and not counts_known:
            raise ValueError(
                "split='samples' needs the sample count of every shard: pass "
                "samples_per_shard= (a sidecar from 'fsspec-shards manifest --sample-counts') "
                "or count_samples=True"
            )
        return requested
    if not counts_known:
        raise ValueError(
            f"{pieces} shard(s) cannot be split over {consumers} consumers by shard: some "
            "would read nothing. Give the sample counts (samples_per_shard=, or "
            "count_samples=True) so that consumers share shards by sample ranges, or use "
            "fewer DataLoader workers, or split_by_node/split_by_worker=False"
        )
    return "samples"


def plan_epoch(
    pieces: Sequence[Piece],
    consumer: int,
    consumers: int,
    split: str = "shards",
    equalize: str | None = None,
    batch_size: int | None = None,
    workers: int = 1,
    borrow: bool = False,
) -> EpochPlan:
    """The plan of consumer ``consumer`` of ``consumers`` over ``pieces``.

    With ``batch_size``, consumers are ``consumers // workers`` ranks of ``workers`` each
    (consumer ``rank * workers + worker``) and the plan is of whole batches
    (:func:`batch_quotas`; it needs counts, ``equalize`` and a sample split).

    A consumer with no samples to pad is a ValueError, or with ``borrow`` (an epoch's
    remainder, whose size the user does not choose) pads with all the pieces' samples:
    every one of its samples is then padding. Raises ValueError for a split or equalize mode
    it does not know and a sample split without counts.
    """
    spare = pieces if borrow else ()
    if split not in SPLIT_MODES or split == "auto":
        raise ValueError(f"split must be 'shards' or 'samples', got {split!r}")
    if equalize is not None and equalize not in EQUALIZE_MODES:
        raise ValueError(f"equalize must be one of {EQUALIZE_MODES} or None, got {equalize!r}")
    counts = [samples for _, samples in pieces]
    known = all(samples is not None for samples in counts)
    if batch_size is not None:
        if not known or equalize is None or split != "samples":
            raise ValueError("whole batches need the counts, equalize and split='samples'")
        total = sum(counts)
        quotas = batch_quotas(total, consumers // workers, workers, batch_size, equalize)
        shares = proportional_shares(total, quotas)
        mine = _sample_range(pieces, sum(shares[:consumer]), shares[consumer])
        own, length = shares[consumer], quotas[consumer]
        return _equalized(mine, consumer, consumers, own, length, equalize, spare)
    if split == "samples":
        if not known:
            raise ValueError("a sample-level split needs the sample count of every shard")
        mine, totals = _sample_ranges(pieces, consumer, consumers)
    else:
        mine = list(pieces[consumer::consumers])
        totals = [sum(counts[index::consumers]) for index in range(consumers)] if known else None
    own = None if totals is None else totals[consumer]
    if equalize is None or totals is None:
        segments = tuple(segment for segment, _ in mine)
        return EpochPlan(segments, tuple(count for _, count in mine), None, 1, own)
    length = max(totals) if equalize == "pad" else min(totals)
    return _equalized(mine, consumer, consumers, own, length, equalize, spare)


def _equalized(
    mine: Sequence[Piece],
    consumer: int,
    consumers: int,
    own: int,
    length: int,
    equalize: str,
    spare: Sequence[Piece] = (),
) -> EpochPlan:
    """The plan of ``mine`` (``own`` samples) delivering exactly ``length`` samples; with
    no samples of its own, padded with the ``spare`` pieces' when there are any."""
    segments = tuple(segment for segment, _ in mine)
    samples = tuple(count for _, count in mine)
    if own == 0:
        spare_samples = sum(count for _, count in spare)
        if length > 0 and spare_samples:
            segments = tuple(segment for segment, _ in spare)
            samples = tuple(count for _, count in spare)
            return EpochPlan(segments, samples, length, -(-length // spare_samples), 0)
        if length > 0:
            raise ValueError(
                f"consumer {consumer} of {consumers} has no samples to pad to {length}: "
                "use fewer consumers, split='samples', or equalize='truncate'"
            )
        return EpochPlan(segments, samples, 0, 1, 0)
    passes = -(-length // own) if equalize == "pad" else 1
    return EpochPlan(segments, samples, length, max(passes, 1), own)


def batch_quotas(total: int, ranks: int, workers: int, batch_size: int, equalize: str) -> list[int]:
    """Samples each consumer delivers when ``total`` samples go to ``ranks`` ranks of
    ``workers`` workers in whole batches: every rank K batches (its equal share of ``total``
    rounded up to whole batches by ``"pad"``, down by ``"truncate"``), worker ``w`` of a rank
    ``K // workers`` of them, one more when ``w < K % workers``; so a rank's K is the same
    for any worker count."""
    if equalize == "pad":
        share = -(-total // ranks)
        batches = -(-share // batch_size)
    else:
        batches = total // ranks // batch_size
    base, extra = divmod(batches, workers)
    per_rank = [(base + (worker < extra)) * batch_size for worker in range(workers)]
    return per_rank * ranks


def proportional_shares(total: int, quotas: Sequence[int]) -> list[int]:
    """``total`` cut into shares in proportion to ``quotas`` (largest remainders first; equal
    shares when every quota is 0): each share is at most its quota when ``total`` is at most
    their sum, and at least its quota when it is at least."""
    whole = sum(quotas)
    if whole == 0:
        quotas, whole = [1] * len(quotas), len(quotas)
    shares = [total * quota // whole for quota in quotas]
    rests = sorted(range(len(quotas)), key=lambda index: (-(total * quotas[index] % whole), index))
    for index in rests[: total - sum(shares)]:
        shares[index] += 1
    return shares


def _sample_ranges(
    pieces: Sequence[Piece], consumer: int, consumers: int
) -> tuple[list[Piece], list[int]]:
    """Consumer ``consumer``'s contiguous range of the pieces' samples, and every share."""
    total = sum(samples for _, samples in pieces)
    base, extra = divmod(total, consumers)
    totals = [base + (index < extra) for index in range(consumers)]
    low = consumer * base + min(consumer, extra)
    return _sample_range(pieces, low, totals[consumer]), totals


def _sample_range(pieces: Sequence[Piece], low: int, size: int) -> list[Piece]:
    """The pieces' samples ``[low, low + size)``, in order, as parts of the pieces."""
    high = low + size
    segments = []
    position = 0
    for segment, samples in pieces:
        first, stop = max(low, position), min(high, position + samples)
        if first < stop:
            part = segment.part(first - position, stop - position, samples)
            segments.append((part, stop - first))
        position += samples
        if position >= high:
            break
    return segments


@dataclass
class Planner:
    """The plans of a dataset of ``shards`` shards (``sizes``: their sample counts, None when
    unknown): each epoch's order from (``seed``, epoch), split and equalized as asked."""

    shards: int
    sizes: Sequence[int] | None
    seed: int
    shuffle_shards: bool
    split: str
    equalize: str | None
    batch_size: int | None
    _plans: dict[tuple[int, Consumer], EpochPlan] = field(default_factory=dict, repr=False)

    @property
    def split_kind(self) -> str:
        """The split asked for, ``"auto"`` resolved (states from before ``"auto"`` load)."""
        if self.split != "auto":
            return self.split
        return "samples" if self.sizes is not None else "shards"

    def plan(
        self,
        epoch: int,
        consumer: Consumer,
        remainder: Sequence[Piece] | None = None,
    ) -> EpochPlan:
        """What ``consumer`` reads in ``epoch``: its part of the shards or of a remainder."""
        if remainder is not None:
            known = all(samples is not None for _, samples in remainder)
            split = "samples" if known and (remainder or self.batch_size) else "shards"
            return plan_epoch(
                remainder,
                consumer.index,
                consumer.total,
                split,
                self.equalize if known else None,
                self.batch_size if known else None,
                consumer.num_workers,
                borrow=True,
            )
        plan = self._plans.get((epoch, consumer))
        if plan is None:
            order = shard_order(self.shards, self.seed, epoch, self.shuffle_shards)
            pieces = shard_pieces(order, self.sizes)
            known = self.sizes is not None
            split = choose_split(self.split, len(pieces), consumer.total, known)
            plan = plan_epoch(
                pieces,
                consumer.index,
                consumer.total,
                split,
                self.equalize,
                self.batch_size,
                consumer.num_workers,
            )
            if len(self._plans) >= PLANS_KEPT:
                self._plans.clear()
            self._plans[(epoch, consumer)] = plan
        return plan

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_plans"] = {}
        return state
