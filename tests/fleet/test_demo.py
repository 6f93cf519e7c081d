"""The demo dataset maker: reproducible bytes, webdataset-format samples, a valid manifest."""

from __future__ import annotations

import hashlib
import json
import tarfile

from fsspec_shards.checksums import parse_sums_file
from fsspec_shards.fleet.demo import make_demo_dataset


def test_same_arguments_give_the_same_bytes_in_any_directory(tmp_path):
    first = make_demo_dataset(tmp_path / "a", shards=2, samples_per_shard=5, seed=7)
    second = make_demo_dataset(tmp_path / "b", shards=2, samples_per_shard=5, seed=7)
    other_seed = make_demo_dataset(tmp_path / "c", shards=2, samples_per_shard=5, seed=8)
    assert first.manifest.read_text() == second.manifest.read_text()
    assert first.manifest.read_text() != other_seed.manifest.read_text()


def test_manifest_lists_each_shard_with_its_sha256(tmp_path):
    demo = make_demo_dataset(tmp_path, shards=3, samples_per_shard=4)
    entries = parse_sums_file(demo.manifest.read_text())
    assert list(entries) == [path.name for path in demo.shards]
    for name, path in zip(entries, demo.shards, strict=True):
        assert entries[name].hexdigest == hashlib.sha256(path.read_bytes()).hexdigest()


def test_each_sample_is_a_jpg_a_cls_and_a_json_sharing_a_key(tmp_path):
    demo = make_demo_dataset(tmp_path, shards=2, samples_per_shard=3)
    assert demo.pattern == f"{demo.directory}/demo-{{000000..000001}}.tar"
    assert demo.total_samples == 6
    with tarfile.open(demo.shards[1]) as archive:
        members = archive.getmembers()
        names = [member.name for member in members]
        assert names[:3] == ["sample00000003.jpg", "sample00000003.cls", "sample00000003.json"]
        assert len(names) == 9
        image = archive.extractfile(members[0]).read()
        label = int(archive.extractfile(members[1]).read())
        metadata = json.loads(archive.extractfile(members[2]).read())
    assert image.startswith(b"\xff\xd8\xff")
    assert metadata["index"] == 3 and metadata["label"] == label
