"""Real webdataset 1.0.2 pipelines on every remote backend, through patch_webdataset: the
samples equal those of the local copy, a second epoch comes from the cache, and a shard
that breaks mid-body is resumed by the layer (webdataset's curl opener would fail)."""

from __future__ import annotations

import json
import posixpath
import warnings

import fsspec
import pytest

import fsspec_shards
from tests import webdataset_state
from tests.cli.running import run_cli
from tests.faults import Cut
from tests.shardmaker import shard_tar

wds = pytest.importorskip("webdataset")


@pytest.fixture
def restored_webdataset():
    yield from webdataset_state.restored()


SHARDS = [shard_tar(shard, samples=4, payload_size=2000) for shard in range(2)]


def _dataset(urls):
    """``WebDataset`` in order, on either series (0.2.x has no ``empty_check``)."""
    if wds.__version__.startswith("0."):
        return wds.WebDataset(urls)
    return wds.WebDataset(urls, shardshuffle=False, empty_check=False)


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
    return _keys_and_text(_dataset(paths))


def test_webdataset_reads_every_backend_through_the_layer(
    remote_backend, tmp_path, restored_webdataset
):
    urls = _put_shards(remote_backend)
    cache_dir = tmp_path / "cache"
    fsspec_shards.patch_webdataset(_options(remote_backend, cache_dir))
    expected = _local_samples(tmp_path)
    first = _keys_and_text(_dataset(urls))
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
    samples = _keys_and_text(_dataset(urls))
    assert samples == _local_samples(tmp_path)
    stats = fsspec.filesystem("wds", target_protocol="file", cache_dir=str(tmp_path / "cache"))
    assert stats.cache_stats()["retries"] >= 1


PIPES = {
    "s3": ("pipe:aws s3 cp {url} -", "pipe:aws s3 cp URL -"),
    "gcs": ("pipe:gsutil cat {url}", "pipe:gsutil cat URL"),
    "http": ("pipe:curl -s -L {url}", "pipe:curl ... URL"),
}


@pytest.mark.parametrize("protocol", sorted(PIPES))
def test_pipe_commands_read_through_the_layer_with_one_warning_per_form(
    request, protocol, tmp_path, restored_webdataset
):
    backend = request.getfixturevalue(f"{protocol}_backend")
    command, form = PIPES[protocol]
    urls = [url.replace("gcs://", "gs://") for url in _put_shards(backend)]  # gsutil's spelling
    pipes = [command.format(url=url) for url in urls]
    fsspec_shards.patch_webdataset(_options(backend, tmp_path / "cache"), pipe_commands=True)
    with pytest.warns(UserWarning, match=rf"{form!r} URLs are read through the wds layer"):
        samples = _keys_and_text(_dataset(pipes))
    assert samples == _local_samples(tmp_path)
    fs = fsspec.filesystem("wds", target_protocol="file", cache_dir=str(tmp_path / "cache"))
    assert fs.cache_stats()["bytes_downloaded"] == sum(map(len, SHARDS))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per form: the second epoch warns no more
        assert _keys_and_text(_dataset(pipes))


def test_openclip_sizes_json_and_its_pipe_urls(s3_backend, tmp_path, restored_webdataset):
    """What docs/migrating-from-webdataset.md tells OpenCLIP users: ``sizes.json`` written
    by ShardWriter and by ``manifest --sample-counts`` alike, in the shape OpenCLIP's
    ``get_dataset_size`` reads (a count per shard file name), and its ``pipe:aws s3 cp``
    URLs read through the layer, giving what the plain ``s3://`` URLs give."""
    options = _options(s3_backend, tmp_path / "cache")
    root = s3_backend.url("openclip")
    pattern = f"{root}/train-%04d.tar"
    with fsspec_shards.ShardWriter(
        pattern, max_count=3, counts="sizes.json", storage_options=options
    ) as writer:
        for index in range(7):
            writer.write({"__key__": f"k{index:03d}", "txt": f"caption {index}", "jpg": b"\xff"})
    urls = [shard.url for shard in writer.shards]
    options_file = tmp_path / "options.json"
    options_file.write_text(json.dumps({"s3": s3_backend.storage_options}))
    made = run_cli(
        "manifest",
        f"{root}/train-{{0000..0002}}.tar",
        "-o",
        f"{root}/again/SHA256SUMS",
        "--sample-counts",
        f"{root}/again/sizes.json",
        "--options-file",
        str(options_file),
        cache=tmp_path / "cli-cache",
    )
    assert made.returncode == 0, made.stderr
    store = s3_backend.filesystem()
    written = json.loads(store.cat_file(f"{root}/sizes.json"))
    assert json.loads(store.cat_file(f"{root}/again/sizes.json")) == written
    assert sum(written[posixpath.basename(url)] for url in urls) == 7  # OpenCLIP's reading

    fsspec_shards.patch_webdataset(options, pipe_commands=True)
    plain = [s["__key__"] for s in _dataset(urls)]
    pipes = [f"pipe:aws s3 cp {url} -" for url in urls]
    with pytest.warns(UserWarning, match="aws s3 cp"):
        piped = [s["__key__"] for s in _dataset(pipes)]
    assert piped == plain == [f"k{index:03d}" for index in range(7)]


@pytest.fixture
def other_webdataset_python(request, tmp_path_factory):
    return webdataset_state.other_version_python(request, tmp_path_factory)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_every_backend_on_webdataset_0_2_86(other_webdataset_python):
    webdataset_state.run_tests(
        other_webdataset_python, ["tests/integration/test_webdataset_patch.py"]
    )
