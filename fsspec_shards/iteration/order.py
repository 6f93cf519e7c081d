"""Who the consumers are, and the order of all shards in one epoch.

The order of ALL shards is computed from (seed, epoch) only, so every rank and worker agrees
on it (:mod:`~fsspec_shards.iteration.plan` then gives each consumer its part). Consumers are
the ``world_size`` data-parallel ranks times the DataLoader workers of each rank. The ranks
come from, in this order: explicit ``rank``/``world_size``; a ``group`` (a torch.distributed
process group, or a one-dimensional DeviceMesh such as ``mesh["dp"]``: peers that differ only
in other mesh dimensions get the same rank, so they read the same data); torch.distributed
when initialized; the ``RANK`` / ``WORLD_SIZE`` environment variables.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any

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


def group_split(group: Any) -> tuple[int, int]:
    """(rank, size) within ``group``: a 1-D DeviceMesh or a torch.distributed process group."""
    if hasattr(group, "get_local_rank"):
        ndim = getattr(group, "ndim", 1)
        if ndim != 1:
            raise ValueError(
                f"group must be a one-dimensional DeviceMesh (the data-parallel dimension, "
                f'e.g. mesh["dp"]), got one with {ndim} dimensions'
            )
        return int(group.get_local_rank()), int(group.size())
    try:
        import torch.distributed as dist
    except ImportError:
        dist = None
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank(group=group), dist.get_world_size(group=group)
    if callable(getattr(group, "rank", None)) and callable(getattr(group, "size", None)):
        return int(group.rank()), int(group.size())
    raise ValueError(
        f"group must be a torch.distributed process group or a DeviceMesh dimension, "
        f"got {type(group).__name__}"
    )


def explicit_split(
    rank: int | None, world_size: int | None, group: Any = None
) -> tuple[int, int] | None:
    """(rank, world size) chosen by the caller, checked; None to detect them per process."""
    if group is not None:
        if rank is not None or world_size is not None:
            raise ValueError("pass either group= or rank=/world_size=, not both")
        rank, world_size = group_split(group)
    elif rank is None and world_size is None:
        return None
    elif rank is None or world_size is None:
        raise ValueError("rank= and world_size= go together: pass both, or neither")
    rank = parse_int(rank, "rank")
    world_size = parse_int(world_size, "world_size", minimum=1)
    if rank >= world_size:
        raise ValueError(f"rank={rank} must be smaller than world_size={world_size}")
    return rank, world_size


def in_dataloader_worker() -> bool:
    """Whether this process is a torch DataLoader worker (never without torch imported:
    asking does not import it)."""
    data = sys.modules.get("torch.utils.data")
    return data is not None and data.get_worker_info() is not None


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


def current_consumer(
    split_by_node: bool, split_by_worker: bool, node: tuple[int, int] | None = None
) -> Consumer:
    """The consumer this process/thread is, given which splits are enabled and the
    (rank, world size) chosen explicitly, if any."""
    if node is not None:
        rank, world_size = node
    else:
        rank, world_size = node_split() if split_by_node else (0, 1)
    worker, num_workers = worker_split() if split_by_worker else (0, 1)
    return Consumer(rank, world_size, worker, num_workers)
