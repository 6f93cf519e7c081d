"""Resumption: one resume object per kind of state, dropped by an iteration of another epoch."""

from __future__ import annotations

import logging

import pytest

from fsspec_shards import ShardDataset
from fsspec_shards.iteration.resume.regroup import remainder_state
from fsspec_shards.iteration.resume.resumption import Resumption
from tests.shardmaker import keys, write_shards


@pytest.fixture
def dataset(tmp_path):
    return ShardDataset(write_shards(tmp_path, 4, [3, 2, 4, 1]), seed=2, shuffle_buffer=2)


def test_a_loaded_position_is_dropped_by_an_iteration_of_another_epoch(dataset, caplog):
    iterator = iter(dataset)
    next(iterator)
    resumption = Resumption(dataset.streams)
    assert resumption.load(dataset.state_dict(), dataset.consumer()) == 0
    with caplog.at_level(logging.INFO, logger="fsspec_shards"):
        stream = resumption.start(1, dataset.consumer())
    assert "dropping the loaded state of epoch 0" in caplog.text
    assert stream.epoch == 1 and stream.state.delivered == 0
    assert resumption.state_dict(1, dataset.consumer)["delivered"] == 0


def test_a_remainder_with_a_shard_outside_the_dataset_is_refused(dataset):
    state = remainder_state(dataset, [dataset.state_dict()])
    state["segments"] = [[9, 0, -1, 0, -1, -1]]
    with pytest.raises(ValueError, match=r"shard index 9 is outside 0..3"):
        Resumption(dataset.streams).load(state, dataset.consumer())


def test_a_remainder_of_every_consumer_resumes_the_rest_of_the_epoch(dataset):
    expected = keys(dataset)
    fresh = ShardDataset(dataset.urls, seed=2, shuffle_buffer=2)
    iterator = iter(fresh)
    head = [next(iterator)["__key__"] for _ in range(4)]
    resumption = Resumption(fresh.streams)
    resumption.load([fresh.state_dict()], fresh.consumer())
    assert resumption.remainder(0) is not None and resumption.remainder(1) is None
    rest = [sample["__key__"] for sample in resumption.start(0, fresh.consumer()).run()]
    assert sorted(head + rest) == sorted(expected)
