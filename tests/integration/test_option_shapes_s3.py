"""Our own APIs take the option shapes people pass, against moto: a plain ``s3://`` URL with
``{"wds": {...}, "s3": {...}}`` reads (and writes) through the layer, an unused backend
section is no error, and a misspelt backend option is named, cached or not."""

from __future__ import annotations

import json

import fsspec
import pytest

from fsspec_shards import MixedDataset, ShardDataset, ShardWriter
from fsspec_shards.errors import OptionError
from tests.cli.running import error_lines, run_cli
from tests.shardmaker import keys, shard_tar


def _options(backend, cache_dir, **s3) -> dict:
    return {
        "wds": {"cache_dir": str(cache_dir), "backoff": 0.01},
        "s3": {**backend.storage_options, **s3},
        "gcs": {"token": "anon"},  # for another dataset: not used here, not an error
    }


def _stats(cache_dir) -> dict:
    return fsspec.filesystem("wds", target_protocol="file", cache_dir=str(cache_dir)).cache_stats()


def _shards(backend, count: int, samples: int = 3, name: str = "train") -> list[str]:
    return [backend.put(f"{name}-{i:04d}.tar", shard_tar(i, samples)) for i in range(count)]


def test_a_plain_s3_url_with_a_wds_section_reads_through_the_layer(s3_backend, tmp_path):
    urls = _shards(s3_backend, 2)
    cache_dir = tmp_path / "cache"
    dataset = ShardDataset(urls, storage_options=_options(s3_backend, cache_dir), prefetch=0)
    assert len(list(dataset)) == 6
    assert _stats(cache_dir)["cached_files"] == 2
    again = list(ShardDataset(urls, storage_options=_options(s3_backend, cache_dir), prefetch=0))
    assert _stats(cache_dir)["bytes_downloaded"] == sum(len(shard_tar(i, 3)) for i in range(2))
    assert len(again) == 6


def test_a_plain_s3_url_without_a_wds_section_reads_straight_from_s3(s3_backend, tmp_path):
    urls = _shards(s3_backend, 1)
    options = {"s3": s3_backend.storage_options, "gcs": {"token": "anon"}}
    assert len(list(ShardDataset(urls, storage_options=options, prefetch=0))) == 3


def test_mixed_datasets_of_plain_urls_read_through_the_layer(s3_backend, tmp_path):
    first, second = _shards(s3_backend, 1, name="a"), _shards(s3_backend, 1, name="b")
    options = _options(s3_backend, tmp_path / "cache")
    mix = MixedDataset(
        [ShardDataset(urls, storage_options=options) for urls in (first, second)],
        weights=[0.5, 0.5],
        seed=0,
    )
    assert len(list(mix)) >= 3
    assert _stats(tmp_path / "cache")["cached_files"] >= 1


def test_the_writer_takes_a_plain_url_with_sections(s3_backend, tmp_path):
    pattern = s3_backend.url("out/part-%04d.tar")
    options = _options(s3_backend, tmp_path / "cache")
    with ShardWriter(pattern, max_count=2, storage_options=options) as writer:
        for index in range(3):
            writer.write({"__key__": f"k{index}", "txt": f"t{index}"})
    listing = s3_backend.filesystem().ls(s3_backend.url("out"))
    written = sorted(path.rsplit("/", 1)[-1] for path in listing)
    assert "part-0000.tar" in written and "part-0001.tar" in written
    urls = [pattern % 0, pattern % 1]
    dataset = ShardDataset(urls, storage_options=options, shuffle_shards=False)
    assert keys(dataset) == ["k0", "k1", "k2"]


def test_a_misspelt_backend_option_is_named_also_when_every_shard_is_cached(s3_backend, tmp_path):
    urls = _shards(s3_backend, 1)
    cache_dir = tmp_path / "cache"
    assert len(list(ShardDataset(urls, storage_options=_options(s3_backend, cache_dir)))) == 3
    assert _stats(cache_dir)["cached_files"] == 1
    bad = _options(s3_backend, cache_dir, endpoint_urll="http://127.0.0.1:9")
    with pytest.raises(OptionError, match=r"s3\.endpoint_urll.*did you mean 'endpoint_url'"):
        list(ShardDataset(urls, storage_options=bad))


def test_the_cli_reads_a_plain_url_with_an_options_file_of_sections(s3_backend, tmp_path):
    urls = _shards(s3_backend, 2)
    options = tmp_path / "options.json"
    options.write_text(json.dumps(_options(s3_backend, tmp_path / "cache")))
    pattern = urls[0].replace("0000", "{0000..0001}")
    result = run_cli("stream", pattern, "--options-file", str(options), cache=tmp_path / "c2")
    assert result.returncode == 0, result.stderr
    assert _stats(tmp_path / "cache")["cached_files"] == 2
    bad = _options(s3_backend, tmp_path / "cache", endpoint_urll="http://127.0.0.1:9")
    options.write_text(json.dumps(bad))
    result = run_cli("stream", pattern, "--options-file", str(options), cache=tmp_path / "c2")
    assert result.returncode == 2
    [line] = error_lines(result)
    assert "invalid storage option s3.endpoint_urll" in line
