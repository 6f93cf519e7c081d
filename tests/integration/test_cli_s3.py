"""Every fsspec-shards subcommand against the S3 test server, in a subprocess."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fsspec_shards.checksums import parse_sums_file
from fsspec_shards.fleet.demo import make_demo_dataset
from fsspec_shards.storage.cache import ShardCache
from tests.cli.running import run_cli
from tests.faults import Flip

SHARDS = 4
SAMPLES = 20


def options_file(tmp_path: Path, backend) -> str:
    """The backend's options as an options file, so no secret goes on a command line."""
    path = tmp_path / f"options-{backend.address()[1]}.json"
    path.write_text(json.dumps({"s3": backend.storage_options}))
    return str(path)


def upload_demo(backend, tmp_path: Path, shards: int = SHARDS, image_bytes: int = 4096) -> str:
    """Upload a demo dataset under the backend's prefix; return its brace pattern."""
    demo = make_demo_dataset(
        tmp_path / "local", shards=shards, samples_per_shard=SAMPLES, image_bytes=image_bytes
    )
    for path in demo.shards:
        backend.put(path.name, path.read_bytes())
    return backend.url(f"demo-{{000000..{shards - 1:06d}}}.tar")


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    return tmp_path / "cache"


def test_stream_reads_every_sample_from_s3_through_the_cache(s3_backend, tmp_path, cache):
    pattern = upload_demo(s3_backend, tmp_path)
    opts = options_file(tmp_path, s3_backend)
    first = run_cli("stream", pattern, "--options-file", opts, "-q", cache=cache)
    assert first.returncode == 0, first.stderr
    assert f"samples             {SHARDS * SAMPLES}" in first.stdout
    assert "cache hit rate      0% of shards" in first.stdout
    second = run_cli("stream", pattern, "--options-file", opts, "-q", cache=cache)
    assert second.returncode == 0, second.stderr
    assert "cache hit rate      100% of shards" in second.stdout
    assert "downloaded          0 B" in second.stdout


def test_glob_pattern_with_options_on_the_command_line(s3_backend, tmp_path, cache):
    upload_demo(s3_backend, tmp_path)
    options = s3_backend.storage_options
    result = run_cli(
        "stream",
        s3_backend.url("demo-*.tar"),
        "--option",
        f"s3.key={options['key']}",
        "--option",
        f"s3.secret={options['secret']}",
        "--option",
        f"s3.client_kwargs.endpoint_url={options['client_kwargs']['endpoint_url']}",
        "--no-cache",
        "-q",
        cache=cache,
    )
    assert result.returncode == 0, result.stderr
    assert f"samples             {SHARDS * SAMPLES}" in result.stdout
    assert "cache hit rate      cache off" in result.stdout
    assert not cache.exists()


def test_missing_object_fails_with_one_line_naming_it(s3_backend, tmp_path, cache):
    opts = options_file(tmp_path, s3_backend)
    result = run_cli("stream", s3_backend.url("absent.tar"), "--options-file", opts, cache=cache)
    assert result.returncode == 3
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "absent.tar" in lines[0], result.stderr
    assert s3_backend.storage_options["secret"] not in result.stderr


def test_manifest_on_s3_then_verify_catches_a_corrupted_object(s3_backend, tmp_path, cache):
    pattern = upload_demo(s3_backend, tmp_path)
    opts = options_file(tmp_path, s3_backend)
    manifest_url = s3_backend.url("SHA256SUMS")
    written = run_cli(
        "manifest", pattern, "-o", manifest_url, "--options-file", opts, "-q", cache=cache
    )
    assert written.returncode == 0, written.stderr
    text = s3_backend.filesystem().cat_file(manifest_url).decode()
    assert list(parse_sums_file(text)) == [f"demo-{index:06d}.tar" for index in range(SHARDS)]

    good = run_cli(
        "verify", pattern, "--manifest", manifest_url, "--options-file", opts, cache=cache
    )
    assert good.returncode == 0, good.stdout + good.stderr
    assert f"{SHARDS} ok, 0 bad" in good.stdout

    shard = s3_backend.url("demo-000002.tar")
    data = bytearray(s3_backend.filesystem().cat_file(shard))
    data[600] ^= 0xFF
    s3_backend.put("demo-000002.tar", bytes(data))
    bad = run_cli(
        "verify", pattern, "--manifest", manifest_url, "--options-file", opts, cache=cache
    )
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert f"{SHARDS - 1} ok, 1 bad" in bad.stdout
    rows = [line for line in bad.stdout.splitlines() if "demo-000002.tar" in line]
    assert len(rows) == 1 and "integrity" in rows[0]


def test_prefetch_then_cache_info_ls_clear(s3_backend, tmp_path, cache):
    pattern = upload_demo(s3_backend, tmp_path)
    opts = options_file(tmp_path, s3_backend)
    fetched = run_cli("prefetch", pattern, "--options-file", opts, "-j", "4", cache=cache)
    assert fetched.returncode == 0, fetched.stderr
    assert f"prefetched {SHARDS} of {SHARDS} shards: {SHARDS} downloaded" in fetched.stdout

    info = run_cli("cache", "info", cache=cache)
    assert info.returncode == 0 and f"cached files        {SHARDS}" in info.stdout
    listing = run_cli("cache", "ls", cache=cache)
    urls = sorted(line.split()[-1] for line in listing.stdout.splitlines())
    assert urls == [s3_backend.url(f"demo-{index:06d}.tar") for index in range(SHARDS)]
    cleared = run_cli("cache", "clear", cache=cache)
    assert cleared.returncode == 0 and f"removed {SHARDS} files" in cleared.stdout
    assert "cached files        0" in run_cli("cache", "info", cache=cache).stdout


def test_prefetch_interrupted_exits_130_and_resumes_on_rerun(
    s3_backend, fault_proxy, tmp_path, cache
):
    shards = 6
    pattern = upload_demo(s3_backend, tmp_path, shards=shards, image_bytes=8192)
    _, slow = fault_proxy(s3_backend, bandwidth=100_000)
    command = [sys.executable, "-m", "fsspec_shards", "prefetch", pattern, "-j", "1", "-q"]
    command += ["--options-file", options_file(tmp_path, slow)]
    env = dict(os.environ, FSSPEC_SHARDS_CACHE=str(cache))
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and process.poll() is None:
        if cache.is_dir() and ShardCache(str(cache), 1 << 30).entries():
            break
        time.sleep(0.1)
    assert process.poll() is None, "prefetch ended before it could be interrupted"
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr
    assert "interrupted after" in stderr.decode() and "run the same command again" in (
        stderr.decode()
    )
    cached_before = len(ShardCache(str(cache), 1 << 30).entries())
    assert 1 <= cached_before < shards

    # The same command again: through the same endpoint (another endpoint names other objects).
    same_options = options_file(tmp_path, slow)
    rerun = run_cli("prefetch", pattern, "--options-file", same_options, cache=cache)
    assert rerun.returncode == 0, rerun.stderr
    assert f"{shards - cached_before} downloaded" in rerun.stdout
    assert f"{cached_before} already cached" in rerun.stdout


def test_without_manifest_verify_catches_bad_transfers_and_bad_tars_stream_skips_them(
    s3_backend, fault_proxy, tmp_path, cache
):
    pattern = upload_demo(s3_backend, tmp_path)
    s3_backend.put("demo-000002.tar", b"this is not a tar archive" * 40)
    proxy, flipping = fault_proxy(s3_backend)
    proxy.add(Flip(100), method="GET", path="demo-000001.tar", times=None)
    opts = options_file(tmp_path, flipping)

    verified = run_cli("verify", pattern, "--options-file", opts, "--retries", "2", cache=cache)
    assert verified.returncode == 1, verified.stdout + verified.stderr
    assert f"{SHARDS - 2} ok, 2 bad" in verified.stdout
    rows = {
        name: [line for line in verified.stdout.splitlines() if name in line]
        for name in ("demo-000001.tar", "demo-000002.tar")
    }
    assert len(rows["demo-000001.tar"]) == 1 and "integrity" in rows["demo-000001.tar"][0]
    assert len(rows["demo-000002.tar"]) == 1 and "malformed tar" in rows["demo-000002.tar"][0]

    streamed = run_cli(
        "stream", pattern, "--options-file", opts, "--retries", "2", "--handler", "skip",
        cache=cache,
    )  # fmt: skip
    assert streamed.returncode == 0, streamed.stderr
    assert f"samples             {(SHARDS - 2) * SAMPLES}" in streamed.stdout
    assert "failed shards       2" in streamed.stdout
    assert "integrity failures  0" not in streamed.stdout


def test_verify_without_manifest_names_the_backend_checksum_it_checked(s3_backend, tmp_path, cache):
    pattern = upload_demo(s3_backend, tmp_path)
    opts = options_file(tmp_path, s3_backend)
    result = run_cli("verify", pattern, "--options-file", opts, "-q", cache=cache)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"checks: {SHARDS} backend md5" in result.stdout  # S3 ETag of a one-part upload
    rows = [line for line in result.stdout.splitlines() if "demo-0000" in line]
    assert len(rows) == SHARDS and all("backend md5" in row for row in rows)


@pytest.mark.parametrize(
    "option", ["s3.endpoint=http://127.0.0.1:9", "s3.client_kwargs.endpoint=http://127.0.0.1:9"]
)
@pytest.mark.parametrize("command", ["stream", "verify"])
def test_an_option_the_backend_does_not_take_is_exit_2_naming_it(
    command, option, s3_backend, tmp_path, cache
):
    pattern = upload_demo(s3_backend, tmp_path, shards=1)
    opts = options_file(tmp_path, s3_backend)
    result = run_cli(command, pattern, "--options-file", opts, "--option", option, cache=cache)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert f"invalid storage option {option.split('=')[0]}" in lines[0]
    assert s3_backend.storage_options["secret"] not in result.stderr
