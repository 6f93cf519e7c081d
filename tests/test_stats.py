"""Counters of the sample streams: the current epoch's rate, and the progress line's cache part."""

from __future__ import annotations

import logging
import time

import pytest

from fsspec_shards import ShardDataset
from fsspec_shards.iteration.stats import ProgressLog, StreamStats, summary
from tests.shardmaker import write_shards


def record(worker: int, epoch: int, started: float, samples: int, seconds: float) -> dict:
    """A worker's stats file after one epoch of ``samples`` in ``seconds`` from ``started``."""
    stats = StreamStats(samples=samples, seconds=seconds)
    stats.epoch, stats.epoch_started = epoch, started
    return stats.to_json({"rank": 0, "worker": worker, "pid": 100 + 10 * epoch + worker})


def test_the_rate_is_the_current_epochs_across_workers_not_a_sum_of_rates():
    records = [
        record(0, 0, 1000.0, 100, 0.5),  # epoch 0's workers, gone (not persistent)
        record(1, 0, 1000.0, 100, 0.5),
        record(0, 1, 1002.0, 100, 0.5),  # epoch 1: one worker after the other
        record(1, 1, 1002.5, 100, 0.5),
    ]
    stats = summary(records, StreamStats())
    assert stats["samples"] == 400
    assert stats["samples_per_second"] == pytest.approx(200.0)  # 200 samples over 1 s
    assert [worker["samples_per_second"] for worker in stats["workers"]] == [200.0] * 4
    assert [worker["epoch"] for worker in stats["workers"]] == [0, 0, 1, 1]


def test_a_persistent_workers_rate_counts_its_latest_epoch_only():
    stats = StreamStats(samples=300, seconds=10.0)
    stats.begin_epoch(4)
    stats.samples, stats.seconds = 350, 10.5
    counts = stats.epoch_counts()
    assert (counts["epoch"], counts["epoch_samples"], counts["epoch_seconds"]) == (4, 50, 0.5)
    assert summary([], stats)["samples_per_second"] == pytest.approx(100.0)


def test_nothing_read_yet_is_a_rate_of_zero():
    assert summary([], StreamStats())["samples_per_second"] == 0.0


def test_with_workers_the_rate_is_what_the_loader_delivers(tmp_path):
    torch_data = pytest.importorskip("torch.utils.data")
    dataset = ShardDataset(write_shards(tmp_path, 4, 50), log_interval=None)
    loader = torch_data.DataLoader(dataset, batch_size=4, num_workers=2, collate_fn=list)
    for epoch in range(2):  # workers are not persistent: epoch 0's records stay behind
        dataset.set_epoch(epoch)
        batches = iter(loader)
        next(batches)  # the workers' start-up is not part of either rate
        started, delivered = time.perf_counter(), 0
        for batch in batches:
            delivered += len(batch)
            time.sleep(0.01)  # a training step: about 400 samples/s
        delivered_rate = delivered / (time.perf_counter() - started)
    stats = dataset.stats()
    assert stats["samples"] == 400
    assert 0.7 < stats["samples_per_second"] / delivered_rate < 1.5  # 1.09 measured; 2.2 before


def test_unreadable_cache_counters_are_one_warning_and_the_line_goes_on(caplog):
    def broken() -> dict:
        raise RuntimeError("counters gone for https://h/x.tar?sig=topsecret")

    logger = logging.getLogger("fsspec_shards.dataset")
    handlers = list(logger.handlers)
    progress = ProgressLog(1e-9, "rank 0 worker 1", broken)
    with caplog.at_level(logging.INFO, logger="fsspec_shards.dataset"):
        progress.maybe_log(StreamStats(samples=5))
        progress.maybe_log(StreamStats(samples=9))
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "cannot read the cache's counters" in warnings[0].getMessage()
    assert "RuntimeError" in warnings[0].getMessage()
    assert "topsecret" not in caplog.text
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert len(lines) == 2 and "cache hit rate" not in lines[1]
    assert logger.handlers == handlers


def test_a_record_without_epochs_from_an_older_version_counts_but_has_no_rate():
    old = record(0, 0, 1000.0, 100, 0.5)
    for name in ("epoch", "epoch_started", "epoch_samples", "epoch_seconds"):
        del old[name]
    stats = summary([old, record(1, 3, 2000.0, 50, 0.5)], None)
    assert stats["samples"] == 150 and stats["samples_per_second"] == pytest.approx(100.0)
    assert [worker["epoch"] for worker in stats["workers"]] == [None, 3]


def test_the_current_epoch_is_the_latest_started_not_the_highest_number():
    earlier_run = record(0, 5, 1000.0, 900, 1.0)  # left in a stats_dir used again
    stats = summary([earlier_run, record(0, 0, 5000.0, 30, 1.5)], None)
    assert stats["samples_per_second"] == pytest.approx(20.0)


def test_an_epoch_read_again_counts_its_latest_run_only():
    # Without set_epoch every loader iteration is epoch 0 again; the workers of the runs
    # before (and a worker id the current run does not have) are not part of its rate.
    records = [
        record(0, 0, 1000.0, 100, 0.5),
        record(1, 0, 1000.0, 100, 0.5),
        record(2, 0, 1000.0, 100, 0.5),
        record(0, 0, 1010.0, 100, 0.5),
        record(1, 0, 1010.0, 100, 0.5),
    ]
    assert summary(records, None)["samples_per_second"] == pytest.approx(400.0)  # was 38


@pytest.mark.parametrize(
    "options",
    [
        {},  # whole shards, counts unknown
        {"count_samples": True},  # split by samples: two workers share a shard
        {"count_samples": True, "split": "shards"},  # padded to an equal length
        {"count_samples": True, "batch_size": 4},
    ],
)
def test_shards_done_counts_every_shard_read_once_with_two_workers(tmp_path, options):
    """Each shard once: the consumer reading its last part counts it, also when its epoch
    ends right at that part's last sample (equal lengths); padding re-reads count nothing."""
    torch_data = pytest.importorskip("torch.utils.data")
    counts = [7, 13, 5, 9, 11, 3, 8, 6, 10, 12]
    urls = write_shards(tmp_path, len(counts), counts)
    dataset = ShardDataset(urls, prefetch=0, **options)
    loader = torch_data.DataLoader(dataset, batch_size=8, num_workers=2, collate_fn=list)
    assert sum(len(batch) for batch in loader) >= sum(counts)
    assert dataset.stats()["shards_done"] == len(counts)
