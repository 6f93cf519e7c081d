"""ShardDataset over ``wds::s3://`` without a cache: resuming seeks, counted at the proxy."""

from __future__ import annotations

import json
import os
import subprocess
import sys

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


COLD_PROCESS = """
import json, sys
from torch.utils.data import DataLoader, IterableDataset
import fsspec
from fsspec_shards import ShardDataset
from fsspec_shards.iteration.reader import ShardReader

urls, options = json.loads(sys.argv[1]), json.loads(sys.argv[2])
HEAVY = {"s3fs", "aiobotocore", "aiohttp", "botocore"}
dataset = ShardDataset(urls, storage_options=options)


class Report(IterableDataset):
    def __iter__(self):
        keys = [sample["__key__"] for sample in dataset]
        yield keys, sorted(HEAVY & set(sys.modules))


workers = list(DataLoader(Report(), num_workers=2, batch_size=None))  # obstore unused: fork
main_keys = [sample["__key__"] for sample in dataset]
report = {"main": main_keys, "main_heavy": sorted(HEAVY & set(sys.modules)), "workers": workers}
fs, path = ShardReader(options).locate(urls[0])  # before s3fs: the stand-in's naming
expected = fsspec.core.url_to_fs(urls[0], **options)
report["same_as_url_to_fs"] = fs is expected[0] and path == expected[1]
print(json.dumps(report))
"""


def test_a_cold_read_through_obstore_imports_no_s3fs_in_the_process_nor_its_workers(
    s3_backend, tmp_path
):
    """s3fs's import (aiobotocore, aiohttp: 0.3-0.7 s) is no part of a cold first batch when
    downloads go through obstore: the URL is resolved, the object stat-ed (a HEAD) and read
    through obstore, in the main process and in DataLoader workers. Nor is botocore's
    (0.07-0.12 s) where keys are given and no profile nor config file makes botocore's
    answer differ from the environment's."""
    pytest.importorskip("obstore")
    pytest.importorskip("torch")
    urls = [f"wds::{s3_backend.put(f'shard-{n}.tar', shard_tar(n, 3, 1024))}" for n in range(2)]
    options = {
        "wds": {"cache_dir": str(tmp_path / "cache"), "transport": "obstore"},
        "s3": s3_backend.storage_options,
    }
    profiles = ("AWS_PROFILE", "AWS_DEFAULT_PROFILE")
    env = {name: value for name, value in os.environ.items() if name not in profiles}
    env["AWS_CONFIG_FILE"] = env["AWS_SHARED_CREDENTIALS_FILE"] = str(tmp_path / "none")
    result = subprocess.run(
        [sys.executable, "-c", COLD_PROCESS, json.dumps(urls), json.dumps(options)],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert len(report["main"]) == 6
    assert report["main_heavy"] == []
    assert sorted(key for keys, _ in report["workers"] for key in keys) == sorted(report["main"])
    assert [heavy for _, heavy in report["workers"]] == [[], []]
    assert report["same_as_url_to_fs"]
