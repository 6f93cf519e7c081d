"""Benchmark ShardWriter against webdataset 1.0.2's ShardWriter, and MixedDataset's cost.

Writing: the same samples (a 1 KiB ``.bin``, a ``.cls`` int and a ``.json`` dict, or a
1 MiB ``.bin``) written to local shards of 2,000 samples by both writers. Ours also hashes
every byte, syncs and renames each shard and writes SHA256SUMS and the counts on close: with
large samples that work (fsync and SHA-256 of every byte) is most of its time.
Mixing: iterating two small-sample ShardDatasets through a MixedDataset against iterating
the same samples from the datasets directly. Runs are interleaved round by round; medians
and ratios of medians are reported.

    python benchmarks/bench_writer.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator

from report import print_results

from fsspec_shards import MixedDataset, ShardDataset, ShardWriter

SMALL_SAMPLES = 10_000
SMALL_SIZE = 1024
LARGE_SAMPLES = 100
LARGE_SIZE = 1 << 20
SHARD_SAMPLES = 2_000


def samples(count: int, size: int) -> Iterator[dict]:
    payload = os.urandom(size)
    for index in range(count):
        key = f"s{index:08d}"
        yield {"__key__": key, "bin": payload, "cls": index % 1000, "json": {"i": index}}


def write_ours(directory: str, count: int, size: int) -> int:
    with ShardWriter(os.path.join(directory, "ours-%06d.tar"), max_count=SHARD_SAMPLES) as writer:
        for sample in samples(count, size):
            writer.write(sample)
    return sum(shard.samples for shard in writer.shards)


def write_webdataset(directory: str, count: int, size: int) -> int:
    import webdataset

    pattern = os.path.join(directory, "wds-%06d.tar")
    with open(os.devnull, "w") as quiet:
        stdout, sys.stdout = sys.stdout, quiet  # its ShardWriter prints a line per shard
        try:
            with webdataset.ShardWriter(pattern, maxcount=SHARD_SAMPLES) as writer:
                for sample in samples(count, size):
                    writer.write(sample)
        finally:
            sys.stdout = stdout
    return count


def measure_writers(count: int, size: int, rounds: int, directory: str | None) -> dict:
    writers: dict[str, Callable[[str, int, int], int]] = {
        "ours": write_ours,
        "webdataset": write_webdataset,
    }
    times: dict[str, list[float]] = {name: [] for name in writers}
    for round_ in range(rounds + 1):  # the first round warms up imports and the page cache
        for name, write in writers.items():
            with tempfile.TemporaryDirectory(dir=directory) as workdir:
                started = time.perf_counter()
                written = write(workdir, count, size)
                elapsed = time.perf_counter() - started
            if written != count:
                raise RuntimeError(f"{name} wrote {written} samples, expected {count}")
            if round_:
                times[name].append(elapsed)
    medians = {name: statistics.median(values) for name, values in times.items()}
    result = {f"{name}_samples_per_s": count / seconds for name, seconds in medians.items()}
    result["ours_mb_per_s"] = count * size / medians["ours"] / 1e6
    result["ours_vs_webdataset"] = medians["webdataset"] / medians["ours"]
    return result


def measure_mixing(rounds: int, directory: str | None) -> dict:
    with tempfile.TemporaryDirectory(dir=directory) as workdir:
        sources = []
        for name in ("a", "b"):
            os.mkdir(os.path.join(workdir, name))
            with ShardWriter(os.path.join(workdir, name, "s-%04d.tar"), SHARD_SAMPLES) as writer:
                for sample in samples(SMALL_SAMPLES, SMALL_SIZE):
                    writer.write(sample)
            sources.append([shard.url for shard in writer.shards])

        def direct() -> int:
            datasets = [ShardDataset(urls, shuffle_shards=False, prefetch=0) for urls in sources]
            return sum(1 for dataset in datasets for _ in dataset)

        def mixed() -> int:
            datasets = [ShardDataset(urls, shuffle_shards=False, prefetch=0) for urls in sources]
            return sum(1 for _ in MixedDataset(datasets, [0.5, 0.5], stop="all_exhausted"))

        readers = {"direct": direct, "mixed": mixed}
        times: dict[str, list[float]] = {name: [] for name in readers}
        for round_ in range(rounds + 1):
            for name, read in readers.items():
                started = time.perf_counter()
                count = read()
                if count != 2 * SMALL_SAMPLES:
                    raise RuntimeError(f"{name} read {count} samples")
                if round_:
                    times[name].append(time.perf_counter() - started)
    medians = {name: statistics.median(values) for name, values in times.items()}
    result = {f"{name}_samples_per_s": 2 * SMALL_SAMPLES / s for name, s in medians.items()}
    result["mixed_vs_direct"] = medians["direct"] / medians["mixed"]
    return result


def run(rounds: int = 5, directory: str | None = None) -> dict[str, dict[str, float]]:
    """``{"write_small_1KiB": {...}, "write_large_1MiB": {...}, "mix_two_sources": {...}}``."""
    return {
        "write_small_1KiB": measure_writers(SMALL_SAMPLES, SMALL_SIZE, rounds, directory),
        "write_large_1MiB": measure_writers(LARGE_SAMPLES, LARGE_SIZE, rounds, directory),
        "mix_two_sources": measure_mixing(rounds, directory),
    }


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved repeats (default 5)")
    results = run(parser.parse_args(argv).rounds)
    print_results(results)
    return results


if __name__ == "__main__":
    main()
