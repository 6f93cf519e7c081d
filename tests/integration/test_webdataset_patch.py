"""Real webdataset 1.0.2 pipelines on every remote backend, through patch_webdataset: the
samples equal those of the local copy, a second epoch comes from the cache, and a shard
that breaks mid-body is resumed by the layer (webdataset's curl opener would fail)."""

from __future__ import annotations

import fsspec
import pytest

import fsspec_shards
from tests import webdataset_state
from tests.integration.fault_proxy import Cut
from tests.shardmaker import shard_tar

wds = pytest.importorskip("webdataset")


@pytest.fixture
def restored_webdataset():
    yield from webdataset_state.restored()


SHARDS = [shard_tar(shard, samples=4, payload_size=2000) for shard in range(2)]


def _keys_and_text(pipeline) -> list[tuple[str, bytes]]:
    return [(sample["__key__"], sample["txt"]) for sample in pipeline]


def _options(backend, cache_dir) -> dict:
    return {
        "wds": {"cache_dir": str(cache_dir), "backoff": 0.01},
        backend.protocol: backend.storage_options,
    }


def _put_shards(backend) -> list[str]:
    return [backend.put(f"train-{shard:04d}.tar", data) for shard, data in enumerate(SHARDS)]


def _local_samples(tmp_path) -> list[tuple[str, bytes]]:
    paths = []
    for shard, data in enumerate(SHARDS):
        path = tmp_path / f"local-{shard}.tar"
        path.write_bytes(data)
        paths.append(str(path))
    return _keys_and_text(wds.WebDataset(paths, shardshuffle=False, empty_check=False))


def test_webdataset_reads_every_backend_through_the_layer(
    remote_backend, tmp_path, restored_webdataset
):
    urls = _put_shards(remote_backend)
    cache_dir = tmp_path / "cache"
    fsspec_shards.patch_webdataset(_options(remote_backend, cache_dir))
    expected = _local_samples(tmp_path)
    first = _keys_and_text(wds.WebDataset(urls, shardshuffle=False, empty_check=False))
    assert first == expected
    fs = fsspec.filesystem("wds", target_protocol="file", cache_dir=str(cache_dir))
    downloaded = fs.cache_stats()["bytes_downloaded"]
    assert downloaded == sum(map(len, SHARDS))
    # the other way in: a DataPipeline whose tar stage opens through gopen
    pipeline = wds.DataPipeline(wds.SimpleShardList(urls), wds.tarfile_to_samples())
    assert _keys_and_text(pipeline) == expected
    assert fs.cache_stats()["bytes_downloaded"] == downloaded  # the second epoch: the cache


def test_a_shard_cut_mid_body_is_resumed_not_failed(
    s3_backend, fault_proxy, tmp_path, restored_webdataset
):
    proxy, proxied = fault_proxy(s3_backend)
    urls = _put_shards(s3_backend)
    proxy.add(Cut(after_bytes=3000), method="GET", times=1)
    fsspec_shards.patch_webdataset(_options(proxied, tmp_path / "cache"))
    samples = _keys_and_text(wds.WebDataset(urls, shardshuffle=False, empty_check=False))
    assert samples == _local_samples(tmp_path)
    stats = fsspec.filesystem("wds", target_protocol="file", cache_dir=str(tmp_path / "cache"))
    assert stats.cache_stats()["retries"] >= 1
