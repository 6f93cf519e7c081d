"""ShardDataset: webdataset-format samples from sharded tars, split, shuffled and resumable.

The dataset is a facade over parts that each hold their own state and receive only what
they use:

- the source (:class:`~fsspec_shards.iteration.source.ShardSource`): the URLs, reading,
  byte ranges of sample ranges, the error policy, transforms and stats;
- the planner (:class:`~fsspec_shards.iteration.plan.Planner`): each epoch's shard order,
  split over the consumers and equalized;
- the streams (:class:`~fsspec_shards.iteration.stream.Streams`): one consumer's epoch read
  through the shuffle buffer, its position kept after every delivered sample;
- the resumption (:class:`~fsspec_shards.iteration.resume.resumption.Resumption`): every kind of
  loaded state (a position, a DataLoader tracker's counts, an epoch remainder regrouped over
  another world size or worker count) and the running stream whose position
  ``state_dict()`` returns.

Epochs change only through :meth:`ShardDataset.set_epoch` (DataLoader workers, persistent
ones too, follow it: :mod:`~fsspec_shards.iteration.epoch`). A loaded state resumes the epoch
it was taken in; a state taken after the last sample of epoch ``e`` leaves nothing of ``e``,
so iterating ``e`` again yields nothing and ``set_epoch(e + 1)`` starts ``e + 1`` from its
beginning. See docs/resumption.md and docs/multi-node.md.
"""

from __future__ import annotations

import numbers
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from fsspec_shards.config import DEFAULT_MAX_MEMBER_SIZE, is_int, parse_max_member_size
from fsspec_shards.iteration.epoch import EpochNumber
from fsspec_shards.iteration.lengths import load_sample_counts, shard_sizes
from fsspec_shards.iteration.order import Consumer, current_consumer, explicit_split
from fsspec_shards.iteration.plan import EQUALIZE_MODES, SPLIT_MODES, EpochPlan, Planner
from fsspec_shards.iteration.reader import ShardReader
from fsspec_shards.iteration.resume.resumption import Resumption
from fsspec_shards.iteration.resume.state import remainder_to_list, shard_identity, urls_digest
from fsspec_shards.iteration.source import HANDLERS, ShardSource
from fsspec_shards.iteration.stream import Streams
from fsspec_shards.iteration.transforms import Batched
from fsspec_shards.iteration.urls import expand_urls

try:
    from torch.utils.data import IterableDataset as _DatasetBase
except ImportError:
    _DatasetBase = object

DEFAULT_LOG_INTERVAL = 60.0


def _of(part: str, name: str) -> property:
    """A read-only attribute of the dataset that one of its parts holds."""
    return property(lambda self: getattr(getattr(self, part), name), doc=f"``{part}.{name}``")


class ShardDataset(_DatasetBase):
    """Samples (dicts of ``__key__``, ``__url__`` and one bytes value per extension) of shards.

    ``urls`` is a brace pattern or a list of URLs (fsspec chains such as ``wds::s3://...``
    included); ``storage_options`` go to ``fsspec.core.url_to_fs``. ``transforms`` are
    per-sample steps (:mod:`~fsspec_shards.iteration.transforms` or any callable) applied in
    order to each sample dict; a step returning ``None`` drops the sample, a step raising goes
    through ``handler``. ``annotate`` adds ``__worker__`` / ``__index__`` to each sample (for
    :mod:`~fsspec_shards.iteration.resume.delivery`). ``__url__`` is shown redacted (no query
    values, no password) unless ``raw_urls``.

    Sample counts (``samples_per_shard``: ``{shard name: count}`` or a JSON sidecar; or
    ``count_samples=True``: a header-only scan now) give every consumer the same number of
    samples per epoch (``equalize="pad"``, the default, or ``"truncate"``; None: off), make
    ``len(ds)`` known, and let consumers share shards by sample ranges (``split="samples"``;
    ``"auto"``, the default, does so when the counts are known, so padding is at most one
    sample per consumer, and reads whole shards otherwise). ``batch_size`` B (needs the
    counts and ``equalize``; the dataset still yields single samples, it does not batch)
    makes every consumer's epoch whole batches, the same number on
    every rank for any DataLoader worker count, so ``len(DataLoader(ds, batch_size=B))`` is
    the batches it yields (:func:`~fsspec_shards.iteration.plan.batch_quotas`).
    ``rank``/``world_size`` or ``group`` (a process group, or a DeviceMesh dimension)
    choose the data-parallel split.
    ``prefetch`` is how many of a consumer's next shards are fetched into the ``wds`` cache
    while it reads one: an int, or ``"auto"`` (the default: two, more where the reader
    catches up with the fetches; :mod:`~fsspec_shards.iteration.prefetch`).
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
        prefetch: int | str = "auto",
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
        check_arguments(handler, shuffle_buffer, prefetch, seed, equalize, split, transforms)
        expanded = expand_urls(urls)  # ValueError when it holds none
        self.storage_options = dict(storage_options or {})
        self.split_by_node = bool(split_by_node)
        self.split_by_worker = bool(split_by_worker)
        self.node = explicit_split(rank, world_size, group)
        reader = ShardReader(
            self.storage_options, max_member_size=parse_max_member_size(max_member_size)
        )
        self.source = ShardSource(
            expanded,
            reader,
            handler=handler,
            prefetch=prefetch if prefetch == "auto" else int(prefetch),
            transforms=transforms,
            annotate=bool(annotate),
            raw_urls=bool(raw_urls),
            stats_dir=stats_dir,
            log_interval=log_interval,
        )
        sizes: list[int] | None = None
        if samples_per_shard is not None:
            sizes = shard_sizes(expanded, load_sample_counts(samples_per_shard, storage_options))
        elif count_samples:
            sizes = self.source.count_samples()
        if equalize == "truncate" and sizes is None:
            raise ValueError(
                "equalize='truncate' needs the sample counts: samples_per_shard= or "
                "count_samples=True"
            )
        equalize = equalize if sizes is not None else None
        self.planner = Planner(
            len(expanded),
            sizes,
            int(seed),
            bool(shuffle_shards),
            split,
            equalize,
            check_batch_size(batch_size, sizes, equalize, split),
        )
        identity = dataset_identity(expanded, self.planner, int(shuffle_buffer))
        self.streams = Streams(
            self.source, self.planner, int(shuffle_buffer), self.planner.seed, identity
        )
        self.resumption = Resumption(self.streams)
        self._epoch = EpochNumber()
        reader.warm(expanded[0])  # before a DataLoader forks its workers: they inherit it

    urls = _of("source", "urls")
    reader = _of("source", "reader")
    handler = _of("source", "handler")
    prefetch = _of("source", "prefetch")
    transforms = _of("source", "transforms")
    annotate = _of("source", "annotate")
    raw_urls = _of("source", "raw_urls")
    shard_sizes = _of("planner", "sizes")
    seed = _of("planner", "seed")
    shuffle_shards = _of("planner", "shuffle_shards")
    split = _of("planner", "split")
    equalize = _of("planner", "equalize")
    batch_size = _of("planner", "batch_size")
    shuffle_buffer = _of("streams", "shuffle_buffer")

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

    def plan(self, epoch: int, consumer: Consumer) -> EpochPlan:
        """What ``consumer`` reads in ``epoch`` from its start."""
        return self.planner.plan(epoch, consumer)

    def __len__(self) -> int:
        """Samples this consumer takes from the stream in the current epoch (before
        transforms drop any): in the main process, this rank's; TypeError when the sample
        counts are unknown."""
        consumer = self.consumer()
        plan = self.planner.plan(self.epoch, consumer, self.resumption.remainder(self.epoch))
        length = plan.own if plan.length is None else plan.length
        if length is None:
            raise TypeError(
                "len() of a ShardDataset needs the sample counts: pass samples_per_shard= "
                "or count_samples=True"
            )
        return length

    def fingerprint(self, consumer: Consumer) -> dict[str, Any]:
        """The arguments a position of ``consumer`` depends on."""
        return self.streams.fingerprint(consumer)

    def tracker_fingerprint(self, num_workers: int) -> dict[str, Any]:
        """The arguments a :class:`~fsspec_shards.iteration.resume.delivery.DeliveryTracker` state
        of this rank depends on."""
        return self.resumption.tracker_fingerprint(self.consumer(), num_workers)

    def state_dict(self) -> dict[str, Any]:
        """The position after the last delivered sample, as a small JSON-serialisable dict."""
        return self.resumption.state_dict(self.epoch, self.consumer)

    def load_state_dict(self, state: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> None:
        """Continue from ``state`` at the next iteration.

        ``state`` is one of this consumer's states, a DeliveryTracker's, a
        :func:`~fsspec_shards.iteration.resume.regroup.remainder_state`, or the list of the states
        of EVERY consumer of an interrupted run (any world size and worker count; torchdata
        StatefulDataLoader states included): the rest of that epoch is then shared by this
        run's consumers, every remaining sample once. ValueError naming the field or
        argument when the state does not fit this dataset.
        """
        self.epoch = self.resumption.load(state, self.consumer())

    get_state = state_dict
    set_state = load_state_dict

    def remainder_segments(self, epoch: int) -> list[list[int]] | None:
        """The pieces ``epoch`` is the rest of when a regrouped state made it so (as state
        lists, for a :class:`~fsspec_shards.iteration.resume.delivery.DeliveryTracker` state); None
        for a whole epoch."""
        pieces = self.resumption.remainder(epoch)
        return None if pieces is None else remainder_to_list(pieces)

    # --- iteration and stats -----------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:
        self._epoch.follow()
        return self.resumption.start(self.epoch, self.consumer()).run()

    def stats(self) -> dict[str, Any]:
        """Counts of this dataset across the processes that read it (this one and its
        DataLoader workers): samples, shards done and failed, sample errors per kind, padded
        samples, bytes read, seconds waited, samples/s, one entry per worker, and failures."""
        return self.source.stats()


def check_arguments(
    handler: str,
    shuffle_buffer: int,
    prefetch: int | str,
    seed: int,
    equalize: str | None,
    split: str,
    transforms: Sequence[Callable[[dict], Any]],
) -> None:
    """ValueError naming the first argument of ``ShardDataset`` that it cannot take."""
    if handler not in HANDLERS:
        raise ValueError(f"handler must be one of {HANDLERS}, got {handler!r}")
    if prefetch != "auto" and (
        isinstance(prefetch, bool) or not isinstance(prefetch, numbers.Integral) or prefetch < 0
    ):
        raise ValueError(f'prefetch must be "auto" or an int >= 0, got {prefetch!r}')
    for name, value in (("shuffle_buffer", shuffle_buffer), ("seed", seed)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise ValueError(f"{name} must be an int, got {value!r}")
        if value < 0 and name != "seed":
            raise ValueError(f"{name} must be >= 0, got {value!r}")
    if not all(callable(step) for step in transforms):
        raise ValueError(f"transforms must be callables, got {list(transforms)!r}")
    if equalize is not None and equalize not in EQUALIZE_MODES:
        raise ValueError(f"equalize must be one of {EQUALIZE_MODES} or None, got {equalize!r}")
    if split not in SPLIT_MODES:
        raise ValueError(f"split must be one of {SPLIT_MODES}, got {split!r}")
    if any(isinstance(step, Batched) for step in transforms):
        raise ValueError(
            "batched() spans samples and would lose a partial batch on resume: batch in "
            "the DataLoader (batch_size=...) or apply it to the dataset's output"
        )


def dataset_identity(urls: Sequence[str], planner: Planner, shuffle_buffer: int) -> dict[str, Any]:
    """What a position depends on besides its consumer: the shards (as the cache identifies
    them), their counts, and the arguments of the order, split and shuffle."""
    sizes = planner.sizes
    return {
        "urls": shard_identity(urls),
        "shards": len(urls),
        "seed": planner.seed,
        "shuffle_shards": planner.shuffle_shards,
        "shuffle_buffer": shuffle_buffer,
        "equalize": planner.equalize,
        "split": planner.split_kind,
        "sample_counts": None if sizes is None else urls_digest([str(n) for n in sizes]),
        "batch_size": planner.batch_size,
    }


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
