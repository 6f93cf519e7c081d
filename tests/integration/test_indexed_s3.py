"""IndexedShardDataset over ``wds::s3://`` (moto): the writer's index found beside the shards,
each shard downloaded once (whole and verified) however its samples are read, and
``ranged_reads="direct"`` reading just a sample's bytes."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from fsspec_shards import IndexedShardDataset, ShardDataset, ShardWriter

SHARDS = 4
PER_SHARD = 8
PAYLOAD = 16 * 1024


def without_url(sample: dict) -> dict:
    return {key: value for key, value in sample.items() if key != "__url__"}


def write(backend, suffix: str, **options) -> list[str]:
    """Shards written by ShardWriter to the bucket through ``wds::``; their ``wds::`` URLs."""
    pattern = "wds::" + backend.url(f"train-%03d.{suffix}")
    storage = {"s3": backend.storage_options, "wds": {"cache": False}}
    with ShardWriter(pattern, max_count=PER_SHARD, storage_options=storage, **options) as out:
        for number in range(SHARDS * PER_SHARD):
            payload = random.Random(number).randbytes(PAYLOAD)
            out.write({"__key__": f"k{number:03d}", "bin": payload, "cls": number % 7})
    return ["wds::" + backend.url(f"train-{shard:03d}.{suffix}") for shard in range(SHARDS)]


@pytest.mark.parametrize("suffix", ["tar", "tar.zst"])
def test_random_reads_over_s3_download_each_shard_once_and_equal_the_stream(
    s3_backend, fault_proxy, tmp_path, suffix
):
    write(s3_backend, suffix)
    proxy, proxied = fault_proxy(s3_backend)
    urls = ["wds::" + proxied.url(f"train-{shard:03d}.{suffix}") for shard in range(SHARDS)]
    stream_options = {"s3": proxied.storage_options, "wds": {"cache_dir": str(tmp_path / "a")}}
    expected = [without_url(s) for s in ShardDataset(urls, stream_options, shuffle_shards=False)]
    options = {"s3": proxied.storage_options, "wds": {"cache_dir": str(tmp_path / "b")}}
    dataset = IndexedShardDataset(urls, options)
    assert len(dataset) == SHARDS * PER_SHARD
    index_gets = proxy.requests("GET", "/" + s3_backend.url("sample-index.json").split("://")[1])
    assert len(index_gets) == 1  # found beside the shards: no shard read to index them
    before = proxy.bytes_sent()
    order = list(range(len(dataset)))
    random.Random(5).shuffle(order)
    for number in order:
        assert without_url(dataset[number]) == expected[number]
    cold = proxy.bytes_sent() - before
    total = sum(s3_backend.filesystem().size(url.split("::")[1]) for url in urls)
    assert total <= cold < 1.2 * total  # every shard once, whole
    for number in reversed(order):
        assert without_url(dataset[number]) == expected[number]
    assert proxy.bytes_sent() - before == cold  # warm: nothing more from the backend
    stats = dataset.reader.locate(urls[0])[0].cache_stats()
    assert stats["cached_files"] >= SHARDS and stats["integrity_failures"] == 0


def test_direct_ranged_reads_fetch_just_the_sample(s3_backend, fault_proxy, tmp_path):
    write(s3_backend, "tar")
    proxy, proxied = fault_proxy(s3_backend)
    urls = ["wds::" + proxied.url(f"train-{shard:03d}.tar") for shard in range(SHARDS)]
    wds = {"cache_dir": str(tmp_path / "c"), "ranged_reads": "direct"}
    dataset = IndexedShardDataset(urls, {"s3": proxied.storage_options, "wds": wds})
    before = proxy.bytes_sent()
    sample = dataset[PER_SHARD + 3]
    assert sample["__key__"] == f"k{PER_SHARD + 3:03d}"
    assert sample["bin"] == random.Random(PER_SHARD + 3).randbytes(PAYLOAD)
    assert proxy.bytes_sent() - before < 2 * PAYLOAD


def test_without_an_index_beside_them_shards_are_indexed_from_their_headers(s3_backend, tmp_path):
    urls = write(s3_backend, "tar.gz", index=None)
    assert not s3_backend.filesystem().exists(s3_backend.url("sample-index.json"))
    options = {"s3": s3_backend.storage_options, "wds": {"cache_dir": str(tmp_path / "c")}}
    dataset = IndexedShardDataset(urls, options)
    assert len(dataset) == SHARDS * PER_SHARD
    assert [dataset[n]["__key__"] for n in (31, 0, 9)] == ["k031", "k000", "k009"]


PAGE = Path(__file__).resolve().parents[2] / "docs" / "random-access.md"
BLOCKS = re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.S)


def test_the_examples_of_the_random_access_page_run_against_s3(s3_backend, tmp_path):
    pytest.importorskip("torchdata.stateful_dataloader")
    options = {"s3": s3_backend.storage_options, "wds": {"cache_dir": str(tmp_path / "c")}}
    namespace = {"root": "wds::" + s3_backend.url("shards"), "storage_options": options}
    for number, block in enumerate(BLOCKS):
        exec(compile(block, f"{PAGE}:block{number}", "exec"), namespace)
    assert len(BLOCKS) == 4
    whole = [s["__key__"] for batch in namespace["make_loader"]() for s in batch]
    resumed = [s["__key__"] for batch in namespace["head"] + namespace["tail"] for s in batch]
    assert resumed == whole and sorted(whole) == [f"sample{i:05d}" for i in range(250)]
