"""ShardDataset over ``wds::s3://`` without a cache: resuming seeks, counted at the proxy."""

from __future__ import annotations

import json

import pytest

from fsspec_shards import ShardDataset
from tests.shardmaker import shard_tar

SHARDS = 10
SAMPLES = 20
PAYLOAD = 64 * 1024


@pytest.mark.parametrize("shuffle_buffer", [0, 10])
def test_resume_at_85_percent_over_s3_reads_under_10_percent(
    s3_backend, fault_proxy, shuffle_buffer
):
    total_bytes = 0
    for shard in range(SHARDS):
        data = shard_tar(shard, SAMPLES, PAYLOAD)
        total_bytes += len(data)
        s3_backend.put(f"shard-{shard:02d}.tar", data)
    proxy, proxied = fault_proxy(s3_backend)
    args = dict(
        urls=[f"wds::{proxied.url(f'shard-{shard:02d}.tar')}" for shard in range(SHARDS)],
        storage_options={"wds": {"cache": False}, "s3": proxied.storage_options},
        shuffle_buffer=shuffle_buffer,
        seed=7,
    )
    expected = [sample["__key__"] for sample in ShardDataset(**args)]
    assert len(expected) == SHARDS * SAMPLES

    cut = int(0.85 * len(expected))
    dataset = ShardDataset(**args)
    iterator = iter(dataset)
    head = [next(iterator)["__key__"] for _ in range(cut)]
    state = json.loads(json.dumps(dataset.state_dict()))
    iterator.close()

    before = proxy.bytes_sent()
    resumed = ShardDataset(**args)
    resumed.load_state_dict(state)
    tail_iterator = iter(resumed)
    tail = [next(tail_iterator)["__key__"]]
    to_first_sample = proxy.bytes_sent() - before
    tail += [sample["__key__"] for sample in tail_iterator]
    for_the_rest = proxy.bytes_sent() - before

    assert head + tail == expected
    assert to_first_sample < 0.10 * total_bytes, (to_first_sample, total_bytes)
    assert for_the_rest < 0.25 * total_bytes, (for_the_rest, total_bytes)


def test_a_plain_s3_counts_url_is_read_with_the_datasets_per_protocol_options(s3_backend, tmp_path):
    counts = {}
    for shard in range(3):
        s3_backend.put(f"shard-{shard:02d}.tar", shard_tar(shard, 2 + shard, 1024))
        counts[f"shard-{shard:02d}.tar"] = 2 + shard
    sidecar = s3_backend.put("counts.json", json.dumps(counts).encode())
    dataset = ShardDataset(
        [f"wds::{s3_backend.url(f'shard-{shard:02d}.tar')}" for shard in range(3)],
        storage_options={"wds": {"cache_dir": str(tmp_path)}, "s3": s3_backend.storage_options},
        samples_per_shard=sidecar,
    )
    assert len(dataset) == sum(counts.values())
    assert len(list(dataset)) == sum(counts.values())
