"""ShardDataset under a real torch.distributed job: four processes on loopback (gloo), a
2 (data parallel) x 2 (tensor parallel) DeviceMesh, and the process group detected alone."""

from __future__ import annotations

import json
import multiprocessing
import socket
from collections import Counter
from pathlib import Path

import pytest

from tests.shardmaker import write_shards

torch_distributed = pytest.importorskip("torch.distributed")
pytest.importorskip("torch.distributed.device_mesh")

WORLD_SIZE = 4
COUNTS = [3, 7, 2, 5, 4, 6]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rank_main(rank: int, port: int, urls: list[str], counts: dict, out: str) -> None:
    """One rank: read an epoch with the dp dimension of the mesh as the group, and one with
    the group detected from torch.distributed; write the keys."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from fsspec_shards import ShardDataset

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD_SIZE
    )
    try:
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        by_mesh = ShardDataset(urls, shuffle_buffer=3, seed=5, group=mesh["dp"])
        detected = ShardDataset(urls, shuffle_buffer=3, seed=5, samples_per_shard=counts)
        result = {
            "mesh": [sample["__key__"] for sample in by_mesh],
            "detected": [sample["__key__"] for sample in detected],
            "detected_len": len(detected),
        }
        Path(out).write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


def test_mesh_peers_read_the_same_data_and_detected_ranks_split_it(tmp_path):
    urls = write_shards(tmp_path, len(COUNTS), COUNTS)
    counts = {url: n for url, n in zip(urls, COUNTS, strict=True)}
    port = free_port()
    context = multiprocessing.get_context("fork")
    outputs = [str(tmp_path / f"rank{rank}.json") for rank in range(WORLD_SIZE)]
    processes = [
        context.Process(target=rank_main, args=(rank, port, urls, counts, outputs[rank]))
        for rank in range(WORLD_SIZE)
    ]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=600)
    assert [process.exitcode for process in processes] == [0] * WORLD_SIZE
    results = [json.loads(Path(out).read_text()) for out in outputs]
    everything = Counter(
        f"s{shard:04d}_{i:05d}" for shard, n in enumerate(COUNTS) for i in range(n)
    )

    # Global ranks 0, 1 hold data-parallel index 0; ranks 2, 3 index 1.
    assert results[0]["mesh"] == results[1]["mesh"] and results[2]["mesh"] == results[3]["mesh"]
    assert Counter(results[0]["mesh"] + results[2]["mesh"]) == everything

    detected = [result["detected"] for result in results]
    assert {len(part) for part in detected} == {results[0]["detected_len"]}
    assert set().union(*detected) == set(everything)
