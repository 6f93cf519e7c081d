"""ShardDataset inside torch DataLoaders: the split over workers and ranks, and exact resumption
through StatefulDataLoader and, with a DeliveryTracker, through the plain DataLoader."""

from __future__ import annotations

import gc
import json
from pathlib import Path

import pytest

from fsspec_shards import MixedDataset, ShardDataset
from fsspec_shards.iteration.resume.delivery import DeliveryTracker
from tests.shardmaker import keys, write_shards

torch_data = pytest.importorskip("torch.utils.data")
stateful = pytest.importorskip("torchdata.stateful_dataloader")

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

EPOCHS = 2


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return write_shards(tmp_path_factory.mktemp("shards"), 8, [3, 5, 2, 4, 6, 1, 3, 4])


def collate_keys(batch):
    return [sample["__key__"] for sample in batch]


def stateful_loader(dataset, num_workers, **options):
    return stateful.StatefulDataLoader(
        dataset, batch_size=2, num_workers=num_workers, collate_fn=collate_keys, **options
    )


def run_epochs(dataset, loader, first_epoch, seen, stop_after=None, on_batch=None):
    """Append (epoch, batch) to ``seen``; stop once it holds ``stop_after``; return the epoch."""
    for epoch in range(first_epoch, EPOCHS):
        dataset.set_epoch(epoch)
        for batch in loader:
            if on_batch is not None:
                on_batch(batch)
            seen.append((epoch, batch))
            if len(seen) == stop_after:
                return epoch
    return EPOCHS


@pytest.mark.parametrize("num_workers", [0, 1, 2, 4])
def test_stateful_dataloader_resumes_exactly(shards, num_workers):
    args = dict(urls=shards, shuffle_buffer=3, seed=1)
    dataset = ShardDataset(**args)
    expected: list = []
    run_epochs(dataset, stateful_loader(dataset, num_workers), 0, expected)
    first_epoch_batches = sum(1 for epoch, _ in expected if epoch == 0)
    for cut in (1, first_epoch_batches, len(expected) - 2):
        dataset = ShardDataset(**args)
        loader = stateful_loader(dataset, num_workers)
        seen: list = []
        epoch = run_epochs(dataset, loader, 0, seen, stop_after=cut)
        state = json.loads(json.dumps(loader.state_dict()))
        resumed_dataset = ShardDataset(**args)
        resumed_dataset.set_epoch(epoch)
        resumed = stateful_loader(resumed_dataset, num_workers)
        resumed.load_state_dict(state)
        run_epochs(resumed_dataset, resumed, epoch, seen)
        assert seen == expected, f"cut after {cut} batches"


def test_stateful_dataloader_snapshots_every_n_steps_replay_the_rest_exactly(shards):
    args = dict(urls=shards, shuffle_buffer=3, seed=4)
    dataset = ShardDataset(**args)
    expected: list = []
    run_epochs(dataset, stateful_loader(dataset, 2, snapshot_every_n_steps=4), 0, expected)
    dataset = ShardDataset(**args)
    loader = stateful_loader(dataset, 2, snapshot_every_n_steps=4)
    seen: list = []
    epoch = run_epochs(dataset, loader, 0, seen, stop_after=7)
    state = loader.state_dict()
    assert state["_steps_since_snapshot"] == 3
    resumed_dataset = ShardDataset(**args)
    resumed = stateful_loader(resumed_dataset, 2, snapshot_every_n_steps=4)
    resumed.load_state_dict(state)
    run_epochs(resumed_dataset, resumed, epoch, seen)
    assert seen == expected


def plain_loader(dataset, num_workers):
    return torch_data.DataLoader(dataset, batch_size=2, num_workers=num_workers)


@pytest.mark.parametrize("num_workers, cuts", [(0, (4, 13)), (2, (3, 15, 22))])
def test_plain_dataloader_resumes_exactly_with_a_delivery_tracker(shards, num_workers, cuts):
    args = dict(urls=shards, shuffle_buffer=3, seed=1, annotate=True)
    dataset = ShardDataset(**args)
    expected: list = []
    run_epochs(dataset, plain_loader(dataset, num_workers), 0, expected)
    expected = [(epoch, batch["__key__"]) for epoch, batch in expected]
    for cut in cuts:
        dataset = ShardDataset(**args)
        tracker = DeliveryTracker(dataset, num_workers)
        seen: list = []

        def track(batch, tracker=tracker, dataset=dataset):
            if tracker.epoch != dataset.epoch:
                tracker.set_epoch(dataset.epoch)
            tracker.update(batch)

        epoch = run_epochs(dataset, plain_loader(dataset, num_workers), 0, seen, cut, track)
        state = json.loads(json.dumps(tracker.state_dict()))
        resumed = ShardDataset(**args)
        resumed.load_state_dict(state)
        run_epochs(resumed, plain_loader(resumed, num_workers), epoch, seen)
        assert [(e, batch["__key__"]) for e, batch in seen] == expected, f"cut after {cut}"


def test_delivery_tracker_state_for_other_worker_counts_is_refused(shards):
    dataset = ShardDataset(shards, annotate=True)
    state = DeliveryTracker(dataset, 2).state_dict()
    resumed = ShardDataset(shards, annotate=True)
    resumed.load_state_dict(state)
    with pytest.raises(ValueError, match="counts 2 DataLoader workers"):
        list(resumed)
    with pytest.raises(ValueError, match="annotate=True"):
        DeliveryTracker(ShardDataset(shards), 2)


@pytest.mark.parametrize("num_workers", [0, 1, 2])
def test_ranks_times_workers_yield_every_sample_exactly_once(shards, num_workers, monkeypatch):
    everything = keys(ShardDataset(shards, split_by_node=False))
    seen = []
    for rank in range(2):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        loader = torch_data.DataLoader(
            ShardDataset(shards, seed=3, shuffle_buffer=2),
            batch_size=None,
            num_workers=num_workers,
        )
        seen += [sample["__key__"] for sample in loader]
    assert sorted(seen) == sorted(everything)


def test_too_few_shards_for_the_consumers_raises_from_the_worker_instead_of_hanging(
    shards, monkeypatch
):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "9")
    loader = torch_data.DataLoader(ShardDataset(shards), batch_size=None, num_workers=1)
    iterator = iter(loader)
    with pytest.raises(ValueError, match="cannot be split over 9 consumers"):
        next(iterator)
    # torch joins an errored worker with a time-out: let that happen here, not in a later test.
    del iterator
    gc.collect()


def test_stateful_dataloader_state_after_a_finished_epoch_starts_the_next_one(shards):
    args = dict(urls=shards, shuffle_buffer=3, seed=1)
    dataset = ShardDataset(**args)
    expected: list = []
    run_epochs(dataset, stateful_loader(dataset, 2), 0, expected)
    dataset = ShardDataset(**args)
    loader = stateful_loader(dataset, 2)
    seen = [(0, batch) for batch in loader]
    state = loader.state_dict()
    assert state["_iterator_finished"]
    resumed_dataset = ShardDataset(**args)
    resumed = stateful_loader(resumed_dataset, 2)
    resumed.load_state_dict(state)
    run_epochs(resumed_dataset, resumed, 1, seen)
    assert seen == expected


def test_64_consumers_over_16_shards_get_every_sample_once_and_equal_counts(tmp_path, monkeypatch):
    counts = [5 + (index * 7) % 13 for index in range(16)]
    urls = write_shards(tmp_path, 16, counts)
    sidecar = tmp_path / "counts.json"
    sidecar.write_text(
        json.dumps({url.rsplit("/", 1)[-1]: n for url, n in zip(urls, counts, strict=True)})
    )
    everything = keys(ShardDataset(urls, split_by_node=False, split_by_worker=False))
    world_size, workers = 16, 4
    per_consumer: dict[tuple[int, int], list[str]] = {}
    padded = 0
    for rank in range(world_size):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", str(world_size))
        dataset = ShardDataset(urls, samples_per_shard=str(sidecar), seed=2, annotate=True)
        loader = torch_data.DataLoader(dataset, batch_size=None, num_workers=workers)
        for sample in loader:
            per_consumer.setdefault((rank, sample["__worker__"]), []).append(sample["__key__"])
        padded += dataset.stats()["padded"]
    assert len(per_consumer) == world_size * workers
    length = -(-len(everything) // (world_size * workers))
    assert {len(part) for part in per_consumer.values()} == {length}
    delivered = [key for part in per_consumer.values() for key in part]
    assert set(delivered) == set(everything)
    assert padded == len(delivered) - len(everything) > 0


def test_stats_of_two_workers_are_visible_in_the_main_process(tmp_path):
    shards = write_shards(tmp_path, 8, [3, 5, 2, 4, 6, 1, 3, 4])
    Path(shards[3]).write_bytes(Path(shards[3]).read_bytes()[:700])
    dataset = ShardDataset(shards, seed=1, handler="warn")
    loader = torch_data.DataLoader(dataset, batch_size=None, num_workers=2)
    seen = sum(1 for _ in loader)
    stats = dataset.stats()
    assert stats["samples"] == seen == sum([3, 5, 2, 6, 1, 3, 4])
    assert stats["shards_done"] == 7 and stats["shards_failed"] == 1
    assert sorted(worker["worker"] for worker in stats["workers"]) == [0, 1]
    assert sum(worker["samples"] for worker in stats["workers"]) == seen
    assert all(worker["samples_per_second"] > 0 for worker in stats["workers"])
    assert stats["wait_seconds"] > 0
    ((url, error),) = stats["failures"]
    assert url == shards[3] and error.kind == "ShardFormatError" and "shard-0003" in str(error)


def test_ranks_sharing_a_stats_directory_see_the_whole_job(tmp_path, monkeypatch):
    shards = write_shards(tmp_path, 4, [2, 3, 4, 5])
    run_directory = tmp_path / "run"
    datasets = []
    for rank in range(3):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "3")
        dataset = ShardDataset(shards, stats_dir=run_directory)
        workers = 1 if rank < 2 else 0  # the last rank reads in its main process
        loader = torch_data.DataLoader(dataset, batch_size=None, num_workers=workers)
        assert sum(1 for _ in loader)
        datasets.append(dataset)
    assert datasets[1].stats()["samples"] == 14
    assert sorted(worker["rank"] for worker in datasets[1].stats()["workers"]) == [0, 1, 2]
    assert (run_directory.stat().st_mode & 0o777) == 0o700


@pytest.fixture(scope="module")
def hundreds(tmp_path_factory):
    """10 shards of 100 samples but two (97 and 103), and their counts."""
    counts = [100, 97, 100, 100, 103, 100, 100, 100, 100, 100]
    urls = write_shards(tmp_path_factory.mktemp("hundreds"), 10, counts)
    return urls, dict(zip(urls, counts, strict=True))


@pytest.mark.parametrize("num_workers", [0, 2, 3])
@pytest.mark.parametrize("equalize", ["pad", "truncate"])
def test_len_of_a_loader_is_the_batches_it_yields_for_any_worker_count(
    hundreds, num_workers, equalize
):
    urls, counts = hundreds
    batch_size = 32
    delivered: list[str] = []
    for rank in range(2):
        dataset = ShardDataset(
            urls,
            samples_per_shard=counts,
            rank=rank,
            world_size=2,
            seed=5,
            prefetch=0,
            batch_size=batch_size,
            equalize=equalize,
        )
        for drop_last in (False, True):
            loader = torch_data.DataLoader(
                dataset,
                batch_size=batch_size,
                num_workers=num_workers,
                drop_last=drop_last,
                collate_fn=collate_keys,
            )
            batches = list(loader)
            assert len(loader) == len(batches) == len(dataset) // batch_size
            assert {len(batch) for batch in batches} == {batch_size}
        delivered += [key for batch in batches for key in batch]
    # Every rank the same batches: 16 (pad: 1000 samples round up) or 15 (truncate).
    assert len(delivered) == 2 * batch_size * (16 if equalize == "pad" else 15)
    if equalize == "pad":
        assert set(delivered) == set(keys(ShardDataset(urls, split_by_node=False)))
    else:
        assert len(set(delivered)) == len(delivered)


def test_the_default_split_repeats_at_most_one_sample_per_consumer(hundreds):
    urls, counts = hundreds
    delivered: list[str] = []
    for rank in range(2):
        dataset = ShardDataset(urls, samples_per_shard=counts, rank=rank, world_size=2, seed=2)
        loader = torch_data.DataLoader(dataset, batch_size=None, num_workers=2)
        delivered += [sample["__key__"] for sample in loader]
        assert dataset.stats()["padded"] <= 2
    assert len(set(delivered)) == sum(counts.values()) == 1000
    assert len(delivered) - 1000 <= 4  # 2 ranks x 2 workers, at most one repeat each


def test_batch_size_refuses_what_cannot_give_whole_batches(hundreds):
    urls, counts = hundreds
    with pytest.raises(ValueError, match="needs the sample counts"):
        ShardDataset(urls, batch_size=4)
    with pytest.raises(ValueError, match="needs equal epochs"):
        ShardDataset(urls, samples_per_shard=counts, batch_size=4, equalize=None)
    with pytest.raises(ValueError, match="use split='auto' or 'samples'"):
        ShardDataset(urls, samples_per_shard=counts, batch_size=4, split="shards")
    with pytest.raises(ValueError, match="positive int"):
        ShardDataset(urls, samples_per_shard=counts, batch_size=0)


@pytest.mark.parametrize("persistent", [True, False])
def test_workers_follow_set_epoch_also_when_persistent(hundreds, persistent):
    urls, counts = hundreds
    dataset = ShardDataset(urls[:4], seed=3, shuffle_buffer=8, prefetch=0)
    loader = torch_data.DataLoader(
        dataset, batch_size=None, num_workers=2, persistent_workers=persistent
    )
    epochs = []
    for epoch in range(3):
        dataset.set_epoch(epoch)
        epochs.append([sample["__key__"] for sample in loader])
    for epoch, order in enumerate(epochs):
        fresh = ShardDataset(urls[:4], seed=3, shuffle_buffer=8, prefetch=0)
        fresh.set_epoch(epoch)
        alone = torch_data.DataLoader(fresh, batch_size=None, num_workers=2)
        assert order == [sample["__key__"] for sample in alone]
    assert epochs[0] != epochs[1] != epochs[2]
    assert sorted(epochs[0]) == sorted(epochs[1])


@pytest.mark.parametrize("num_workers", [0, 3])
def test_a_batched_mixture_has_an_exact_loader_length(hundreds, num_workers):
    urls, counts = hundreds
    args = dict(samples_per_shard=counts, rank=1, world_size=2, batch_size=8, prefetch=0)
    sources = [ShardDataset(urls[:4], **args), ShardDataset(urls[4:], seed=1, **args)]
    mix = MixedDataset(sources, weights=[3, 1], stop="all_exhausted", batch_size=8)
    loader = torch_data.DataLoader(
        mix,
        batch_size=8,
        num_workers=num_workers,
        collate_fn=collate_keys,
        persistent_workers=num_workers > 0,
    )
    epochs = []
    for epoch in range(2):
        mix.set_epoch(epoch)
        batches = list(loader)
        assert len(loader) == len(batches) == len(mix) // 8 == (200 + 304) // 8
        assert {len(batch) for batch in batches} == {8}
        epochs.append(batches)
    assert epochs[0] != epochs[1]  # persistent workers follow the mixture's set_epoch
    with pytest.raises(ValueError, match="source 1 has batch_size=None"):
        MixedDataset([sources[0], ShardDataset(urls)], stop="all_exhausted", batch_size=8)
    with pytest.raises(ValueError, match="needs stop='all_exhausted'"):
        MixedDataset(sources, batch_size=8)


def test_a_tracker_resumes_batched_workers_of_unequal_batch_counts(shards):
    counts = dict(zip(shards, [3, 5, 2, 4, 6, 1, 3, 4], strict=True))
    # 28 samples, batches of 2: 14 batches over 3 workers as 5, 5 and 4.
    args = dict(urls=shards, shuffle_buffer=3, seed=1, annotate=True, samples_per_shard=counts)
    args["batch_size"] = 2
    dataset = ShardDataset(**args)
    expected: list = []
    run_epochs(dataset, plain_loader(dataset, 3), 0, expected)
    expected = [(epoch, batch["__key__"]) for epoch, batch in expected]
    assert len(expected) == EPOCHS * 14
    for cut in (4, 13):  # before and after the third worker's last batch
        dataset = ShardDataset(**args)
        tracker = DeliveryTracker(dataset, 3)
        seen: list = []
        epoch = run_epochs(dataset, plain_loader(dataset, 3), 0, seen, cut, tracker.update)
        resumed = ShardDataset(**args)
        resumed.load_state_dict(json.loads(json.dumps(tracker.state_dict())))
        run_epochs(resumed, plain_loader(resumed, 3), epoch, seen)
        assert [(e, batch["__key__"]) for e, batch in seen] == expected, f"cut after {cut}"
