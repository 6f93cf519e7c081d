"""Benchmark reads of cached files: wds:: vs plain local reads vs fsspec simplecache/filecache.

Every cache is warmed first, so each round measures cache hits only: the cost of finding
the cached copy and reading it. Three cases: whole-file sequential reads of a few large files
(throughput); opening many small files through filesystem instances to read a little of
each (per-open overhead, where a cache index lookup shows); and the same through
``fsspec.open("wds::file://...")`` URLs, the whole open path a user's code takes (URL
parsing, filesystem instance lookup, identity, cache), next to Python's own ``open()``.
Readers run interleaved, once per round, in an order that rotates from round to round.

    python benchmarks/bench_cache.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import BinaryIO

import fsspec
from report import print_results

LARGE_FILES = 4
LARGE_SIZE = 32 << 20
SMALL_FILES = 300
SMALL_SIZE = 64 << 10
SMALL_READ = 4096
READ_CHUNK = 1 << 20


def make_files(directory: str, count: int, size: int) -> list[str]:
    os.makedirs(directory, exist_ok=True)
    paths = []
    for index in range(count):
        path = os.path.join(directory, f"file-{index:05d}.bin")
        with open(path, "wb") as handle:
            handle.write(os.urandom(size))
        paths.append(path)
    return paths


Opener = Callable[[str], BinaryIO]


def filesystems(workdir: str) -> dict[str, Opener]:
    """The readers compared, each with a cache directory of its own: ``fs.open``."""
    instances = {
        "local": fsspec.filesystem("file"),
        "wds": fsspec.filesystem(
            "wds",
            target_protocol="file",
            cache_dir=os.path.join(workdir, "wds-cache"),
            skip_instance_cache=True,
        ),
        "simplecache": fsspec.filesystem(
            "simplecache",
            target_protocol="file",
            cache_storage=os.path.join(workdir, "simplecache"),
            skip_instance_cache=True,
        ),
        "filecache": fsspec.filesystem(
            "filecache",
            target_protocol="file",
            cache_storage=os.path.join(workdir, "filecache"),
            skip_instance_cache=True,
        ),
    }
    return {name: functools.partial(fs.open, mode="rb") for name, fs in instances.items()}


def url_openers(workdir: str) -> dict[str, Opener]:
    """The same caches reached as users do: ``fsspec.open(chained URL, **options)``."""
    options = {
        "wds": {"wds": {"cache_dir": os.path.join(workdir, "wds-url-cache")}},
        "simplecache": {"simplecache": {"cache_storage": os.path.join(workdir, "simple-url")}},
        "filecache": {"filecache": {"cache_storage": os.path.join(workdir, "file-url")}},
    }

    def through_fsspec(name: str) -> Opener:
        return lambda path: fsspec.open(f"{name}::file://{path}", "rb", **options[name]).open()

    return {"plain": functools.partial(open, mode="rb")} | {
        name: through_fsspec(name) for name in options
    }


def read_whole(open_file: Opener, paths: list[str]) -> int:
    total = 0
    for path in paths:
        with open_file(path) as handle:
            while chunk := handle.read(READ_CHUNK):
                total += len(chunk)
    return total


def read_heads(open_file: Opener, paths: list[str]) -> int:
    total = 0
    for path in paths:
        with open_file(path) as handle:
            total += len(handle.read(SMALL_READ))
    return total


def measure(
    readers: dict[str, Opener],
    read: Callable[[Opener, list[str]], int],
    paths: list[str],
    expected: int,
    rounds: int,
) -> dict[str, list[float]]:
    """Seconds per round of each reader over ``paths``, after one warming pass each."""
    for name, fs in readers.items():
        if read(fs, paths) != expected:
            raise RuntimeError(f"{name} read the wrong number of bytes while warming")
    times: dict[str, list[float]] = {name: [] for name in readers}
    names = list(readers)
    for round_number in range(rounds):
        shift = round_number % len(names)
        for name in names[shift:] + names[:shift]:
            fs = readers[name]
            started = time.perf_counter()
            count = read(fs, paths)
            times[name].append(time.perf_counter() - started)
            if count != expected:
                raise RuntimeError(f"{name} read {count} bytes, expected {expected}")
    return times


def summarize(times: dict[str, list[float]], unit: str, amount: float) -> dict[str, float]:
    """Rates from median times, and ``wds_vs_X``: the median over rounds of X's time over
    wds's time in the same round (above 1, wds is faster)."""
    medians = {name: statistics.median(values) for name, values in times.items()}
    result = {f"{name}_{unit}": amount / seconds for name, seconds in medians.items()}
    for name in times:
        if name != "wds":
            ratios = [other / ours for other, ours in zip(times[name], times["wds"], strict=True)]
            result[f"wds_vs_{name}"] = statistics.median(ratios)
    return result


def run(rounds: int = 5, directory: str | None = None) -> dict[str, dict[str, float]]:
    """``{"whole_32MiB_files": {...MB/s and ratios}, "open_64KiB_files": {...opens/s},
    "fsspec_open_64KiB_files": {...opens/s}}``."""
    with tempfile.TemporaryDirectory(dir=directory) as workdir:
        large = make_files(os.path.join(workdir, "large"), LARGE_FILES, LARGE_SIZE)
        small = make_files(os.path.join(workdir, "small"), SMALL_FILES, SMALL_SIZE)
        readers = filesystems(workdir)
        whole = measure(readers, read_whole, large, LARGE_FILES * LARGE_SIZE, rounds)
        heads = measure(readers, read_heads, small, SMALL_FILES * SMALL_READ, rounds)
        urls = measure(url_openers(workdir), read_heads, small, SMALL_FILES * SMALL_READ, rounds)
        return {
            "whole_32MiB_files": summarize(whole, "mb_per_s", LARGE_FILES * LARGE_SIZE / 1e6),
            "open_64KiB_files": summarize(heads, "opens_per_s", SMALL_FILES),
            "fsspec_open_64KiB_files": summarize(urls, "opens_per_s", SMALL_FILES),
        }


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved repeats (default 5)")
    results = run(parser.parse_args(argv).rounds)
    print_results(results)
    return results


if __name__ == "__main__":
    main()
