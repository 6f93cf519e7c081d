"""Which shards one consumer reads in one epoch.

The order of ALL shards is computed first, from (seed, epoch) only, so every rank and worker
agrees on it; each consumer then takes every ``total``-th shard starting at its own index.
Consumers are the ``world_size`` ranks (torch.distributed when initialized, else the ``RANK`` /
``WORLD_SIZE`` environment variables) times the DataLoader workers of each rank.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from fsspec_shards.config import parse_int
from fsspec_shards.iteration.rng import CounterRNG, derive_key


@dataclass(frozen=True, slots=True)
class Consumer:
    """One reader of the dataset: a DataLoader worker of one rank."""

    rank: int = 0
    world_size: int = 1
    worker: int = 0
    num_workers: int = 1

    @property
    def index(self) -> int:
        """Position of this consumer among all ``total`` consumers."""
        return self.rank * self.num_workers + self.worker

    @property
    def total(self) -> int:
        """Number of consumers sharing the shards."""
        return self.world_size * self.num_workers


def shard_order(num_shards: int, seed: int, epoch: int, shuffle: bool) -> list[int]:
    """Indices of all shards in the order of ``epoch``: a permutation from (seed, epoch)."""
    if not shuffle:
        return list(range(num_shards))
    return CounterRNG(derive_key("shard-order", seed, epoch)).permutation(num_shards)


def consumer_shards(order: list[int], consumer: Consumer) -> list[int]:
    """The part of ``order`` that ``consumer`` reads; raises ValueError if some would get none."""
    if len(order) < consumer.total:
        raise ValueError(
            f"{len(order)} shard(s) cannot be split over {consumer.total} consumers "
            f"({consumer.world_size} rank(s) x {consumer.num_workers} worker(s)): some would "
            "read nothing; use at least as many shards as consumers, fewer DataLoader workers, "
            "or split_by_node/split_by_worker=False"
        )
    return order[consumer.index :: consumer.total]


def node_split() -> tuple[int, int]:
    """(rank, world size) from torch.distributed when initialized, else RANK / WORLD_SIZE."""
    try:
        import torch.distributed as dist
    except ImportError:
        dist = None
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    world_size = parse_int(os.environ.get("WORLD_SIZE", "1"), "WORLD_SIZE", minimum=1)
    if world_size > 1 and "RANK" not in os.environ:
        # Defaulting to rank 0 would make every process read the same part and miss the rest.
        raise ValueError(
            f"WORLD_SIZE={world_size} is set but RANK is not: set RANK for each process, "
            "initialize torch.distributed, or pass split_by_node=False"
        )
    rank = parse_int(os.environ.get("RANK", "0"), "RANK")
    if rank >= world_size:
        raise ValueError(f"RANK={rank} must be smaller than WORLD_SIZE={world_size}")
    return rank, world_size


def worker_split() -> tuple[int, int]:
    """(worker id, worker count) inside a torch DataLoader worker, else (0, 1)."""
    try:
        from torch.utils.data import get_worker_info
    except ImportError:
        return 0, 1
    info = get_worker_info()
    if info is None:
        return 0, 1
    return info.id, info.num_workers


def current_consumer(split_by_node: bool, split_by_worker: bool) -> Consumer:
    """The consumer this process/thread is, given which splits are enabled."""
    rank, world_size = node_split() if split_by_node else (0, 1)
    worker, num_workers = worker_split() if split_by_worker else (0, 1)
    return Consumer(rank, world_size, worker, num_workers)
