"""``fsspec-shards manifest``: a sha256sum-format manifest and the sample-count sidecar."""

from __future__ import annotations

import json
import shutil
import subprocess

from fsspec_shards.checksums import parse_sums_file
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
