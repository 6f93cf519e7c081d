"""Benchmark a cache of many small entries: evicting half of it, and what others wait.

A cache of ``entries`` files of 1 KiB is built (the index in one transaction, as
``Index.adopt`` takes over a cache, and the files written where the cache puts them), then
its cap is halved: one process reads a new object (its miss evicts half the entries) while
another process, started at the same instant, reads another new object. Also timed:
``fsspec-shards cache info`` and ``cache ls`` (fresh processes), and a hit's ``open`` with
1,000 entries and with ``entries``.

    python benchmarks/bench_eviction.py [--entries 100000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import hashlib
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time

from report import print_results

from fsspec_shards.storage.backends import ObjectId
from fsspec_shards.storage.cache import ShardCache, layout

ENTRY_SIZE = 1024
SMALL_CACHE = 1000
OPENS = 1000


def object_of(name: str) -> ObjectId:
    return ObjectId(hashlib.sha256(name.encode()).hexdigest(), f"s3://bench/{name}")


def build(directory: str, entries: int) -> int:
    """A cache of ``entries`` files of :data:`ENTRY_SIZE` bytes, least recently used
    first in name order; its bytes."""
    cache = ShardCache(directory, entries * ENTRY_SIZE)
    data = b"x" * ENTRY_SIZE
    records = []
    now = time.time()
    for number in range(entries):
        obj = object_of(f"entry-{number}")
        relative = layout.new_data_file(obj.key)
        path = os.path.join(directory, relative)
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
        os.write(descriptor, data)
        os.close(descriptor)
        record = {"file": relative, "size": ENTRY_SIZE, "shown": obj.shown, "metadata": {}}
        records.append((obj.key, {**record, "stored_at": now, "validated_at": now}))
    cache._index.adopt(records, {}, {})
    os.sync()  # the files on disk, as a cache's are: the eviction below is not timing writeback
    return entries * ENTRY_SIZE


def _read(directory: str, limit: int, name: str, barrier, delay: float, results) -> None:
    """A process reading ``name`` (a miss) right after the barrier: its end time."""
    cache = ShardCache(directory, limit)
    obj = object_of(name)
    barrier.wait()
    time.sleep(delay)
    with cache.fetch(obj, lambda file: file.write(b"y" * ENTRY_SIZE) and {}) as handle:
        handle.read()
    results.put((name, time.time()))


def halve(directory: str, total: int) -> dict[str, float]:
    """Seconds from the start until the evicting read and a concurrent miss end."""
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(3), context.Queue()
    processes = [
        context.Process(target=_read, args=(directory, total // 2, name, barrier, delay, results))
        for name, delay in (("evicting", 0.0), ("concurrent", 0.05))
    ]
    for process in processes:
        process.start()
    barrier.wait()
    started = time.time()
    ends = dict(results.get(timeout=600) for _ in processes)
    for process in processes:
        process.join(60)
    return {name: end - started for name, end in ends.items()}


def command_seconds(*args: str) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "fsspec_shards", *args], check=True, capture_output=True)
    return time.perf_counter() - started


def open_seconds(directory: str, entries: int) -> float:
    """Median seconds of one hit's ``open`` (a fresh cache object, every entry once)."""
    cache = ShardCache(directory, entries * ENTRY_SIZE)
    times = []
    for number in range(0, entries, max(1, entries // OPENS)):
        obj = object_of(f"entry-{number}")
        started = time.perf_counter()
        handle = cache.open(obj)
        times.append(time.perf_counter() - started)
        handle.close()
    cache.flush()
    return statistics.median(times)


def run(rounds: int = 3, entries: int = 100_000) -> dict[str, dict[str, float]]:
    evicting, concurrent, info, listing, open_small, open_large = [], [], [], [], [], []
    for _ in range(rounds):
        with tempfile.TemporaryDirectory(prefix="bench-eviction-") as workdir:
            small, large = os.path.join(workdir, "small"), os.path.join(workdir, "large")
            build(small, SMALL_CACHE)
            total = build(large, entries)
            open_small.append(open_seconds(small, SMALL_CACHE))
            open_large.append(open_seconds(large, entries))
            info.append(command_seconds("cache", "info", "--cache-dir", large))
            listing.append(command_seconds("cache", "ls", "--cache-dir", large))
            ends = halve(large, total)
            evicting.append(ends["evicting"])
            concurrent.append(ends["concurrent"])
    open_1k, open_n = statistics.median(open_small), statistics.median(open_large)
    return {
        f"halve_cap_of_{entries}_entries": {
            "evicting_read_s": statistics.median(evicting),
            "concurrent_miss_s": statistics.median(concurrent),
            "cache_info_s": statistics.median(info),
            "cache_ls_s": statistics.median(listing),
            "open_us_at_1000": open_1k * 1e6,
            f"open_us_at_{entries}": open_n * 1e6,
            "open_1000_vs_many": open_1k / open_n,
        }
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--entries", type=int, default=100_000)
    args = parser.parse_args()
    print_results(run(args.rounds, args.entries))


if __name__ == "__main__":
    main()
