"""The fleet chores fanned out over dask: a LocalCluster of 2 worker processes, the S3 server.

The promise is a local run's result, whatever runs the work: the same manifest bytes, the same
verify table and exit code, one download per shard, and completion when a worker dies.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fsspec_shards import distributed as fanout
from fsspec_shards.fleet.demo import make_demo_dataset
from fsspec_shards.fleet.executors import ThreadExecutor
from fsspec_shards.storage.cache import ShardCache
from tests.cli.running import TIMEOUT, run_cli

distributed = pytest.importorskip("distributed")

SHARDS = 8
SAMPLES = 10


def options_file(tmp_path: Path, backend) -> str:
    path = tmp_path / f"options-{backend.address()[1]}.json"
    path.write_text(json.dumps({"s3": backend.storage_options}))
    return str(path)


def upload_demo(backend, tmp_path: Path, image_bytes: int = 4096) -> tuple[str, dict[str, int]]:
    """Upload a demo dataset; its brace pattern and the size of each shard by name."""
    demo = make_demo_dataset(
        tmp_path / "local", shards=SHARDS, samples_per_shard=SAMPLES, image_bytes=image_bytes
    )
    for path in demo.shards:
        backend.put(path.name, path.read_bytes())
    sizes = {path.name: path.stat().st_size for path in demo.shards}
    return backend.url(f"demo-{{000000..{SHARDS - 1:06d}}}.tar"), sizes


@pytest.fixture(scope="module")
def client():
    """A cluster of 2 worker processes (restarted by their nannies when killed)."""
    with (
        distributed.LocalCluster(
            n_workers=2,
            threads_per_worker=2,
            processes=True,
            dashboard_address=None,
            silence_logs=logging.ERROR,
        ) as cluster,
        distributed.Client(cluster) as dask_client,
    ):
        yield dask_client


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    return tmp_path / "cache"


def test_manifest_with_dask_local_2_writes_the_bytes_of_a_local_run(s3_backend, tmp_path, cache):
    pattern, _ = upload_demo(s3_backend, tmp_path)
    opts = options_file(tmp_path, s3_backend)
    runs = {}
    for name, extra in (("local", []), ("dask", ["--dask", "local:2"])):
        output, counts = tmp_path / f"{name}.sums", tmp_path / f"{name}.json"
        result = run_cli(
            "manifest", pattern, "-o", str(output), "--sample-counts", str(counts),
            "--options-file", opts, "-q", *extra, cache=cache,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        assert result.stderr == ""
        runs[name] = (output.read_bytes(), counts.read_bytes())
    assert runs["dask"] == runs["local"]
    assert runs["local"][0].count(b"\n") == SHARDS


def test_verify_with_dask_finds_the_same_corrupted_shard_with_exit_1(s3_backend, tmp_path, cache):
    pattern, _ = upload_demo(s3_backend, tmp_path)
    opts = options_file(tmp_path, s3_backend)
    manifest = str(tmp_path / "SHA256SUMS")
    made = run_cli("manifest", pattern, "-o", manifest, "--options-file", opts, "-q", cache=cache)
    assert made.returncode == 0, made.stderr
    data = bytearray(s3_backend.filesystem().cat_file(s3_backend.url("demo-000005.tar")))
    data[700] ^= 0xFF
    s3_backend.put("demo-000005.tar", bytes(data))
    args = ["verify", pattern, "--manifest", manifest, "--options-file", opts, "-q"]
    local = run_cli(*args, cache=cache)
    dask = run_cli(*args, "--dask", "local:2", cache=cache)
    assert local.returncode == dask.returncode == 1, dask.stdout + dask.stderr
    assert dask.stdout == local.stdout
    assert dask.stderr == local.stderr
    assert f"{SHARDS - 1} ok, 1 bad" in dask.stdout
    rows = [line for line in dask.stdout.splitlines() if "demo-000005.tar" in line]
    assert len(rows) == 1 and "integrity" in rows[0]


def test_prefetch_with_dask_downloads_each_shard_once_counted_at_the_server(
    s3_backend, fault_proxy, tmp_path, cache
):
    pattern, sizes = upload_demo(s3_backend, tmp_path)
    proxy, proxied = fault_proxy(s3_backend)
    args = ["prefetch", pattern, "--options-file", options_file(tmp_path, proxied), "-q"]
    result = run_cli(*args, "--dask", "local:2", cache=cache)
    assert result.returncode == 0, result.stderr
    assert f"prefetched {SHARDS} of {SHARDS} shards: {SHARDS} downloaded" in result.stdout
    for name, size in sizes.items():
        assert proxy.bytes_sent(name) == size, name
    assert len(ShardCache(str(cache), 1 << 30).entries()) == SHARDS
    proxy.clear_log()
    again = run_cli(*args, "--dask", "local:2", cache=cache)
    assert again.returncode == 0, again.stderr
    assert f"0 downloaded (0 B), {SHARDS} already cached" in again.stdout
    assert proxy.bytes_sent("demo-") == 0


def test_a_worker_killed_mid_prefetch_the_chore_still_completes(
    client, s3_backend, fault_proxy, tmp_path, cache
):
    pattern, sizes = upload_demo(s3_backend, tmp_path, image_bytes=8192)
    _, slow = fault_proxy(s3_backend, bandwidth=400_000)
    command = [
        sys.executable, "-m", "fsspec_shards", "prefetch", pattern, "-q",
        "--options-file", options_file(tmp_path, slow),
        "--cache-dir", str(cache), "--dask", client.scheduler.address,
    ]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and process.poll() is None:
        if cache.is_dir() and ShardCache(str(cache), 1 << 30).entries():
            break
        time.sleep(0.05)
    assert process.poll() is None, "prefetch ended before a worker could be killed"
    cached_at_kill = len(ShardCache(str(cache), 1 << 30).entries())
    assert cached_at_kill < SHARDS
    victim = next(iter(client.run(os.getpid).values()))
    os.kill(victim, signal.SIGKILL)
    stdout, stderr = process.communicate(timeout=TIMEOUT)
    assert process.returncode == 0, stderr
    assert f"prefetched {SHARDS} of {SHARDS} shards" in stdout
    cached = {Path(entry["url"]).name for entry in ShardCache(str(cache), 1 << 30).entries()}
    assert cached == set(sizes)
    client.wait_for_workers(2, timeout=120)
    assert victim not in client.run(os.getpid).values(), "the killed worker was replaced"


def test_python_functions_on_a_client_give_the_cli_results(client, s3_backend, tmp_path, cache):
    pattern, _ = upload_demo(s3_backend, tmp_path)
    options = {"s3": s3_backend.storage_options}
    opts = options_file(tmp_path, s3_backend)
    cli_manifest = tmp_path / "cli.sums"
    made = run_cli("manifest", pattern, "-o", str(cli_manifest), "--options-file", opts, "-q",
                   cache=cache)  # fmt: skip
    assert made.returncode == 0, made.stderr
    text = fanout.manifest(pattern, str(tmp_path / "api.sums"), client=client,
                           storage_options=options)  # fmt: skip
    assert text == cli_manifest.read_text() == (tmp_path / "api.sums").read_text()

    data = bytearray(s3_backend.filesystem().cat_file(s3_backend.url("demo-000003.tar")))
    data[900] ^= 0xFF
    s3_backend.put("demo-000003.tar", bytes(data))
    on_dask = fanout.verify(pattern, client=client, storage_options=options,
                            manifest=str(cli_manifest))  # fmt: skip
    in_threads = fanout.verify(pattern, executor=ThreadExecutor(4), storage_options=options,
                               manifest=str(cli_manifest))  # fmt: skip
    assert on_dask.as_dict() == in_threads.as_dict()
    assert [row.shard for row in on_dask.bad] == [s3_backend.url("demo-000003.tar")]

    with_cache = {**options, "wds": {"cache_dir": str(cache)}}
    fetched = fanout.prefetch(pattern, client=client, storage_options=with_cache)
    assert (fetched.fetched, fetched.storage["misses"], fetched.failures) == (SHARDS, SHARDS, [])


def test_without_dask_the_option_is_exit_2_saying_what_to_install(tmp_path, cache):
    shadow = tmp_path / "shadow" / "distributed"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError(\"No module named 'distributed'\")\n")
    demo = make_demo_dataset(tmp_path / "demo", shards=2, samples_per_shard=2)
    path = os.pathsep.join([str(shadow.parent), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, PYTHONPATH=path)
    result = run_cli("manifest", demo.pattern, "-o", str(tmp_path / "S"), "--dask", "local:2",
                     cache=cache, env=env)  # fmt: skip
    assert result.returncode == 2, result.stdout + result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "--dask" in lines[0] and "fsspec-shards[dask]" in lines[0]
