"""patch_webdataset: webdataset's pipelines read through the wds layer (local files here;
tests/integration/test_webdataset_patch.py does every remote backend)."""

from __future__ import annotations

import subprocess
import sys

import fsspec
import pytest

import fsspec_shards
from tests import webdataset_state
from tests.shardmaker import write_shards

wds = pytest.importorskip("webdataset")


@pytest.fixture
def restored_webdataset():
    yield from webdataset_state.restored()


def _shards(directory, shards: int, samples: int) -> list[str]:
    directory.mkdir()
    return write_shards(directory, shards=shards, samples=samples)


def _samples(urls: list[str]) -> list[tuple[str, bytes]]:
    pipeline = wds.WebDataset(urls, shardshuffle=False, empty_check=False)
    return [(sample["__key__"], sample["txt"]) for sample in pipeline]


def test_file_urls_read_through_the_layer_and_its_cache(tmp_path, restored_webdataset):
    paths = _shards(tmp_path / "shards", 2, 3)
    expected = _samples(paths)  # bare paths: webdataset's own open, left as it is
    cache_dir = tmp_path / "cache"
    fsspec_shards.patch_webdataset({"wds": {"cache_dir": str(cache_dir)}})
    assert _samples([f"file://{path}" for path in paths]) == expected
    stats = fsspec.filesystem("wds", target_protocol="file", cache_dir=str(cache_dir)).cache_stats()
    assert stats["cached_files"] == 2


def test_patching_twice_replaces_the_options_and_wraps_once(tmp_path, restored_webdataset):
    module = restored_webdataset
    original = module.gopen
    fsspec_shards.patch_webdataset({"cache_dir": str(tmp_path / "first")})  # flat: the layer's
    wrapped = module.gopen
    fsspec_shards.patch_webdataset({"wds": {"cache_dir": str(tmp_path / "second")}})
    assert module.gopen is wrapped and module.gopen.__wrapped__ is original
    assert wds.gopen is wrapped
    [path] = _shards(tmp_path / "shards", 1, 2)
    assert len(_samples([f"file://{path}"])) == 2
    assert (tmp_path / "second").is_dir() and not (tmp_path / "first").exists()


def test_the_schemes_of_every_backend_are_routed(restored_webdataset):
    fsspec_shards.patch_webdataset()
    table = restored_webdataset.gopen_schemes
    handlers = {table[scheme] for scheme in ("s3", "gs", "gcs", "az", "abfs", "http", "https")}
    assert len(handlers) == 1 and handlers != {table["__default__"]}
    assert table["pipe"].__module__ == "webdataset.gopen"  # what is not storage stays


def test_importing_the_package_leaves_webdataset_alone():
    code = (
        "import importlib, fsspec_shards, fsspec_shards.webdataset_patch; "
        "g = importlib.import_module('webdataset.gopen'); "
        "print(g.gopen_schemes['s3'] if 's3' in g.gopen_schemes else 'none', "
        "hasattr(g.gopen, '__fsspec_shards_original__'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["none", "False"]
