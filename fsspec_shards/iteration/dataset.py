"""ShardDataset: webdataset-format samples from sharded tars, split, shuffled and resumable.

One epoch of one consumer (a DataLoader worker of one data-parallel rank) reads its
:class:`~fsspec_shards.iteration.plan.EpochPlan` (shards, or sample ranges of shards, from
the epoch's shard order) through a :class:`~fsspec_shards.iteration.stream.ConsumerStream`,
while the next shards are prefetched into the storage cache. After every delivered sample
the stream's position is a small :class:`~fsspec_shards.iteration.state.StreamState`;
:meth:`ShardDataset.state_dict` returns it.

:meth:`ShardDataset.load_state_dict` turns every kind of state into ONE resume object
(``self._resume``): a position of this consumer, a plain-DataLoader tracker's delivered
counts, an epoch remainder, or the list of every old consumer's state (another world size
or worker count: the remainder is computed from them). The next ``__iter__`` starts from it,
and the running stream takes its place, so ``state_dict()`` always asks that one object.

Epochs change only through :meth:`ShardDataset.set_epoch`. A loaded state resumes the epoch
it was taken in; a state taken after the last sample of epoch ``e`` leaves nothing of ``e``,
so iterating ``e`` again yields nothing and ``set_epoch(e + 1)`` starts ``e + 1`` from its
beginning. See docs/resumption.md and docs/multi-node.md.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from fsspec_shards.config import DEFAULT_MAX_MEMBER_SIZE, is_int, parse_max_member_size
from fsspec_shards.errors import IntegrityError, ShardFormatError
from fsspec_shards.iteration.epoch import EpochNumber
from fsspec_shards.iteration.lengths import (
    SampleCountError,
    count_samples,
    load_sample_counts,
    shard_sizes,
)
from fsspec_shards.iteration.order import (
    Consumer,
    current_consumer,
    explicit_split,
    shard_order,
)
from fsspec_shards.iteration.plan import (
    EQUALIZE_MODES,
    SPLIT_MODES,
    EpochPlan,
    Segment,
    choose_split,
    plan_epoch,
    shard_pieces,
)
from fsspec_shards.iteration.reader import ShardReader
from fsspec_shards.iteration.regroup import (
    base_fingerprint,
    is_remainder_state,
    remainder_pieces,
)
from fsspec_shards.iteration.resume import DeliveredCounts, is_tracker_state
from fsspec_shards.iteration.samples import RawSample, group_samples, to_dict
from fsspec_shards.iteration.state import (
    StreamState,
    check_fingerprint,
    check_position,
    remainder_from_list,
    shard_identity,
    urls_digest,
)
from fsspec_shards.iteration.stats import ProgressLog, StatsBoard, StreamStats, summary
from fsspec_shards.iteration.stream import ConsumerStream
from fsspec_shards.iteration.tar import is_gzip_file, iter_members
from fsspec_shards.iteration.transforms import Batched
from fsspec_shards.iteration.urls import expand_urls
from fsspec_shards.redact import clean_error, redact_text, redact_url

try:
    from torch.utils.data import IterableDataset as _DatasetBase
except ImportError:
    _DatasetBase = object

logger = logging.getLogger("fsspec_shards.dataset")

HANDLERS = ("raise", "warn", "skip")
SHARD_ERRORS = (OSError, IntegrityError, ShardFormatError, SampleCountError)
"""What makes a shard broken: cannot be opened or read, fails verification, is malformed,
or holds fewer samples than its count says."""
MALFORMED_ERRORS = (ShardFormatError, SampleCountError)
"""Shard errors that a bad cached copy explains: the shard is read once more from the backend."""
DEFAULT_LOG_INTERVAL = 60.0
HEADER_SCAN_BLOCK = 4096
"""Read-ahead of a header scan over a remote file read without a cache: a header and a
little more per request, rather than a block of payload per header."""
PLANS_KEPT = 8
"""Epoch plans kept per dataset object: computing one orders every shard."""


# --- the resume object: one per dataset, made by load_state_dict for every state kind --------


@dataclass(slots=True)
class _Position:
    """A loaded position of this consumer's stream."""

    state: StreamState

    @property
    def epoch(self) -> int:
        return self.state.epoch

    def state_dict(self, dataset: ShardDataset) -> dict[str, Any]:
        return self.state.to_dict()

    def start(self, dataset: ShardDataset, consumer: Consumer) -> ConsumerStream:
        fingerprint = dataset.fingerprint(consumer)
        check_fingerprint(self.state.fingerprint, fingerprint)
        plan = dataset.plan(self.state.epoch, consumer, self.state.remainder)
        check_position(self.state, plan, dataset.shuffle_buffer)
        return ConsumerStream(dataset, consumer, plan, self.state, loaded=True)


@dataclass(slots=True)
class _Counts:
    """A plain-DataLoader tracker's delivered counts for every worker of this rank."""

    counts: DeliveredCounts

    @property
    def epoch(self) -> int:
        return self.counts.epoch

    def state_dict(self, dataset: ShardDataset) -> dict[str, Any]:
        return self.counts.to_dict()

    def start(self, dataset: ShardDataset, consumer: Consumer) -> ConsumerStream:
        counts = self.counts
        if len(counts.delivered) != consumer.num_workers:
            raise ValueError(
                f"the state counts {len(counts.delivered)} DataLoader workers, "
                f"this DataLoader has {consumer.num_workers}"
            )
        rotated = replace(
            consumer, worker=(consumer.worker + counts.next_worker) % consumer.num_workers
        )
        stream = dataset.fresh_stream(rotated, counts.epoch)
        stream.fast_forward(counts.delivered[rotated.worker])
        return stream


@dataclass(slots=True)
class _Remainder:
    """The rest of an interrupted epoch, to be shared by this run's consumers."""

    epoch: int
    pieces: tuple[tuple[Segment, int | None], ...]

    def state_dict(self, dataset: ShardDataset) -> dict[str, Any]:
        return self._state(dataset, dataset.consumer()).to_dict()

    def _state(self, dataset: ShardDataset, consumer: Consumer) -> StreamState:
        return StreamState(dataset.fingerprint(consumer), self.epoch, remainder=self.pieces)

    def start(self, dataset: ShardDataset, consumer: Consumer) -> ConsumerStream:
        state = self._state(dataset, consumer)
        return ConsumerStream(
            dataset, consumer, dataset.plan(self.epoch, consumer, self.pieces), state
        )


class _Running:
    """The stream an iterator is running: ``state_dict()`` reads its position."""

    __slots__ = ("stream",)

    def __init__(self, stream: ConsumerStream) -> None:
        self.stream = stream

    @property
    def epoch(self) -> int:
        return self.stream.epoch

    def state_dict(self, dataset: ShardDataset) -> dict[str, Any]:
        return self.stream.position().to_dict()

    def start(self, dataset: ShardDataset, consumer: Consumer) -> ConsumerStream:
        return dataset.fresh_stream(consumer, self.stream.epoch)


class ShardDataset(_DatasetBase):
    """Samples (dicts of ``__key__``, ``__url__`` and one bytes value per extension) of shards.

    ``urls`` is a brace pattern or a list of URLs (fsspec chains such as ``wds::s3://...``
    included); ``storage_options`` go to ``fsspec.core.url_to_fs``. ``transforms`` are
    per-sample steps (:mod:`~fsspec_shards.iteration.transforms` or any callable) applied in
    order to each sample dict; a step returning ``None`` drops the sample, a step raising goes
    through ``handler``. ``annotate`` adds ``__worker__`` / ``__index__`` to each sample (for
    :mod:`~fsspec_shards.iteration.resume`). ``__url__`` is shown redacted (no query values,
    no password) unless ``raw_urls``.

    Sample counts (``samples_per_shard``: ``{shard name: count}`` or a JSON sidecar; or
    ``count_samples=True``: a header-only scan now) give every consumer the same number of
    samples per epoch (``equalize="pad"``, the default, or ``"truncate"``; None: off), make
    ``len(ds)`` known, and let consumers share shards by sample ranges (``split="samples"``;
    ``"auto"``, the default, does so when the counts are known, so padding is at most one
    sample per consumer, and reads whole shards otherwise). ``batch_size`` B (needs the
    counts and ``equalize``) makes every consumer's epoch whole batches, the same number on
    every rank for any DataLoader worker count, so ``len(DataLoader(ds, batch_size=B))`` is
    the batches it yields (:func:`~fsspec_shards.iteration.plan.batch_quotas`).
    ``rank``/``world_size`` or ``group`` (a process group, or a DeviceMesh dimension)
    choose the data-parallel split.
    ``stats_dir`` is where DataLoader workers leave their counters for :meth:`stats` (default:
    a private temporary directory); ``log_interval`` the seconds between INFO progress lines
    (None: never). See the contract (section 2), docs/pytorch.md and docs/resumption.md.
    """

    def __init__(
        self,
        urls: str | Sequence[str],
        storage_options: Mapping[str, Any] | None = None,
        shuffle_shards: bool = True,
        shuffle_buffer: int = 0,
        seed: int = 0,
        split_by_node: bool = True,
        split_by_worker: bool = True,
        handler: str = "raise",
        prefetch: int = 2,
        *,
        transforms: Sequence[Callable[[dict], Any]] = (),
        annotate: bool = False,
        samples_per_shard: Mapping[str, int] | str | None = None,
        count_samples: bool = False,
        equalize: str | None = "pad",
        split: str = "auto",
        batch_size: int | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        group: Any = None,
        max_member_size: int | str = DEFAULT_MAX_MEMBER_SIZE,
        raw_urls: bool = False,
        stats_dir: str | os.PathLike | None = None,
        log_interval: float | None = DEFAULT_LOG_INTERVAL,
    ) -> None:
        if handler not in HANDLERS:
            raise ValueError(f"handler must be one of {HANDLERS}, got {handler!r}")
        if int(shuffle_buffer) < 0 or int(prefetch) < 0:
            raise ValueError("shuffle_buffer and prefetch must be >= 0")
        if equalize is not None and equalize not in EQUALIZE_MODES:
            raise ValueError(f"equalize must be one of {EQUALIZE_MODES} or None, got {equalize!r}")
        if split not in SPLIT_MODES:
            raise ValueError(f"split must be one of {SPLIT_MODES}, got {split!r}")
        if any(isinstance(step, Batched) for step in transforms):
            raise ValueError(
                "batched() spans samples and would lose a partial batch on resume: batch in "
                "the DataLoader (batch_size=...) or apply it to the dataset's output"
            )
        self.urls = expand_urls(urls)
        if not self.urls:
            raise ValueError(f"no shard URLs in {urls!r}")
        self.storage_options = dict(storage_options or {})
        self.shuffle_shards = bool(shuffle_shards)
        self.shuffle_buffer = int(shuffle_buffer)
        self.seed = int(seed)
        self.split_by_node = bool(split_by_node)
        self.split_by_worker = bool(split_by_worker)
        self.handler = handler
        self.prefetch = int(prefetch)
        self.transforms = tuple(transforms)
        self.annotate = bool(annotate)
        self.raw_urls = bool(raw_urls)
        self.split = split
        self.max_member_size = parse_max_member_size(max_member_size)
        self.log_interval = log_interval
        self.node = explicit_split(rank, world_size, group)
        self.reader = ShardReader(self.storage_options, max_member_size=self.max_member_size)
        if samples_per_shard is not None:
            counts = load_sample_counts(samples_per_shard, storage_options)
            self.shard_sizes: list[int] | None = shard_sizes(self.urls, counts)
        elif count_samples:
            self.shard_sizes = count_samples_of(self)
        else:
            self.shard_sizes = None
        if equalize == "truncate" and self.shard_sizes is None:
            raise ValueError(
                "equalize='truncate' needs the sample counts: samples_per_shard= or "
                "count_samples=True"
            )
        self.equalize = equalize if self.shard_sizes is not None else None
        self.batch_size = check_batch_size(batch_size, self.shard_sizes, self.equalize, split)
        self._identity = {
            "urls": shard_identity(self.urls),
            "sample_counts": None
            if self.shard_sizes is None
            else urls_digest([str(size) for size in self.shard_sizes]),
        }
        self._epoch = EpochNumber()
        self._resume: _Position | _Counts | _Remainder | _Running | None = None
        self._plans: dict[tuple[int, Consumer], EpochPlan] = {}
        self._ranges: dict[tuple[str, Segment], tuple[int, int | None]] = {}
        self._shown: dict[str, str] = {}
        self._stats = StreamStats()
        self._stats_pid = os.getpid()
        self._board = StatsBoard(stats_dir)
        self._board.bind(self)

    shard_errors = SHARD_ERRORS
    malformed_errors = MALFORMED_ERRORS

    # --- epochs, plans and state ---------------------------------------------------------

    @property
    def epoch(self) -> int:
        return self._epoch.value

    @epoch.setter
    def epoch(self, epoch: int) -> None:
        self._epoch.set(epoch)

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch the next iteration reads; its shard order comes from (seed, epoch).
        DataLoader workers, persistent ones too, read it at their next iteration."""
        self.epoch = int(epoch)

    def consumer(self) -> Consumer:
        """The consumer this process is: data-parallel rank and DataLoader worker."""
        return current_consumer(self.split_by_node, self.split_by_worker, self.node)

    def plan(
        self,
        epoch: int,
        consumer: Consumer,
        remainder: Sequence[tuple[Segment, int | None]] | None = None,
    ) -> EpochPlan:
        """What ``consumer`` reads in ``epoch``: its part of the shards or of a remainder."""
        if remainder is not None:
            known = all(samples is not None for _, samples in remainder)
            split = "samples" if known and (remainder or self.batch_size) else "shards"
            equalize = self.equalize if known else None
            batch_size = self.batch_size if known else None
            return plan_epoch(
                remainder,
                consumer.index,
                consumer.total,
                split,
                equalize,
                batch_size,
                consumer.num_workers,
            )
        plan = self._plans.get((epoch, consumer))
        if plan is None:
            order = shard_order(len(self.urls), self.seed, epoch, self.shuffle_shards)
            pieces = shard_pieces(order, self.shard_sizes)
            known = self.shard_sizes is not None
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

    def __len__(self) -> int:
        """Samples this consumer takes from the stream in the current epoch (before
        transforms drop any): in the main process, this rank's; TypeError when the sample
        counts are unknown."""
        plan = self.plan(self.epoch, self.consumer(), self._loaded_remainder())
        length = plan.own if plan.length is None else plan.length
        if length is None:
            raise TypeError(
                "len() of a ShardDataset needs the sample counts: pass samples_per_shard= "
                "or count_samples=True"
            )
        return length

    def _loaded_remainder(self) -> tuple[tuple[Segment, int | None], ...] | None:
        resume = self._resume
        if isinstance(resume, _Remainder) and resume.epoch == self.epoch:
            return resume.pieces
        if isinstance(resume, _Running | _Position) and resume.epoch == self.epoch:
            state = resume.stream.state if isinstance(resume, _Running) else resume.state
            return state.remainder
        return None

    def fingerprint(self, consumer: Consumer) -> dict[str, Any]:
        """The arguments a position of ``consumer`` depends on."""
        return {
            "urls": self._identity["urls"],
            "shards": len(self.urls),
            "seed": self.seed,
            "shuffle_shards": self.shuffle_shards,
            "shuffle_buffer": self.shuffle_buffer,
            "rank": consumer.rank,
            "world_size": consumer.world_size,
            "worker": consumer.worker,
            "num_workers": consumer.num_workers,
            "equalize": self.equalize,
            "split": self._split_kind(),
            "batch_size": self.batch_size,
            "sample_counts": self._identity["sample_counts"],
        }

    def _split_kind(self) -> str:
        """The split asked for, ``"auto"`` resolved: states from before ``"auto"`` load."""
        if self.split != "auto":
            return self.split
        return "samples" if self.shard_sizes is not None else "shards"

    def tracker_fingerprint(self, num_workers: int) -> dict[str, Any]:
        """The arguments a :class:`~fsspec_shards.iteration.resume.DeliveryTracker` state
        depends on: those of the dataset state, for all workers of this rank."""
        consumer = self.consumer()
        fingerprint = self.fingerprint(Consumer(consumer.rank, consumer.world_size, 0, 1))
        del fingerprint["worker"]
        fingerprint["num_workers"] = num_workers
        return fingerprint

    def fresh_stream(self, consumer: Consumer, epoch: int) -> ConsumerStream:
        """The stream of ``consumer`` from the start of ``epoch``."""
        state = StreamState(self.fingerprint(consumer), epoch=epoch)
        return ConsumerStream(self, consumer, self.plan(epoch, consumer), state)

    def state_dict(self) -> dict[str, Any]:
        """The position after the last delivered sample, as a small JSON-serialisable dict."""
        resume = self._resume
        if resume is not None and resume.epoch == self.epoch:
            return resume.state_dict(self)
        return StreamState(self.fingerprint(self.consumer()), epoch=self.epoch).to_dict()

    def load_state_dict(self, state: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> None:
        """Continue from ``state`` at the next iteration.

        ``state`` is one of this consumer's states, a DeliveryTracker's, a
        :func:`~fsspec_shards.iteration.regroup.remainder_state`, or the list of the states
        of EVERY consumer of an interrupted run (any world size and worker count; torchdata
        StatefulDataLoader states included): the rest of that epoch is then shared by this
        run's consumers, every remaining sample once. ValueError naming the field or
        argument when the state does not fit this dataset.
        """
        if isinstance(state, list | tuple):
            epoch, pieces = remainder_pieces(self, state)
            self._resume = _Remainder(epoch, pieces)
        elif is_remainder_state(state):
            check_fingerprint(
                state["fingerprint"], base_fingerprint(self.fingerprint(self.consumer()))
            )
            epoch = state.get("epoch")
            if not is_int(epoch) or epoch < 0:
                raise ValueError(f"invalid remainder state: field 'epoch': {epoch!r}")
            pieces = remainder_from_list(state.get("segments"))
            self.check_pieces(pieces)
            self._resume = _Remainder(epoch, pieces)
        elif is_tracker_state(state):
            counts = DeliveredCounts.from_dict(state)
            check_fingerprint(counts.fingerprint, self.tracker_fingerprint(len(counts.delivered)))
            self._resume = _Counts(counts)
        else:
            loaded = StreamState.from_dict(state)
            consumer = self.consumer()
            check_fingerprint(loaded.fingerprint, self.fingerprint(consumer))
            if loaded.remainder is not None:
                self.check_pieces(loaded.remainder)
            plan = self.plan(loaded.epoch, consumer, loaded.remainder)
            check_position(loaded, plan, self.shuffle_buffer)
            self._resume = _Position(loaded)
        self.epoch = self._resume.epoch

    def check_pieces(self, pieces: Sequence[tuple[Segment, int | None]]) -> None:
        """ValueError naming the field when a remainder's segment cannot be of this dataset."""
        for segment, samples in pieces:
            if not 0 <= segment.shard < len(self.urls):
                raise ValueError(
                    f"invalid ShardDataset state: field 'remainder': shard index "
                    f"{segment.shard} is outside 0..{len(self.urls) - 1}"
                )
            if (
                segment.start < 0
                or segment.start % 512
                or (segment.end is not None and segment.end <= segment.start)
                or segment.skip < 0
                or (segment.count is not None and segment.count < 0)
                or (samples is not None and samples < 0)
            ):
                raise ValueError(
                    f"invalid ShardDataset state: field 'remainder': segment "
                    f"{[*segment.to_list(), samples]} is not a byte range of a shard"
                )

    get_state = state_dict
    set_state = load_state_dict

    # --- iteration -------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:
        self._epoch.follow()
        consumer = self.consumer()
        resume = self._resume
        if resume is not None and resume.epoch != self.epoch:
            if not isinstance(resume, _Running):
                logger.info(
                    "dropping the loaded state of epoch %d: set_epoch(%d) chose another epoch",
                    resume.epoch,
                    self.epoch,
                )
            resume = None
        if resume is None:
            stream = self.fresh_stream(consumer, self.epoch)
        else:
            stream = resume.start(self, consumer)
        self._resume = _Running(stream)
        return stream.run()

    def samples(self, url: str, start: int = 0, headers_only: bool = False) -> Iterator[RawSample]:
        """The shard's samples from byte ``start``. ``headers_only``: without their bytes,
        read from the tar headers alone, seeking over payloads on a plain seekable file
        (a resume's window scan, fast-forwards, sample counts and sample-range lookups)."""
        if not headers_only:
            yield from self.reader.samples(url, start)
            return
        fs, path = self.reader.locate(url)
        if is_gzip_file(fs, path):
            yield from self.reader.samples(url, start, headers_only=True)
            return
        with fs.open(path, "rb", block_size=HEADER_SCAN_BLOCK) as raw:
            if not raw.seekable():
                yield from self.reader.samples(url, start, headers_only=True)
                return
            raw.seek(start)
            members = iter_members(
                raw, url, start, read_data=False, max_member_size=self.max_member_size
            )
            yield from group_samples(members, url)

    def plain_size(self, url: str) -> int | None:
        """The byte size of a plain tar shard; None for a gzip one (its tar size is unknown).
        Asks for the size and two bytes, never a block of the shard."""
        fs, path = self.reader.locate(url)
        return None if is_gzip_file(fs, path) else int(fs.size(path))

    def shown_url(self, url: str) -> str:
        """``url`` for display: redacted (no query values, no password)."""
        shown = self._shown.get(url)
        if shown is None:
            shown = self._shown[url] = redact_url(url)
        return shown

    def byte_range(self, url: str, segment: Segment) -> tuple[int, int | None]:
        """``[start, end)`` of a segment in its shard; a header scan finds sample ranges."""
        if not segment.needs_index:
            return segment.start, segment.end
        found = self._ranges.get((url, segment))
        if found is None:
            found = self._ranges[(url, segment)] = self._scan_range(url, segment)
        return found

    def _scan_range(self, url: str, segment: Segment) -> tuple[int, int | None]:
        stop = None if segment.count is None else segment.skip + segment.count
        start = None
        seen = 0
        for sample in self.samples(url, segment.start, headers_only=True):
            if segment.end is not None and sample.offset >= segment.end:
                break
            if seen == segment.skip:
                start = sample.offset
            if seen == stop:
                return start, sample.offset
            seen += 1
        if start is None or (stop is not None and seen < stop):
            raise SampleCountError(
                f"shard {redact_url(url)} holds {seen} samples from byte {segment.start}, but "
                f"its count says at least {segment.skip if stop is None else stop}: the sample "
                "counts are wrong or the shard changed"
            )
        return start, segment.end

    def drop_cached(self, url: str) -> bool:
        """Drop the cached copy of a shard that turned out malformed (through fsspec:
        ``invalidate_cache``, harmless where nothing is cached); whether to read it again."""
        try:
            fs, path = self.reader.locate(url)
            fs.invalidate_cache(path)
        except (OSError, ValueError) as exc:
            logger.debug("could not drop the cached copy of %s: %s", redact_url(url), exc)
            return False
        self._ranges = {key: value for key, value in self._ranges.items() if key[0] != url}
        logger.info("shard %s is malformed: reading it once more from storage", redact_url(url))
        return True

    def shard_failed(self, url: str, error: BaseException) -> None:
        """Apply the error policy to a broken shard: raise, or log and count it."""
        shown = redact_url(url)
        error = clean_error(error, url)
        if self.handler == "raise":
            if shown not in str(error) and hasattr(error, "add_note"):
                error.add_note(f"while reading shard {shown}")
            raise error
        # Without its traceback, a kept error does not keep the reader's frames alive.
        self.counters().shard_failed(shown, error.with_traceback(None))
        level = logging.WARNING if self.handler == "warn" else logging.DEBUG
        logger.log(level, "leaving out shard %s: %s: %s", shown, type(error).__name__, error)

    def prepare(self, sample: RawSample, consumer: Consumer, index: int) -> Any:
        """The sample as the user gets it: a dict through the transforms; None if dropped
        (by a transform, or by the handler after a transform raised)."""
        result = to_dict(sample)
        url = sample.url
        if not self.raw_urls:
            result["__url__"] = self.shown_url(url)
        if self.annotate:
            result["__worker__"] = consumer.worker
            result["__index__"] = index
        if not self.transforms:
            return result
        try:
            for transform in self.transforms:
                result = transform(result)
                if result is None:
                    return None
            return result
        except Exception as exc:
            error = exc
        self._sample_failed(url, sample.key, error)
        return None

    def _sample_failed(self, url: str, key: str, error: Exception) -> None:
        """Apply the error policy to a sample a transform failed on."""
        shown = redact_url(url)
        where = f"sample {key!r} of shard {shown}"
        if self.handler == "raise":
            error = clean_error(error, url)
            if hasattr(error, "add_note"):
                error.add_note(f"while transforming {where}")
            raise error
        error = clean_error(error, url).with_traceback(None)
        self.counters().sample_failed(shown, key, error)
        level = logging.WARNING if self.handler == "warn" else logging.DEBUG
        text = redact_text(str(error), url)
        logger.log(level, "leaving out %s: %s: %s", where, type(error).__name__, text)

    def short_epoch(self, epoch: int, delivered: int, length: int) -> None:
        logger.warning(
            "epoch %d ended after %d samples, short of the equal length %d: "
            "a shard failed or the sample counts overstate it",
            epoch,
            delivered,
            length,
        )

    # --- stats -----------------------------------------------------------------------------

    def counters(self) -> StreamStats:
        """This process's counters (a forked DataLoader worker starts its own)."""
        if self._stats_pid != os.getpid():
            self._stats = StreamStats()
            self._stats_pid = os.getpid()
        return self._stats

    def publish_stats(self, consumer: Consumer) -> None:
        """Leave this process's counters where :meth:`stats` finds them: from a DataLoader
        worker, and from every process when the directory is the user's (shared by ranks)."""
        if self._board.owned and os.getpid() == self._board.owner_pid:
            return
        who = {"rank": consumer.rank, "worker": consumer.worker, "pid": os.getpid()}
        try:
            self._board.write(who, self.counters())
        except (OSError, ValueError) as exc:
            logger.warning("cannot write stats to %s: %s", self._board.path, exc)

    def progress_log(self, consumer: Consumer, urls: Sequence[str]) -> ProgressLog:
        cache_stats = None
        if urls and self.log_interval:
            try:
                cache_stats = getattr(self.reader.locate(urls[0])[0], "cache_stats", None)
            except (OSError, ValueError):
                cache_stats = None
        label = f"rank {consumer.rank} worker {consumer.worker}"
        return ProgressLog(self.log_interval, label, cache_stats)

    def stats(self) -> dict[str, Any]:
        """Counts of this dataset across the processes that read it (this one and its
        DataLoader workers): samples, shards done and failed, sample errors per kind, padded
        samples, bytes read, seconds waited, samples/s, one entry per worker, and failures."""
        records = self._board.collect()
        return summary(records, self.counters())

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        if isinstance(state["_resume"], _Running):
            state["_resume"] = None
        state["_ranges"] = {}
        state["_plans"] = {}
        return state


def check_batch_size(
    batch_size: Any, sizes: Sequence[int] | None, equalize: str | None, split: str
) -> int | None:
    """``batch_size`` checked against what whole batches need: counts, equalize, a sample split."""
    if batch_size is None:
        return None
    if not is_int(batch_size) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    if sizes is None:
        raise ValueError(
            "batch_size= needs the sample counts: pass samples_per_shard= or count_samples=True"
        )
    if equalize is None:
        raise ValueError("batch_size= needs equal epochs: equalize='pad' or 'truncate'")
    if split == "shards":
        raise ValueError(
            "batch_size= cuts shards by sample ranges so that every DataLoader worker gets "
            "whole batches: use split='auto' or 'samples'"
        )
    return int(batch_size)


def count_samples_of(dataset: ShardDataset) -> list[int]:
    """Every shard's sample count, by a header-only scan (``count_samples=True``)."""

    def scan(url: str) -> Iterator[RawSample]:
        return dataset.samples(url, headers_only=True)

    return count_samples(dataset.urls, scan, skip_failed=dataset.handler != "raise")
