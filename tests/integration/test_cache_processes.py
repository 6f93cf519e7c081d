"""ShardCache under real processes: single flight, SIGKILL at planned instants, LRU, full disk."""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import random
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from fsspec_shards.storage.cache import CacheFullError, ShardCache, layout, locks, room
from tests.cache_objects import indexed_entries, obj

if TYPE_CHECKING:  # spawned workers import this module: keep it light
    from tests.integration import servers

SPAWN = multiprocessing.get_context("spawn")
JOIN_TIMEOUT = 120


def payload(name: str, size: int) -> bytes:
    """Deterministic bytes for an object name."""
    seed = hashlib.sha256(name.encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def slow_writer(name: str, size: int, chunks: int, pause: float, counter: str | None = None):
    """A download callback writing ``payload(name, size)`` in ``chunks`` pieces, ``pause`` apart.

    Each call appends one byte to the file ``counter``: its size is the number of downloads.
    """

    def download(file) -> dict:
        if counter is not None:
            descriptor = os.open(counter, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            os.write(descriptor, b".")
            os.close(descriptor)
        data = payload(name, size)
        step = -(-size // chunks)
        for start in range(0, size, step):
            file.write(data[start : start + step])
            file.flush()
            time.sleep(pause)
        return {"checksum": "sha256:" + digest(data)}

    return download


def disk_bytes(directory: str) -> int:
    """Bytes of published and in-flight files, as one snapshot: the cache's space lock
    (held while it reserves, publishes and evicts) keeps files from moving while we count."""
    total = 0
    with locks.hold(layout.space_lock_path(directory)):
        for sub in (layout.files_directory(directory), layout.temp_directory(directory)):
            for root, _, names in os.walk(sub):
                for name in names:
                    try:
                        total += os.stat(os.path.join(root, name)).st_size
                    except FileNotFoundError:
                        pass
    return total


def published_files(directory: str) -> set[str]:
    return {str(p) for p in Path(directory, "files").rglob("*") if p.is_file()}


def fetch_in_a_thread(cache: ShardCache, url: str, size: int) -> tuple[threading.Thread, dict]:
    """Start a thread fetching ``url``; the dict tells whether it downloaded, and the path."""
    outcome = {"downloaded": False}
    download = slow_writer(url, size, 1, 0)

    def take_over(file) -> dict:
        outcome["downloaded"] = True
        return download(file)

    def run() -> None:
        with cache.fetch(obj(url), take_over, expected_size=size) as handle:
            outcome["path"] = handle.name

    thread = threading.Thread(target=run)
    thread.start()
    return thread, outcome


def join_all(processes: list) -> None:
    for process in processes:
        process.join(JOIN_TIMEOUT)
        assert process.exitcode == 0, f"worker exited with {process.exitcode}"


# -- workers (module level, so spawned processes can import them) ---------------------------


def fetch_once(directory, limit, url, size, counter, barrier, results) -> None:
    cache = ShardCache(directory, limit)
    barrier.wait(JOIN_TIMEOUT)
    with cache.fetch(obj(url), slow_writer(url, size, 8, 0.02, counter), size) as handle:
        results.put(digest(handle.read()))


def read_through_wds(url, options, barrier, results) -> None:
    import fsspec

    barrier.wait(JOIN_TIMEOUT)
    with fsspec.open(f"wds::{url}", "rb", **options) as handle:
        results.put(digest(handle.read()))


def fetch_then_linger(directory, limit, url, size, started) -> None:
    cache = ShardCache(directory, limit)
    download = slow_writer(url, size, 16, 0.01)

    def announced(file) -> dict:
        Path(started).touch()
        return download(file)

    cache.fetch(obj(url), announced, expected_size=size).close()
    time.sleep(JOIN_TIMEOUT)


def read_randomly(directory, limit, names, size, seed, rounds, results) -> None:
    cache = ShardCache(directory, limit)
    chooser = random.Random(seed)
    worst = calls = 0
    for _ in range(rounds):
        name = chooser.choice(names)
        calls += 1
        with cache.fetch(obj(name), slow_writer(name, size, 2, 0.001), size) as handle:
            data = handle.read()
        assert data == payload(name, size), name
        worst = max(worst, disk_bytes(directory), cache.stats()["cached_bytes"])
    results.put((worst, calls))


def fetch_each(directory, limit, names, size) -> None:
    cache = ShardCache(directory, limit)
    for name in names:
        cache.fetch(obj(name), slow_writer(name, size, 2, 0.001), expected_size=size).close()


def read_across_eviction(directory, limit, url, half_read, go_on, results) -> None:
    cache = ShardCache(directory, limit)
    with cache.open(obj(url)) as reader:
        head = reader.read(1000)
        half_read.set()
        assert go_on.wait(JOIN_TIMEOUT)
        results.put(digest(head + reader.read()))


# -- tests ------------------------------------------------------------------------------------


def test_eight_processes_fetching_one_object_download_it_once(tmp_path: Path) -> None:
    directory, counter = str(tmp_path / "cache"), str(tmp_path / "downloads")
    url, size = "s3://bucket/shared-0000.tar", 256 * 1024
    barrier, results = SPAWN.Barrier(8), SPAWN.Queue()
    processes = [
        SPAWN.Process(
            target=fetch_once, args=(directory, 10 * size, url, size, counter, barrier, results)
        )
        for _ in range(8)
    ]
    for process in processes:
        process.start()
    digests = [results.get(timeout=JOIN_TIMEOUT) for _ in processes]
    join_all(processes)
    assert os.path.getsize(counter) == 1
    assert digests == [digest(payload(url, size))] * 8
    stats = ShardCache(directory, 10 * size).stats()
    assert (stats["misses"], stats["hits"], stats["cached_files"]) == (1, 7, 1)


@pytest.mark.slow
@pytest.mark.slow
def test_eight_processes_reading_through_wds_make_one_request_to_the_server(
    s3_backend: servers.S3Backend, fault_proxy, tmp_path: Path
) -> None:
    data = payload("through-wds", 700_000)
    path = "shards/train-0000.tar"
    s3_backend.put(path, data)
    proxy, proxied = fault_proxy(s3_backend)
    options = {
        "wds": {"cache_dir": str(tmp_path / "cache"), "cache_size": "16MB"},
        "s3": proxied.storage_options,
    }
    barrier, results = SPAWN.Barrier(8), SPAWN.Queue()
    processes = [
        SPAWN.Process(target=read_through_wds, args=(proxied.url(path), options, barrier, results))
        for _ in range(8)
    ]
    for process in processes:
        process.start()
    digests = [results.get(timeout=JOIN_TIMEOUT) for _ in processes]
    join_all(processes)
    assert digests == [digest(data)] * 8
    gets = proxy.requests("GET", path)
    assert sum(entry.body_bytes for entry in gets) == len(data)
    stats = ShardCache(str(tmp_path / "cache"), 16 * 10**6).stats()
    assert (stats["misses"], stats["hits"], stats["bytes_downloaded"]) == (1, 7, len(data))


@pytest.mark.slow
def test_dask_workers_reading_the_same_parquet_files_download_each_once(
    s3_backend: servers.S3Backend, fault_proxy, tmp_path: Path
) -> None:
    import fsspec
    import pandas as pd
    from distributed import Client, LocalCluster

    paths, frames = [], []
    for part in range(3):
        frame = pd.DataFrame({"part": [part] * 5000, "value": range(5000)})
        path = f"table/part-{part}.parquet"
        s3_backend.put(path, frame.to_parquet(index=False))
        paths.append(path)
        frames.append(frame)
    proxy, proxied = fault_proxy(s3_backend)
    options = {
        "wds": {"cache_dir": str(tmp_path / "cache"), "cache_size": "64MB"},
        "s3": proxied.storage_options,
    }
    urls = [f"wds::{proxied.url(path)}" for path in paths]

    def read_all() -> list[int]:
        import pandas

        return [
            int(pandas.read_parquet(url, storage_options=options)["value"].sum()) for url in urls
        ]

    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster,
        Client(cluster) as client,
    ):
        sums = client.run(read_all)
    assert len(sums) == 2
    assert list(sums.values()) == [[int(f["value"].sum()) for f in frames]] * 2

    sizes = {path: s3_backend.filesystem().size(s3_backend.url(path)) for path in paths}
    for path in paths:
        sent = sum(entry.body_bytes for entry in proxy.requests("GET", path))
        assert sent == sizes[path], path
    fs, _ = fsspec.core.url_to_fs(urls[0], **options)
    stats = fs.cache_stats()
    assert stats["misses"] == len(paths) and stats["hits"] >= len(paths)
    assert stats["bytes_downloaded"] == sum(sizes.values())
    assert (stats["cached_files"], stats["cached_bytes"]) == (len(paths), sum(sizes.values()))


def test_sigkill_at_any_instant_never_leaves_a_partial_entry(tmp_path: Path) -> None:
    directory = str(tmp_path / "cache")
    url, size = "s3://bucket/killed.tar", 512 * 1024
    started = tmp_path / "started"
    cache = ShardCache(directory, 4 * size)
    expected = payload(url, size)
    outcomes = []
    # The download takes >= 16 * 10 ms; kills at 0..345 ms after it starts cover the download,
    # the fsync, the rename and the index update, and some instants after publication. A
    # thread of this process waits for the same file meanwhile and must take over after a kill.
    for trial in range(24):
        started.unlink(missing_ok=True)
        process = SPAWN.Process(
            target=fetch_then_linger, args=(directory, 4 * size, url, size, str(started))
        )
        process.start()
        deadline = time.monotonic() + JOIN_TIMEOUT
        while not started.exists():
            assert time.monotonic() < deadline and process.is_alive(), "download never started"
            time.sleep(0.002)
        waiter, outcome = fetch_in_a_thread(cache, url, size)
        kill_at = time.monotonic() + trial * 0.015
        while time.monotonic() < kill_at:
            seen = cache.open(obj(url))
            if seen is not None:
                with seen:
                    assert seen.read() == expected
            time.sleep(0.005)
        os.kill(process.pid, signal.SIGKILL)
        process.join(JOIN_TIMEOUT)
        assert process.exitcode == -signal.SIGKILL
        waiter.join(JOIN_TIMEOUT)

        assert Path(outcome["path"]).read_bytes() == expected
        outcomes.append("taken over" if outcome["downloaded"] else "published")
        assert os.listdir(os.path.join(directory, "tmp")) == []
        assert published_files(directory) == {e["path"] for e in cache.entries()}
        cache.discard(obj(url))
    assert outcomes[0] == "taken over"
    assert cache.stats()["cached_files"] == 0


@pytest.mark.slow
def test_four_random_readers_keep_the_cap_and_evict_least_recently_used(tmp_path: Path) -> None:
    directory, size = str(tmp_path / "cache"), 32 * 1024
    limit = 10 * size
    names = [f"gs://bucket/part-{i:04d}.tar" for i in range(40)]
    results = SPAWN.Queue()
    readers = [
        SPAWN.Process(target=read_randomly, args=(directory, limit, names, size, seed, 30, results))
        for seed in range(4)
    ]
    for process in readers:
        process.start()
    reports = [results.get(timeout=JOIN_TIMEOUT) for _ in readers]
    join_all(readers)
    assert max(worst for worst, _ in reports) <= limit
    cache = ShardCache(directory, limit)
    stats = cache.stats()
    assert stats["cached_bytes"] <= limit and stats["evictions"] > 0
    assert stats["hits"] + stats["misses"] == sum(calls for _, calls in reports)

    # Deterministic LRU: fill with ten known files, touch three, then four processes add seven
    # new ones: exactly the seven untouched files must go.
    known = names[:10]
    for name in known:
        cache.fetch(obj(name), slow_writer(name, size, 1, 0), expected_size=size).close()
    assert sorted(e["url"] for e in cache.entries()) == sorted(known)
    touched = [known[2], known[5], known[7]]
    for name in touched:
        assert cache.get(obj(name)) is not None
    cache.flush()  # touches are batched per process: make them visible to the writers now
    new = [f"s3://other/new-{i}.tar" for i in range(7)]
    writers = [
        SPAWN.Process(target=fetch_each, args=(directory, limit, new[i::4], size)) for i in range(4)
    ]
    for process in writers:
        process.start()
    join_all(writers)
    assert sorted(e["url"] for e in cache.entries()) == sorted(touched + new)
    assert disk_bytes(directory) == limit


def test_reader_in_another_process_keeps_reading_while_its_file_is_evicted(
    tmp_path: Path,
) -> None:
    directory, size = str(tmp_path / "cache"), 64 * 1024
    cache = ShardCache(directory, 2 * size)
    url = "s3://bucket/open.tar"
    with cache.fetch(obj(url), slow_writer(url, size, 1, 0), expected_size=size) as handle:
        path = handle.name
    half_read, go_on, results = SPAWN.Event(), SPAWN.Event(), SPAWN.Queue()
    reader = SPAWN.Process(
        target=read_across_eviction, args=(directory, 2 * size, url, half_read, go_on, results)
    )
    reader.start()
    assert half_read.wait(JOIN_TIMEOUT)
    for other in ("s3://bucket/x.tar", "s3://bucket/y.tar"):
        cache.fetch(obj(other), slow_writer(other, size, 1, 0), expected_size=size).close()
    assert cache.get(obj(url)) is None and not os.path.exists(path)
    go_on.set()
    assert results.get(timeout=JOIN_TIMEOUT) == digest(payload(url, size))
    join_all([reader])


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs, or a skip where mounting is not permitted."""
    mountpoint = tmp_path / "tiny"
    mountpoint.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mountpoint)],
        capture_output=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield mountpoint
    finally:
        subprocess.run(["umount", "-l", str(mountpoint)], check=False)


def test_full_disk_evicts_and_retries_then_raises_cache_full_leaving_nothing_broken(
    tiny_disk: Path,
) -> None:
    mib = 1024 * 1024
    cache = ShardCache(str(tiny_disk / "cache"), 64 * mib)
    counter = str(tiny_disk.parent / "downloads")
    for name in ("a", "b", "c"):
        download = slow_writer(name, mib, 4, 0, counter)
        cache.fetch(obj(f"s3://bucket/{name}"), download, mib).close()
    # A fourth MiB does not fit on the 4 MiB disk: the oldest file goes and the download reruns.
    with cache.fetch(obj("s3://bucket/d"), slow_writer("d", mib, 4, 0, counter), mib) as handle:
        assert handle.read() == payload("d", mib)
    assert os.path.getsize(counter) == 5
    assert cache.get(obj("s3://bucket/a")) is None and cache.stats()["evictions"] >= 1

    with pytest.raises(CacheFullError):
        cache.fetch(obj("s3://bucket/huge"), slow_writer("huge", 6 * mib, 6, 0), 6 * mib)
    assert os.listdir(os.path.join(cache.directory, "tmp")) == []
    for entry in cache.entries():
        assert os.path.getsize(entry["path"]) == entry["size"]
    assert published_files(cache.directory) == {e["path"] for e in cache.entries()}
    with cache.fetch(obj("s3://bucket/e"), slow_writer("e", mib, 4, 0), mib) as handle:
        assert handle.read() == payload("e", mib)


def test_wds_reads_stay_correct_when_the_cache_disk_fills_up(
    s3_backend: servers.S3Backend, tiny_disk: Path
) -> None:
    import fsspec

    mib = 1024 * 1024
    blobs = {f"full/part-{i}.bin": payload(f"part-{i}", mib) for i in range(5)}
    blobs["full/huge.bin"] = payload("huge", 6 * mib)
    for path, data in blobs.items():
        s3_backend.put(path, data)
    options = {
        "wds": {"cache_dir": str(tiny_disk / "cache"), "cache_size": 64 * mib},
        "s3": s3_backend.storage_options,
    }
    with pytest.warns(UserWarning, match="not caching"):
        for path, data in blobs.items():
            with fsspec.open(f"wds::{s3_backend.url(path)}", "rb", **options) as handle:
                assert handle.read() == data, path
    cache = ShardCache(str(tiny_disk / "cache"), 64 * mib)
    assert cache.stats()["evictions"] >= 2
    assert os.listdir(os.path.join(cache.directory, "tmp")) == []
    assert published_files(cache.directory) == {e["path"] for e in cache.entries()}
    for entry in cache.entries():
        [data] = [data for path, data in blobs.items() if entry["url"].endswith(path)]
        assert Path(entry["path"]).read_bytes() == data


def test_touches_reach_other_processes_within_the_batching_window(tmp_path: Path) -> None:
    """No explicit flush: this process's next use a second later writes its touches, and
    then other processes evict exactly the files not touched."""
    directory, size = str(tmp_path / "cache"), 16 * 1024
    limit = 4 * size
    cache = ShardCache(directory, limit)
    known = [f"s3://bucket/known-{i}.tar" for i in range(4)]
    for name in known:
        cache.fetch(obj(name), slow_writer(name, size, 1, 0), expected_size=size).close()
    cache.flush()
    touched = [known[0], known[2]]
    for name in touched:
        assert cache.get(obj(name)) is not None
    time.sleep(room.FLUSH_INTERVAL_SECONDS)
    assert cache.get(obj(touched[-1])) is not None  # the batch is due: this use writes it
    deadline = time.monotonic() + JOIN_TIMEOUT
    while True:  # wait, without flushing, until the order on disk shows the touches
        order = [record["shown"] for _, record, _ in indexed_entries(directory)]
        if order[-2:] == touched:
            break
        assert time.monotonic() < deadline, f"touches never written: {order}"
        time.sleep(0.1)
    new = [f"s3://other/new-{i}.tar" for i in range(2)]
    writer = SPAWN.Process(target=fetch_each, args=(directory, limit, new, size))
    writer.start()
    join_all([writer])
    assert sorted(e["url"] for e in cache.entries()) == sorted(touched + new)
