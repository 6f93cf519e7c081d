"""The manifest chore: the bytes of a sha256sum manifest, and none with holes."""

from __future__ import annotations

import json
import shutil

import pytest

from fsspec_shards.fleet.errors import InputError, ShardsFailed
from fsspec_shards.fleet.executors import ThreadExecutor
from fsspec_shards.fleet.manifest import (
    build_manifest,
    count_keys,
    make_manifest,
    manifest_location,
    manifest_name,
)
from fsspec_shards.fleet.shards import shard_urls
from tests.fleet.conftest import streaming


def test_the_manifest_has_the_bytes_the_demo_writer_wrote(dataset):
    urls = shard_urls(dataset.pattern, {})
    output = str(dataset.directory / "SHA256SUMS.fleet")
    made = build_manifest(urls, output, streaming(), ThreadExecutor(3))
    assert made.text == dataset.manifest.read_text()
    assert made.counts == {path.name: 30 for path in dataset.shards}


def test_make_manifest_writes_the_manifest_and_the_counts_sidecar(dataset, tmp_path):
    urls = shard_urls(dataset.pattern, {})
    output, counts = tmp_path / "SHA256SUMS", tmp_path / "counts.json"
    made = make_manifest(
        urls, str(output), streaming(), ThreadExecutor(2), sample_counts=str(counts)
    )
    assert output.read_text() == made.text
    assert json.loads(counts.read_text()) == made.counts
    assert str(dataset.shards[0]) in made.text, "shards outside its directory: full paths"


def test_a_shard_that_cannot_be_read_writes_no_manifest(dataset, tmp_path):
    copy = tmp_path / "copy"
    copy.mkdir()
    for path in dataset.shards:
        shutil.copy(path, copy / path.name)
    urls = shard_urls(f"{copy}/demo-*.tar", {})
    (copy / dataset.shards[2].name).unlink()
    output = copy / "SHA256SUMS"
    with pytest.raises(ShardsFailed, match="1 shards could not be read") as raised:
        make_manifest(urls, str(output), streaming(), ThreadExecutor(2))
    assert raised.value.failures == [
        (str(copy / dataset.shards[2].name), raised.value.failures[0][1])
    ]
    assert raised.value.failures[0][1].startswith("not found")
    assert not output.exists()


def test_a_name_sha256sum_cannot_hold_is_an_input_error(dataset, tmp_path):
    odd = tmp_path / "new\nline.tar"
    shutil.copy(dataset.shards[0], odd)
    with pytest.raises(InputError, match="sha256sum format"):
        build_manifest(
            shard_urls(str(odd), {}), str(tmp_path / "S"), streaming(), ThreadExecutor(1)
        )


def test_names_are_relative_below_the_manifest_and_sidecar_keys_are_file_names_when_unique(
    tmp_path, monkeypatch
):
    assert manifest_name("wds::file:///d/sub/a.tar", "/d") == "sub/a.tar"
    assert manifest_name("wds::s3://b/a.tar", "/d") == "s3://b/a.tar"
    assert manifest_name("wds::s3://b/x/a.tar", "s3://b") == "x/a.tar"
    assert count_keys(["x/a.tar", "y/b.tar"]) == ["a.tar", "b.tar"]
    assert count_keys(["x/a.tar", "y/a.tar"]) == ["x/a.tar", "y/a.tar"]
    monkeypatch.chdir(tmp_path)
    assert manifest_location("SUMS") == str(tmp_path / "SUMS")
    assert manifest_location("s3://b/SUMS") == "s3://b/SUMS"
