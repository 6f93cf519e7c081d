"""``fsspec-shards manifest``: a sha256sum-format manifest and the sample-count sidecar."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from fsspec_shards import ShardWriter
from fsspec_shards.checksums import parse_block_manifest, parse_sums_file
from fsspec_shards.iteration.lengths import load_sample_counts, shard_sizes
from tests.cli.running import run_cli


def test_manifest_matches_sha256sum_and_counts_samples(dataset, tmp_path, cache):
    output = dataset.directory / "SHA256SUMS.cli"
    counts = tmp_path / "counts.json"
    result = run_cli(
        "manifest",
        dataset.pattern,
        "-o",
        str(output),
        "--sample-counts",
        str(counts),
        "-q",
        cache=cache,
    )
    assert result.returncode == 0, result.stderr
    assert output.read_text() == dataset.manifest.read_text()
    assert json.loads(counts.read_text()) == {path.name: 30 for path in dataset.shards}
    urls = ["wds::file://" + str(path) for path in dataset.shards]
    assert shard_sizes(urls, load_sample_counts(str(counts))) == [30] * len(urls)
    if shutil.which("sha256sum"):
        check = subprocess.run(
            ["sha256sum", "-c", output.name], cwd=dataset.directory, capture_output=True
        )
        assert check.returncode == 0, check.stdout


def test_manifest_outside_the_shards_directory_names_full_paths(dataset, tmp_path, cache):
    output = tmp_path / "elsewhere" / "SHA256SUMS"
    output.parent.mkdir()
    result = run_cli("manifest", dataset.pattern, "-o", str(output), "-q", cache=cache)
    assert result.returncode == 0, result.stderr
    assert list(parse_sums_file(output.read_text())) == [str(path) for path in dataset.shards]


def _written_shards(directory) -> str:
    """Shards written by ShardWriter with blocks of 4 KiB into ``directory``; their pattern."""
    with ShardWriter(str(directory / "w-%03d.tar"), max_count=5, manifest_block_size=4096) as w:
        for index in range(12):
            w.write({"__key__": f"s{index:04d}", "bin": bytes([index]) * (3000 + 977 * index)})
    return str(directory / "w-{000..002}.tar")


@pytest.mark.parametrize("dask", [False, True], ids=["local", "dask"])
def test_writer_and_manifest_blocks_write_the_same_block_manifest_bytes(tmp_path, cache, dask):
    pattern = _written_shards(tmp_path)
    output = tmp_path / "SHA256SUMS.cli"
    extra = ["--dask", "local:1"] if dask else []
    args = ["manifest", pattern, "-o", str(output), "--blocks", "--block-size", "4KiB", "-q"]
    result = run_cli(*args, *extra, cache=cache)
    assert result.returncode == 0, result.stderr
    assert output.read_bytes() == (tmp_path / "SHA256SUMS").read_bytes()
    written = (tmp_path / "SHA256SUMS.blocks").read_bytes()
    assert (tmp_path / "SHA256SUMS.cli.blocks").read_bytes() == written
    assert len(parse_block_manifest(written.decode())) == 3
    assert "wrote their blocks to" in result.stdout


def test_manifest_without_blocks_writes_no_block_manifest_and_a_bad_size_is_a_usage_error(
    dataset, tmp_path, cache
):
    output = tmp_path / "SHA256SUMS"
    result = run_cli("manifest", dataset.pattern, "-o", str(output), "-q", cache=cache)
    assert result.returncode == 0, result.stderr
    assert not (tmp_path / "SHA256SUMS.blocks").exists()
    bad = run_cli(
        "manifest",
        dataset.pattern,
        "-o",
        str(output),
        "--blocks",
        "--block-size",
        "100",
        cache=cache,
    )
    assert bad.returncode == 2
    assert "--block-size" in bad.stderr and "at least 4096" in bad.stderr


@pytest.mark.parametrize(
    ("suffix", "dask"),
    [("tar", False), ("tar.zst", False), ("tar.zst", True)],
    ids=["tar", "zst", "zst-dask"],
)
def test_manifest_index_writes_the_writers_sample_index_bytes(tmp_path, cache, suffix, dask):
    with ShardWriter(str(tmp_path / f"w-%03d.{suffix}"), max_count=5) as writer:
        for index in range(12):
            writer.write({"__key__": f"s{index:04d}", "bin": bytes([index]) * (300 * index)})
    pattern = str(tmp_path / f"w-{{000..002}}.{suffix}")
    written = (tmp_path / "sample-index.json").read_bytes()
    elsewhere = tmp_path / "index.json"
    extra = ["--dask", "local:1"] if dask else []
    args = ["manifest", pattern, "-o", str(tmp_path / "S.cli"), "--index", str(elsewhere), "-q"]
    result = run_cli(*args, *extra, cache=cache)
    assert result.returncode == 0, result.stderr
    assert elsewhere.read_bytes() == written
    assert "wrote the sample index of 3 shards" in result.stdout
    (tmp_path / "sample-index.json").unlink()
    beside = run_cli("manifest", pattern, "-o", str(tmp_path / "S.cli"), "--index", cache=cache)
    assert beside.returncode == 0, beside.stderr
    assert (tmp_path / "sample-index.json").read_bytes() == written
    counts = tmp_path / "counts.json"
    args = ["manifest", pattern, "-o", str(tmp_path / "S"), "--sample-counts", str(counts), "-q"]
    assert run_cli(*args, cache=cache).returncode == 0
    assert json.loads(counts.read_text()) == {
        f"w-{n:03d}.{suffix}": c for n, c in enumerate([5, 5, 2])
    }
    verified = run_cli("verify", pattern, "--manifest", str(tmp_path / "SHA256SUMS"), cache=cache)
    assert verified.returncode == 0, verified.stderr
    shard = tmp_path / f"w-001.{suffix}"
    shard.write_bytes(shard.read_bytes()[:-40])  # cut short: verify names it
    broken = run_cli("verify", pattern, "--manifest", str(tmp_path / "SHA256SUMS"), cache=cache)
    assert broken.returncode == 1 and shard.name in broken.stdout
