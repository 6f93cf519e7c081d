"""Shard order per epoch and the split over ranks and workers."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from fsspec_shards.iteration.order import (
    Consumer,
    current_consumer,
    explicit_split,
    group_split,
    node_split,
    shard_order,
)
from fsspec_shards.iteration.rng import CounterRNG, derive_key


def test_order_is_a_permutation_of_all_shards():
    for count in (1, 2, 7, 100):
        assert sorted(shard_order(count, seed=3, epoch=1, shuffle=True)) == list(range(count))


def test_order_depends_on_seed_and_epoch_only():
    first = shard_order(50, seed=1, epoch=0, shuffle=True)
    assert first == shard_order(50, seed=1, epoch=0, shuffle=True)
    assert first != shard_order(50, seed=1, epoch=1, shuffle=True)
    assert first != shard_order(50, seed=2, epoch=0, shuffle=True)


def test_unshuffled_order_is_the_url_order():
    assert shard_order(5, seed=9, epoch=4, shuffle=False) == [0, 1, 2, 3, 4]


def test_order_is_the_same_in_processes_with_other_hash_seeds_and_wds_seed():
    program = (
        "from fsspec_shards.iteration.order import shard_order;"
        "print(shard_order(40, seed=5, epoch=2, shuffle=True))"
    )
    outputs = set()
    for hash_seed, wds_seed in (("1", "7"), ("2", "123"), ("random", "")):
        env = dict(os.environ, PYTHONHASHSEED=hash_seed, WDS_SEED=wds_seed)
        result = subprocess.run(
            [sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=120
        )
        assert result.returncode == 0, result.stderr
        outputs.add(result.stdout)
    assert outputs == {str(shard_order(40, seed=5, epoch=2, shuffle=True)) + "\n"}


def test_pinned_order_does_not_change_between_versions():
    # A change here silently changes every user's data order: it must be deliberate.
    assert shard_order(8, seed=0, epoch=0, shuffle=True) == [0, 2, 3, 6, 5, 1, 7, 4]
    # splitmix64's published first output for state 1.
    assert CounterRNG(1).next_u64() == 0x910A2DEC89025CC1


def test_node_split_reads_rank_and_world_size_from_the_environment(monkeypatch):
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert node_split() == (2, 4)
    assert current_consumer(split_by_node=True, split_by_worker=True) == Consumer(2, 4, 0, 1)
    assert current_consumer(split_by_node=False, split_by_worker=True) == Consumer(0, 1, 0, 1)


def test_rank_outside_the_world_is_an_error(monkeypatch):
    monkeypatch.setenv("RANK", "4")
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(ValueError, match="RANK=4"):
        node_split()


def test_world_size_without_rank_is_an_error_not_every_process_reading_rank_0(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match="WORLD_SIZE=2 is set but RANK is not"):
        node_split()
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert node_split() == (0, 1)


def test_counter_rng_resumes_from_its_counter():
    rng = CounterRNG(derive_key("test", 1))
    [rng.below(10) for _ in range(5)]
    resumed = CounterRNG(rng.key, rng.counter)
    assert [rng.below(1000) for _ in range(20)] == [resumed.below(1000) for _ in range(20)]


def test_counter_rng_draws_stay_in_bounds_and_cover_them():
    rng = CounterRNG(42)
    draws = [rng.below(6) for _ in range(600)]
    assert set(draws) == set(range(6))
    with pytest.raises(ValueError):
        rng.below(0)


def test_initialized_torch_distributed_wins_over_the_environment(monkeypatch):
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available():
        pytest.skip("torch.distributed is not built in")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        assert node_split() == (0, 1)
    finally:
        dist.destroy_process_group()
    assert node_split() == (1, 4)


class MeshDimension:
    """The two methods of a one-dimensional torch DeviceMesh that the split uses."""

    ndim = 1

    def __init__(self, rank, size):
        self.rank, self.count = rank, size

    def get_local_rank(self):
        return self.rank

    def size(self):
        return self.count


def test_explicit_rank_and_world_size_are_checked():
    assert explicit_split(None, None) is None
    assert explicit_split(1, 4) == (1, 4)
    with pytest.raises(ValueError, match="go together"):
        explicit_split(1, None)
    with pytest.raises(ValueError, match="rank=4 must be smaller than world_size=4"):
        explicit_split(4, 4)
    with pytest.raises(ValueError, match="either group= or rank="):
        explicit_split(0, 2, MeshDimension(0, 2))


def test_a_device_mesh_dimension_gives_its_local_rank_and_size():
    assert group_split(MeshDimension(3, 4)) == (3, 4)
    assert explicit_split(None, None, MeshDimension(1, 2)) == (1, 2)
    flat = MeshDimension(0, 4)
    flat.ndim = 2
    with pytest.raises(ValueError, match="one-dimensional DeviceMesh"):
        group_split(flat)
    with pytest.raises(ValueError, match="process group or a DeviceMesh"):
        group_split(object())


def test_an_explicit_split_replaces_the_environment(monkeypatch):
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert current_consumer(True, True, node=(1, 3)) == Consumer(1, 3, 0, 1)
