"""ShardWriter to object stores: S3 (moto) in depth (whole uploads, a failed upload, verify,
counts for even epochs), and round trips on the GCS and Azure emulators."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy
import pytest

from fsspec_shards import ShardDataset, ShardWriter
from fsspec_shards.iteration.encoding import encode_sample
from tests.faults import Status

TIMEOUT = 180
SAMPLES = 23
PER_SHARD = 10


def make_sample(index: int) -> dict:
    return {
        "__key__": f"s{index:04d}",
        "jpg": bytes([index]) * (500 + index),
        "cls": index % 5,
        "json": {"i": index},
        "npy": numpy.full(3, index, dtype=numpy.int32),
    }


def encoded(index: int) -> dict:
    key, members = encode_sample(make_sample(index))
    return {"__key__": key, **{name[len(key) + 1 :]: data for name, data in members}}


def without_url(samples) -> list[dict]:
    return [{k: v for k, v in sample.items() if k != "__url__"} for sample in samples]


@pytest.mark.parametrize("through_wds", [False, True], ids=["s3", "wds::s3"])
def test_shards_written_to_s3_read_back_exactly_and_appear_only_whole(
    s3_backend, tmp_path, through_wds
):
    plain = s3_backend.url("train-%06d.tar")
    if through_wds:
        pattern = f"wds::{plain}"
        options = {"s3": s3_backend.storage_options, "wds": {"cache_dir": str(tmp_path / "c")}}
    else:
        pattern, options = plain, s3_backend.storage_options
    s3 = s3_backend.filesystem()
    with ShardWriter(pattern, max_count=PER_SHARD, storage_options=options) as writer:
        for index in range(SAMPLES):
            writer.write(make_sample(index))
            if index == PER_SHARD + 3:
                assert s3.exists(plain % 0) and not s3.exists(plain % 1)
    assert sorted(path.rsplit("/", 1)[-1] for path in s3.ls(s3_backend.url())) == [
        "SHA256SUMS",
        "SHA256SUMS.blocks",
        "sample-counts.json",
        "sample-index.json",
        "train-000000.tar",
        "train-000001.tar",
        "train-000002.tar",
    ]
    read_options = {"s3": s3_backend.storage_options, "wds": {"cache_dir": str(tmp_path / "r")}}
    dataset = ShardDataset(
        "wds::" + s3_backend.url("train-{000000..000002}.tar"),
        storage_options=read_options,
        shuffle_shards=False,
    )
    assert without_url(dataset) == [encoded(index) for index in range(SAMPLES)]
    counts = json.loads(s3.cat_file(s3_backend.url("sample-counts.json")))
    assert counts == {"train-000000.tar": 10, "train-000001.tar": 10, "train-000002.tar": 3}


def test_a_failed_upload_leaves_no_object_no_spool_and_no_manifest(
    s3_backend, fault_proxy, tmp_path
):
    proxy, proxied = fault_proxy(s3_backend)
    proxy.add(Status(403), method="PUT", path="train-000001.tar", times=None)
    spool = tmp_path / "spool"
    spool.mkdir()
    writer = ShardWriter(
        proxied.url("train-%06d.tar"),
        max_count=PER_SHARD,
        storage_options=proxied.storage_options,
        spool_dir=str(spool),
    )
    with pytest.raises(PermissionError), writer:
        for index in range(SAMPLES):
            writer.write(make_sample(index))
    s3 = s3_backend.filesystem()
    assert [path.rsplit("/", 1)[-1] for path in s3.ls(s3_backend.url())] == ["train-000000.tar"]
    assert list(spool.iterdir()) == []
    assert [shard.name for shard in writer.shards] == ["train-000000.tar"]


def test_the_s3_manifest_passes_verify_and_counts_give_even_epochs(
    s3_backend, tmp_path, monkeypatch
):
    options = {"s3": s3_backend.storage_options, "wds": {"cache_dir": str(tmp_path / "c")}}
    pattern = "wds::" + s3_backend.url("train-%06d.tar")
    with ShardWriter(pattern, max_count=4, storage_options=options) as writer:
        for index in range(SAMPLES):
            writer.write(make_sample(index))
    options_file = tmp_path / "options.json"
    options_file.write_text(json.dumps({"s3": s3_backend.storage_options}))
    pattern = s3_backend.url("train-{000000..000005}.tar")
    result = subprocess.run(
        [sys.executable, "-m", "fsspec_shards", "verify", pattern]
        + ["--manifest", writer.manifest_url, "--options-file", str(options_file)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env=dict(os.environ, FSSPEC_SHARDS_CACHE=str(tmp_path / "cache")),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"6 ok, 0 bad ({SAMPLES} samples" in result.stdout

    lengths, seen = [], set()
    for rank in range(4):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "4")
        dataset = ShardDataset(
            "wds::" + pattern,
            storage_options=options,
            samples_per_shard=writer.counts_url,
            equalize="pad",
        )
        keys = [sample["__key__"] for sample in dataset]
        lengths.append(len(keys))
        seen.update(keys)
    assert len(set(lengths)) == 1
    assert seen == {f"s{index:04d}" for index in range(SAMPLES)}


@pytest.mark.parametrize("protocol", ["gcs", "az"])
def test_shards_round_trip_on_the_other_object_stores(request, protocol, tmp_path):
    backend = request.getfixturevalue(f"{protocol}_backend")
    options = {protocol: backend.storage_options, "wds": {"cache_dir": str(tmp_path / "c")}}
    with ShardWriter(
        f"wds::{backend.url('train-%06d.tar')}", max_count=PER_SHARD, storage_options=options
    ) as writer:
        for index in range(SAMPLES):
            writer.write(make_sample(index))
    dataset = ShardDataset(
        "wds::" + backend.url("train-{000000..000002}.tar"),
        storage_options=options,
        shuffle_shards=False,
    )
    assert without_url(dataset) == [encoded(index) for index in range(SAMPLES)]
    listed = backend.filesystem().ls(backend.url())
    assert sorted(path.rsplit("/", 1)[-1] for path in listed) == [
        "SHA256SUMS",
        "SHA256SUMS.blocks",
        "sample-counts.json",
        "sample-index.json",
        "train-000000.tar",
        "train-000001.tar",
        "train-000002.tar",
    ]


MANIFESTS = ["SHA256SUMS", "SHA256SUMS.blocks", "sample-counts.json", "sample-index.json"]


def names_in(s3_backend) -> list[str]:
    return sorted(path.rsplit("/", 1)[-1] for path in s3_backend.filesystem().ls(s3_backend.url()))


def test_an_aborted_run_over_earlier_shards_leaves_no_manifest_on_s3(s3_backend):
    pattern, options = s3_backend.url("train-%06d.tar"), s3_backend.storage_options
    with ShardWriter(pattern, max_count=PER_SHARD, storage_options=options) as writer:
        for index in range(SAMPLES):
            writer.write(make_sample(index))
    assert set(MANIFESTS) <= set(names_in(s3_backend))
    with (
        pytest.raises(RuntimeError, match="stop"),
        ShardWriter(pattern, max_count=PER_SHARD, storage_options=options) as writer,
    ):
        for index in range(15):
            writer.write(make_sample(index))
        raise RuntimeError("stop")
    assert names_in(s3_backend) == ["train-000000.tar", "train-000001.tar", "train-000002.tar"]


KILLED_UPLOADER = """
import json, sys, time
from pathlib import Path
from fsspec_shards import ShardWriter

pattern, options, spool, ready = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], sys.argv[4]
writer = ShardWriter(pattern, max_count=50, storage_options=options, spool_dir=spool)
for index in range(120):
    writer.write({"__key__": f"s{index:04d}", "bin": bytes(2000)})
    if index == 75:
        Path(ready).write_text("mid-shard")
        time.sleep(600)
"""


def test_the_spool_of_a_killed_uploader_is_removed_by_the_next_writer(s3_backend, tmp_path):
    import signal
    import time

    spool, ready = tmp_path / "spool", tmp_path / "ready"
    spool.mkdir()
    options = s3_backend.storage_options
    arguments = [s3_backend.url("k-%03d.tar"), json.dumps(options), str(spool), str(ready)]
    process = subprocess.Popen([sys.executable, "-c", KILLED_UPLOADER, *arguments])
    try:
        deadline = time.monotonic() + TIMEOUT
        while not ready.exists():
            assert process.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait(TIMEOUT)
    assert [path.name[:10] for path in spool.glob("*/*/*")] == ["k-001.tar."]
    with ShardWriter(
        s3_backend.url("n-%03d.tar"), storage_options=options, spool_dir=str(spool)
    ) as writer:
        assert list(spool.glob("*/*/*")) == []
        writer.write({"__key__": "n", "txt": "n"})
    assert list(spool.iterdir()) == []
    assert "k-000.tar" in names_in(s3_backend) and "k-001.tar" not in names_in(s3_backend)
