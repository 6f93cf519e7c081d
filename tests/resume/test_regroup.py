"""Continuing an interrupted epoch with another number of consumers: every remaining sample
exactly once, and the regrouped epoch resumes exactly in turn."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from fsspec_shards import ShardDataset
from fsspec_shards.iteration.resume.regroup import loader_dataset_states, remainder_state
from tests.shardmaker import keys, write_shards

ARGS = dict(shuffle_buffer=3, seed=5)


@pytest.fixture
def shards(tmp_path):
    return write_shards(tmp_path, 7, [4, 6, 3, 5, 2, 6, 4])


def as_rank(monkeypatch, rank, world_size):
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", str(world_size))


def interrupted_run(shards, monkeypatch, world_size, cuts, load=None):
    """Each rank reads ``cuts[rank]`` samples; returns (samples read, states)."""
    read, states = [], []
    for rank in range(world_size):
        as_rank(monkeypatch, rank, world_size)
        dataset = ShardDataset(shards, **ARGS)
        if load is not None:
            dataset.load_state_dict(json.loads(json.dumps(load)))
        iterator = iter(dataset)
        for _ in range(cuts[rank]):
            sample = next(iterator, None)
            if sample is None:
                break
            read.append(sample["__key__"])
        states.append(dataset.state_dict())
    return read, states


def test_two_ranks_continue_as_three_with_every_sample_exactly_once(shards, monkeypatch):
    everything = keys(ShardDataset(shards, split_by_node=False))
    head, states = interrupted_run(shards, monkeypatch, 2, [5, 9])
    remainder = remainder_state(ShardDataset(shards, **ARGS), states)
    tail, _ = interrupted_run(shards, monkeypatch, 3, [100, 100, 100], load=remainder)
    assert Counter(head + tail) == Counter(everything)


def test_regrouping_twice_still_covers_everything_once(shards, monkeypatch):
    everything = keys(ShardDataset(shards, split_by_node=False))
    head, states = interrupted_run(shards, monkeypatch, 2, [3, 7])
    middle, states = interrupted_run(
        shards,
        monkeypatch,
        3,
        [2, 4, 1],
        load=remainder_state(ShardDataset(shards, **ARGS), states),
    )
    tail, _ = interrupted_run(
        shards, monkeypatch, 1, [100], load=remainder_state(ShardDataset(shards, **ARGS), states)
    )
    assert Counter(head + middle + tail) == Counter(everything)


def test_a_regrouped_epoch_resumes_exactly(shards, monkeypatch):
    _, states = interrupted_run(shards, monkeypatch, 2, [4, 6])
    remainder = remainder_state(ShardDataset(shards, **ARGS), states)
    as_rank(monkeypatch, 1, 3)
    fresh = ShardDataset(shards, **ARGS)
    fresh.load_state_dict(remainder)
    expected = keys(fresh)
    assert expected
    for cut in range(len(expected) + 1):
        dataset = ShardDataset(shards, **ARGS)
        dataset.load_state_dict(remainder)
        iterator = iter(dataset)
        head = [next(iterator)["__key__"] for _ in range(cut)]
        resumed = ShardDataset(shards, **ARGS)
        resumed.load_state_dict(json.loads(json.dumps(dataset.state_dict())))
        assert head + keys(resumed) == expected, f"cut after {cut}"


def test_dataloader_workers_share_the_remainder(shards, monkeypatch):
    torch_data = pytest.importorskip("torch.utils.data")
    everything = keys(ShardDataset(shards, split_by_node=False))
    head, states = interrupted_run(shards, monkeypatch, 2, [6, 2])
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    dataset = ShardDataset(shards, **ARGS)
    dataset.load_state_dict(remainder_state(ShardDataset(shards, **ARGS), states))
    loader = torch_data.DataLoader(dataset, batch_size=None, num_workers=2)
    tail = [sample["__key__"] for sample in loader]
    assert Counter(head + tail) == Counter(everything)


def test_states_must_cover_every_consumer_of_one_run(shards, monkeypatch):
    _, states = interrupted_run(shards, monkeypatch, 2, [1, 1])
    with pytest.raises(ValueError, match="each of the 2 consumers"):
        remainder_state(ShardDataset(shards, **ARGS), states[:1])
    with pytest.raises(ValueError, match="each of the 2 consumers"):
        remainder_state(ShardDataset(shards, **ARGS), [states[0], states[0]])
    other = dict(states[1], epoch=3)
    with pytest.raises(ValueError, match="different epochs"):
        remainder_state(ShardDataset(shards, **ARGS), [states[0], other])


def test_a_remainder_from_other_arguments_is_refused(shards, monkeypatch):
    _, states = interrupted_run(shards, monkeypatch, 2, [1, 1])
    remainder = remainder_state(ShardDataset(shards, **ARGS), states)
    with pytest.raises(ValueError, match="seed"):
        ShardDataset(shards, shuffle_buffer=3, seed=6).load_state_dict(remainder)


def test_a_stateful_dataloader_run_continues_with_more_workers(shards):
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    torch_data = pytest.importorskip("torch.utils.data")
    everything = keys(ShardDataset(shards, split_by_node=False))

    def collate(batch):
        return [sample["__key__"] for sample in batch]

    loader = stateful.StatefulDataLoader(
        ShardDataset(shards, **ARGS), batch_size=2, num_workers=2, collate_fn=collate
    )
    iterator = iter(loader)
    head = [key for _ in range(5) for key in next(iterator)]
    states = loader_dataset_states(loader.state_dict())
    del iterator
    dataset = ShardDataset(shards, **ARGS)
    dataset.load_state_dict(remainder_state(ShardDataset(shards, **ARGS), states))
    tail = [s["__key__"] for s in torch_data.DataLoader(dataset, batch_size=None, num_workers=3)]
    assert Counter(head + tail) == Counter(everything)


def collate_keys(batch):
    return [sample["__key__"] for sample in batch]


def stateful_run(shards, monkeypatch, world_size, workers, batches, **args):
    """Each rank reads ``batches[rank]`` batches of 2 through a StatefulDataLoader; returns
    (keys read, every rank's loader state)."""
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    read, states = [], []
    for rank in range(world_size):
        as_rank(monkeypatch, rank, world_size)
        loader = stateful.StatefulDataLoader(
            ShardDataset(shards, **args), batch_size=2, num_workers=workers, collate_fn=collate_keys
        )
        iterator = iter(loader)
        for _ in range(batches[rank]):
            read += next(iterator)
        states.append(json.loads(json.dumps(loader.state_dict())))
        del iterator
    return read, states


def continue_with(shards, monkeypatch, world_size, old_states, **args):
    """Every new rank loads the list of old states and reads the rest; keys per rank."""
    parts = []
    for rank in range(world_size):
        as_rank(monkeypatch, rank, world_size)
        dataset = ShardDataset(shards, **args)
        dataset.load_state_dict(old_states)
        parts.append(keys(dataset))
    return parts


def test_a_list_of_2x2_loader_states_continues_as_3x1_with_every_sample_once(shards, monkeypatch):
    pytest.importorskip("torch")
    everything = keys(ShardDataset(shards, split_by_node=False))
    head, states = stateful_run(shards, monkeypatch, 2, 2, [3, 5], **ARGS)
    assert len(head) == 16
    parts = continue_with(shards, monkeypatch, 3, states, **ARGS)
    assert all(parts)
    assert Counter(head + [key for part in parts for key in part]) == Counter(everything)


def test_a_list_of_dataset_states_continues_with_a_dataloader_per_new_rank(shards, monkeypatch):
    torch_data = pytest.importorskip("torch.utils.data")
    everything = keys(ShardDataset(shards, split_by_node=False))
    head, states = interrupted_run(shards, monkeypatch, 2, [5, 9])
    tail = []
    for rank in range(2):
        as_rank(monkeypatch, rank, 2)
        dataset = ShardDataset(shards, **ARGS)
        dataset.load_state_dict(states)
        loader = torch_data.DataLoader(dataset, batch_size=None, num_workers=2)
        tail += [sample["__key__"] for sample in loader]
    assert Counter(head + tail) == Counter(everything)


def test_with_counts_the_new_ranks_continue_with_equal_lengths(shards, monkeypatch):
    counts = {url: n for url, n in zip(shards, [4, 6, 3, 5, 2, 6, 4], strict=True)}
    args = dict(ARGS, samples_per_shard=counts)
    everything = keys(ShardDataset(shards, split_by_node=False))
    head, states = [], []
    for rank in range(2):
        as_rank(monkeypatch, rank, 2)
        dataset = ShardDataset(shards, **args)
        iterator = iter(dataset)
        head += [next(iterator)["__key__"] for _ in range(4 + 3 * rank)]
        states.append(dataset.state_dict())
    parts = continue_with(shards, monkeypatch, 3, states, **args)
    assert len({len(part) for part in parts}) == 1
    assert Counter(head + [key for part in parts for key in set(part)]) == Counter(everything)


def test_tracker_states_of_every_old_rank_continue_the_epoch(shards, monkeypatch):
    from fsspec_shards.iteration.resume.delivery import DeliveryTracker

    args = dict(ARGS, annotate=True)
    everything = keys(ShardDataset(shards, split_by_node=False))
    head, states = [], []
    for rank in range(2):
        as_rank(monkeypatch, rank, 2)
        dataset = ShardDataset(shards, **args)
        tracker = DeliveryTracker(dataset, num_workers=0)
        iterator = iter(dataset)
        head += [tracker.update([next(iterator)])[0]["__key__"] for _ in range(3 + 2 * rank)]
        states.append(tracker.state_dict())
    parts = continue_with(shards, monkeypatch, 3, states, **args)
    assert Counter(head + [key for part in parts for key in part]) == Counter(everything)


def test_a_list_missing_a_consumer_or_from_other_arguments_is_refused(shards, monkeypatch):
    _, states = interrupted_run(shards, monkeypatch, 2, [2, 2])
    with pytest.raises(ValueError, match="each of the 2 consumers"):
        ShardDataset(shards, **ARGS).load_state_dict(states[:1])
    with pytest.raises(ValueError, match="seed"):
        ShardDataset(shards, shuffle_buffer=3, seed=6).load_state_dict(states)
    with pytest.raises(ValueError, match="different epochs"):
        ShardDataset(shards, **ARGS).load_state_dict([states[0], dict(states[1], epoch=1)])


def test_the_continued_epoch_checkpoints_and_resumes_through_a_stateful_dataloader(
    shards, monkeypatch
):
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    everything = keys(ShardDataset(shards, split_by_node=False))
    head, states = stateful_run(shards, monkeypatch, 2, 2, [2, 3], **ARGS)
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")

    def loader_over(old_states):
        dataset = ShardDataset(shards, **ARGS)
        dataset.load_state_dict(old_states)
        return stateful.StatefulDataLoader(
            dataset, batch_size=2, num_workers=3, collate_fn=collate_keys
        )

    loader = loader_over(states)
    iterator = iter(loader)
    middle = [key for _ in range(3) for key in next(iterator)]
    checkpoint = json.loads(json.dumps(loader.state_dict()))
    del iterator
    resumed = loader_over(states)
    resumed.load_state_dict(checkpoint)
    tail = [key for batch in resumed for key in batch]
    assert Counter(head + middle + tail) == Counter(everything)


def test_a_loader_state_without_torchdatas_keys_is_refused_naming_them():
    with pytest.raises(ValueError, match="expected '_snapshot' with '_worker_snapshots'"):
        loader_dataset_states({"_snapshot": {"workers": {}}})
    with pytest.raises(ValueError, match="missing 'dataset_state'"):
        loader_dataset_states({"_snapshot": {"_worker_snapshots": {"0": {"state": {}}}}})


@pytest.mark.parametrize("batch_size", [None, 2])
def test_a_remainder_smaller_than_the_new_consumers_pads_every_one(shards, monkeypatch, batch_size):
    # 1 sample left of the epoch, 4 new ranks: three have none of their own; they repeat
    # the remainder's, so every rank takes the same steps (was: ValueError on those three).
    counts = {url: n for url, n in zip(shards, [4, 6, 3, 5, 2, 6, 4], strict=True)}
    args = dict(ARGS, samples_per_shard=counts, batch_size=batch_size)
    everything = keys(ShardDataset(shards, split_by_node=False))
    head, states = [], []
    for rank in range(2):
        as_rank(monkeypatch, rank, 2)
        dataset = ShardDataset(shards, **args)
        iterator = iter(dataset)
        own = dataset.plan(0, dataset.consumer()).own  # its samples, padding aside
        head += [next(iterator)["__key__"] for _ in range(own - (rank == 0))]
        states.append(dataset.state_dict())
    parts = continue_with(shards, monkeypatch, 4, states, **args)
    assert len({len(part) for part in parts}) == 1 and len(parts[0]) == (batch_size or 1)
    assert set(head) | {key for part in parts for key in part} == set(everything)
    # The repeats are padding: regrouped again, the remainder is that one sample, once.
    later = []
    for rank in range(4):
        as_rank(monkeypatch, rank, 4)
        dataset = ShardDataset(shards, **args)
        dataset.load_state_dict(states)
        later.append(dataset.state_dict())
    assert sum(continue_with(shards, monkeypatch, 1, later, **args), []) == [
        key for key in everything if key not in head
    ] * (batch_size or 1)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_tracker_state_taken_in_the_continued_epoch_resumes_it(shards, monkeypatch, num_workers):
    torch_data = pytest.importorskip("torch.utils.data")
    from fsspec_shards.iteration.resume.delivery import DeliveryTracker

    args = dict(ARGS, annotate=True)
    everything = keys(ShardDataset(shards, split_by_node=False))
    head, states = interrupted_run(shards, monkeypatch, 2, [3, 5])
    as_rank(monkeypatch, 0, 1)
    dataset = ShardDataset(shards, **args)
    dataset.load_state_dict(states)  # the rest of the epoch, on one rank
    tracker = DeliveryTracker(dataset, num_workers)
    loader = torch_data.DataLoader(
        dataset, batch_size=2, num_workers=num_workers, collate_fn=lambda batch: batch
    )
    middle = []
    for batch in loader:
        middle += [sample["__key__"] for sample in tracker.update(batch)]
        if len(middle) >= 6:
            break
    resumed = ShardDataset(shards, **args)
    resumed.load_state_dict(json.loads(json.dumps(tracker.state_dict())))
    tail = [
        key
        for batch in torch_data.DataLoader(
            resumed, batch_size=2, num_workers=num_workers, collate_fn=lambda batch: batch
        )
        for key in keys(batch)
    ]
    # was: the fresh epoch fast-forwarded instead of the remainder (31 samples of 25, 6 twice)
    assert Counter(head + middle + tail) == Counter(everything)
    # In a list of states (regrouped again, over 2 ranks) too.
    parts = continue_with(shards, monkeypatch, 2, [tracker.state_dict()], **args)
    assert Counter(head + middle + [key for part in parts for key in part]) == Counter(everything)
