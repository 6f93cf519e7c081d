"""``fsspec-shards verify``: checksums against a manifest or the backend, tar structure, one row
per shard, manifest entries storage lacks, and the manifest parser shared with checksums=."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
import tarfile
import zlib
from pathlib import Path

import pytest

from fsspec_shards import ShardWriter
from fsspec_shards.checksums import parse_sums_file
from tests.cli.running import TIMEOUT, corrupt_copy, error_lines, make_glob_copy, run_cli


def test_verify_passes_a_good_dataset_against_its_manifest(dataset, cache):
    result = run_cli(
        "verify", dataset.pattern, "--manifest", str(dataset.manifest), "-q", cache=cache
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "4 ok, 0 bad" in result.stdout


def test_verify_catches_a_corrupted_shard_with_exit_code_1(dataset, tmp_path, cache):
    bad = corrupt_copy(dataset, tmp_path / "bad")
    result = run_cli("verify", bad.pattern, "--manifest", str(bad.manifest), "-q", cache=cache)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "3 ok, 1 bad" in result.stdout
    failure_rows = [line for line in result.stdout.splitlines() if "demo-000001.tar" in line]
    assert len(failure_rows) == 1 and "integrity" in failure_rows[0]


def test_verify_catches_a_truncated_tar_without_a_manifest(dataset, tmp_path, cache):
    bad = corrupt_copy(dataset, tmp_path / "bad")
    shard = bad.shards[2]
    shard.write_bytes(shard.read_bytes()[:1000])
    result = run_cli("verify", bad.pattern, "-q", cache=cache)
    assert result.returncode == 1, result.stdout + result.stderr
    rows = [line for line in result.stdout.splitlines() if "demo-000002.tar" in line]
    assert len(rows) == 1 and "malformed tar" in rows[0]


def test_verify_calls_a_gzip_shard_with_a_cut_trailer_malformed(dataset, tmp_path, cache):
    shard = tmp_path / "cut-000000.tar.gz"
    whole = gzip.compress(dataset.shards[0].read_bytes())
    shard.write_bytes(whole[:-8])  # every tar member intact, the gzip trailer gone
    result = run_cli("verify", str(shard), "-q", cache=cache)
    assert result.returncode == 1, result.stdout + result.stderr
    rows = [line for line in result.stdout.splitlines() if "cut-000000.tar.gz" in line]
    assert len(rows) == 1 and "malformed tar" in rows[0] and "gzip" in rows[0]
    assert "Traceback" not in result.stderr


def test_verify_reports_a_shard_missing_from_the_manifest(dataset, tmp_path, cache):
    partial = tmp_path / "SHA256SUMS"
    entries = parse_sums_file(dataset.manifest.read_text())
    partial.write_text(
        "".join(f"{sha.hexdigest}  {dataset.directory}/{name}\n" for name, sha in entries.items()
                if name != "demo-000000.tar")
    )  # fmt: skip
    result = run_cli("verify", dataset.pattern, "--manifest", str(partial), "-q", cache=cache)
    assert result.returncode == 1, result.stdout + result.stderr
    rows = [line for line in result.stdout.splitlines() if "demo-000000.tar" in line]
    assert len(rows) == 1 and "not in the manifest" in rows[0]
    assert "3 ok, 1 bad" in result.stdout


def test_verify_reports_manifest_entries_the_glob_names_but_storage_lacks(dataset, tmp_path, cache):
    copy = make_glob_copy(dataset, tmp_path / "copy")
    copy.shards[2].unlink()
    (copy.directory / "other.tar").write_bytes(dataset.shards[0].read_bytes())
    with (copy.directory / "SHA256SUMS").open("a") as manifest:  # not named by the glob
        manifest.write(f"{'0' * 64}  val-000000.tar\n")
    result = run_cli(
        "verify", f"{copy.directory}/demo-*.tar", "--manifest", str(copy.manifest), cache=cache
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "3 ok, 1 bad" in result.stdout
    rows = [line for line in result.stdout.splitlines() if "demo-000002.tar" in line]
    assert len(rows) == 1 and "missing from storage" in rows[0]
    assert "val-000000" not in result.stdout and "other.tar" not in result.stdout
    lines = error_lines(result)
    assert len(lines) == 1 and "1 of 4 shards bad" in lines[0] and "demo-000002.tar" in lines[0]


def test_verify_takes_manifests_written_by_sha256sum_with_dot_slash_and_binary_marks(
    dataset, tmp_path, cache
):
    if not shutil.which("sha256sum"):
        pytest.skip("needs GNU sha256sum")
    copy = make_glob_copy(dataset, tmp_path / "copy")
    for flags, name in (([], "TEXT"), (["-b"], "BINARY")):
        made = subprocess.run(
            ["sha256sum", *flags, *[f"./{path.name}" for path in copy.shards]],
            cwd=copy.directory,
            capture_output=True,
            text=True,
            check=True,
        )
        (copy.directory / name).write_text(made.stdout)
        result = run_cli(
            "verify", copy.pattern, "--manifest", str(copy.directory / name), "-q", cache=cache
        )
        assert result.returncode == 0, result.stdout + result.stderr
        assert "4 ok, 0 bad" in result.stdout


def test_the_checksums_option_reads_the_same_sha256sum_manifest(dataset, tmp_path, cache):
    if not shutil.which("sha256sum"):
        pytest.skip("needs GNU sha256sum")
    bad = corrupt_copy(dataset, tmp_path / "bad")
    made = subprocess.run(
        ["sha256sum", *[f"./{path.name}" for path in dataset.shards]],
        cwd=dataset.directory,
        capture_output=True,
        text=True,
        check=True,
    )
    (bad.directory / "SUMS").write_text(made.stdout)  # the digests of the good shards
    checksums = f"wds.checksums={bad.directory / 'SUMS'}"
    good = run_cli("stream", dataset.pattern, "--no-cache", "-q", cache=cache)
    assert good.returncode == 0, good.stderr
    checked = run_cli(
        "stream", bad.pattern, "--option", checksums, "--no-cache", "--retries", "1", "-q",
        cache=cache,
    )  # fmt: skip
    assert checked.returncode == 3, checked.stdout + checked.stderr
    assert "integrity" in checked.stderr and "demo-000001.tar" in checked.stderr


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("z" * 64 + "  demo-000000.tar", "64 hex digits"),
        ("abc123  demo-000000.tar", "invalid checksum"),
        ("0" * 64 + "  demo-000001.tar", "listed again with another checksum (first on line 2)"),
    ],
)
def test_a_bad_manifest_line_is_exit_2_naming_the_manifest_and_the_line(
    line, why, dataset, tmp_path, cache
):
    manifest = tmp_path / "SHA256SUMS"
    lines = dataset.manifest.read_text().splitlines()
    manifest.write_text("\n".join([lines[0], lines[1], line, *lines[2:]]) + "\n")
    result = run_cli("verify", dataset.pattern, "--manifest", str(manifest), cache=cache)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = error_lines(result)
    assert len(lines) == 1, result.stderr
    assert f"manifest {manifest} line 3" in lines[0] and why in lines[0]


def test_verify_without_manifest_on_local_files_says_it_checked_sizes_only(
    dataset, tmp_path, cache
):
    bad = corrupt_copy(dataset, tmp_path / "bad")
    result = run_cli("verify", bad.pattern, "-q", cache=cache)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "checks: 4 size only" in result.stdout
    assert "backend" not in result.stdout
    rows = [line for line in result.stdout.splitlines() if "demo-0000" in line]
    assert len(rows) == 4 and all("size only" in row for row in rows)


def test_verify_json_is_one_object_with_a_row_per_shard_and_the_same_exit_code(
    dataset, tmp_path, cache
):
    bad = corrupt_copy(dataset, tmp_path / "bad")
    result = run_cli(
        "verify", bad.pattern, "--manifest", str(bad.manifest), "--json", "-q", cache=cache
    )
    assert result.returncode == 1
    report = json.loads(result.stdout)
    assert (report["shards"], report["ok"], report["bad"]) == (4, 3, 1)
    assert [row["ok"] for row in report["results"]] == [True, False, True, True]
    assert report["results"][1]["problem"].startswith("integrity")
    assert report["results"][0]["check"] == "sha256 (manifest)"
    assert report["samples"] == 120
    assert len(error_lines(result)) == 1


def test_verify_max_member_size_makes_larger_members_malformed(dataset, cache):
    small = run_cli("verify", dataset.pattern, "--max-member-size", "1KiB", "-q", cache=cache)
    assert small.returncode == 1, small.stdout + small.stderr
    assert "0 ok, 4 bad" in small.stdout and "exceeds limit" in small.stdout
    enough = run_cli("verify", dataset.pattern, "--max-member-size", "1MiB", "-q", cache=cache)
    assert enough.returncode == 0, enough.stdout + enough.stderr


def zeros_tar_gz(path: Path, size: int) -> None:
    """A ``.tar.gz`` holding one member of ``size`` zero bytes: about 1000x smaller."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, 31)
    info = tarfile.TarInfo("bomb.bin")
    info.size = size
    with path.open("wb") as out:
        out.write(compressor.compress(info.tobuf(tarfile.USTAR_FORMAT)))
        chunk = bytes(1 << 20)
        for start in range(0, size, len(chunk)):
            out.write(compressor.compress(chunk[: size - start]))
        out.write(compressor.compress(bytes(-size % 512 + 1024)))
        out.write(compressor.flush())


PEAK_RSS = (
    "import resource, subprocess, sys\n"
    "done = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)\n"
    "print(done.returncode)\n"
    "print(done.stdout)\n"
)


def verify_peak_rss(pattern: str, cache: Path) -> tuple[int, int, str]:
    """Peak RSS in bytes of ``verify`` in a process of its own, its exit code and stdout."""
    env = dict(os.environ, FSSPEC_SHARDS_CACHE=str(cache))
    command = [sys.executable, "-m", "fsspec_shards", "verify", pattern, "-q"]
    result = subprocess.run(
        [sys.executable, "-c", PEAK_RSS, *command],
        capture_output=True, text=True, timeout=TIMEOUT, env=env, check=True,
    )  # fmt: skip
    peak, code, stdout = result.stdout.split("\n", 2)
    return int(peak), int(code), stdout


def test_verify_of_a_gzip_bomb_is_a_malformed_shard_in_bounded_memory(dataset, tmp_path, cache):
    bomb = tmp_path / "bomb-000000.tar.gz"
    zeros_tar_gz(bomb, 600 << 20)
    assert bomb.stat().st_size < 1 << 20
    baseline, good, _ = verify_peak_rss(str(dataset.shards[0]), cache)
    assert good == 0
    peak, code, stdout = verify_peak_rss(str(bomb), cache)
    assert code == 1, stdout
    rows = [line for line in stdout.splitlines() if "bomb-000000.tar.gz" in line]
    assert len(rows) == 1 and "malformed tar" in rows[0] and "200x" in rows[0]
    assert peak - baseline < 300 << 20, f"RSS grew by {(peak - baseline) >> 20} MiB"


def test_verify_against_a_block_manifest_names_the_bad_block(tmp_path, cache):
    with ShardWriter(str(tmp_path / "b-%03d.tar"), max_count=4, manifest_block_size=4096) as w:
        for index in range(8):
            w.write({"__key__": f"s{index:04d}", "bin": bytes([index]) * 5000})
    shard = tmp_path / "b-001.tar"
    data = bytearray(shard.read_bytes())
    data[2 * 4096 + 700] ^= 0xFF  # inside block 2
    shard.write_bytes(bytes(data))
    pattern = str(tmp_path / "b-{000..001}.tar")
    manifest = str(tmp_path / "SHA256SUMS")
    result = run_cli("verify", pattern, "--manifest", manifest, "--json", "-q", cache=cache)
    assert result.returncode == 1, result.stdout + result.stderr
    rows = {Path(row["shard"]).name: row for row in json.loads(result.stdout)["results"]}
    assert rows["b-000.tar"]["ok"] and rows["b-000.tar"]["check"] == "sha256 (manifest, blocks)"
    assert rows["b-001.tar"]["problem"].startswith("integrity: block 2 (bytes 8192-12288): ")
