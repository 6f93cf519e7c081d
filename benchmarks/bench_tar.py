"""Benchmark the tar reader against webdataset 1.0.2, a plain tarfile loop and raw read().

Builds three shards in a temporary directory: small samples (a 1 KiB ``.bin`` plus a short
``.cls``), the same gzip-compressed (through the decompression-bomb guard), and large
samples (a 1 MiB ``.bin`` plus a ``.cls``). A fourth case reads a shard of small text-like
samples (1 KiB of seeded random words each, every sample different: about 3x compressible)
as a plain tar, gzip (level 6) and zstd (level 3, as ``ShardWriter`` writes ``.tar.zst``)
with our reader alone (webdataset does not read zstd). Each reader turns a shard into sample dicts
without decoding; ``dataset`` is the whole epoch path, ``ShardDataset`` over ``wds::file://``
with a warm cache (verification on). Runs are interleaved (every reader once per round) so
that machine load hits them alike; the medians are reported with their ratios.

    python benchmarks/bench_tar.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import gzip
import io
import os
import random
import statistics
import tarfile
import tempfile
import time
from collections.abc import Callable

from report import print_results

from fsspec_shards.iteration import zstd
from fsspec_shards.iteration.samples import group_samples, to_dict
from fsspec_shards.iteration.tar import iter_members, open_shard_stream

SMALL_SAMPLES = 20_000
SMALL_SIZE = 1024
LARGE_SAMPLES = 150
LARGE_SIZE = 1 << 20
READ_CHUNK = 1 << 20


def write_shard(path: str, samples: int, payload_size: int) -> None:
    """Write a shard of ``samples`` two-file samples with a ``payload_size`` .bin member."""
    payload = os.urandom(payload_size)
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for index in range(samples):
            for extension, data in (("bin", payload), ("cls", str(index % 1000).encode())):
                info = tarfile.TarInfo(f"sample{index:08d}.{extension}")
                info.size = len(data)
                info.mtime = 1_700_000_000
                tar.addfile(info, io.BytesIO(data))


def write_text_shard(path: str, samples: int, payload_size: int) -> None:
    """A shard of ``samples`` samples, each ``payload_size`` bytes of seeded random words."""
    words = [bytes(random.Random(n).choices(b"etaoinshrdlu", k=1 + n % 9)) for n in range(500)]
    chooser = random.Random(0)
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for index in range(samples):
            text = b" ".join(chooser.choices(words, k=payload_size // 4))[:payload_size]
            info = tarfile.TarInfo(f"sample{index:08d}.txt")
            info.size = len(text)
            info.mtime = 1_700_000_000
            tar.addfile(info, io.BytesIO(text))


def count_ours(path: str) -> int:
    with open(path, "rb", buffering=0) as raw:
        stream = open_shard_stream(raw, path)
        return sum(1 for _ in map(to_dict, group_samples(iter_members(stream, path), path)))


def count_dataset(path: str) -> int:
    """The whole epoch path: ``ShardDataset`` over ``wds::file://`` with a warm cache
    (verification on), one shard, no shuffle buffer."""
    from fsspec_shards import ShardDataset

    options = {"wds": {"cache_dir": os.path.join(os.path.dirname(path), "cache")}}
    dataset = ShardDataset(f"wds::file://{path}", storage_options=options, prefetch=0)
    return sum(1 for _ in dataset)


def count_webdataset(path: str) -> int:
    from webdataset.tariterators import group_by_keys, tar_file_expander

    with open(path, "rb") as stream:
        return sum(1 for _ in group_by_keys(tar_file_expander([{"url": path, "stream": stream}])))


def count_tarfile(path: str) -> int:
    members = 0
    with tarfile.open(path, "r|*") as tar:
        for info in tar:
            if info.isreg():
                tar.extractfile(info).read()
                members += 1
    return members // 2


def read_raw(path: str) -> int:
    with open(path, "rb", buffering=0) as raw:
        total = 0
        while chunk := raw.read(READ_CHUNK):
            total += len(chunk)
    return total


def _time(function: Callable[[str], int], path: str) -> tuple[float, int]:
    started = time.perf_counter()
    result = function(path)
    return time.perf_counter() - started, result


def measure(path: str, samples: int, rounds: int) -> dict[str, float]:
    """Median samples/s of each reader on one shard, interleaved over ``rounds`` rounds."""
    readers = {
        "ours": count_ours,
        "dataset": count_dataset,
        "webdataset": count_webdataset,
        "tarfile": count_tarfile,
    }
    times: dict[str, list[float]] = {name: [] for name in [*readers, "raw_read"]}
    size = os.path.getsize(path)
    read_raw(path)
    for reader in readers.values():  # untimed warm-up: imports, page cache, allocator
        reader(path)
    for _ in range(rounds):
        for name, reader in readers.items():
            elapsed, count = _time(reader, path)
            if count != samples:
                raise RuntimeError(f"{name} read {count} samples, expected {samples}")
            times[name].append(elapsed)
        elapsed, count = _time(read_raw, path)
        if count != size:
            raise RuntimeError(f"raw read got {count} bytes, expected {size}")
        times["raw_read"].append(elapsed)
    medians = {name: statistics.median(values) for name, values in times.items()}
    result = {f"{name}_samples_per_s": samples / seconds for name, seconds in medians.items()}
    result["raw_read_mb_per_s"] = size / medians["raw_read"] / 1e6
    result["ours_mb_per_s"] = size / medians["ours"] / 1e6
    result["ours_vs_webdataset"] = medians["webdataset"] / medians["ours"]
    result["ours_vs_tarfile"] = medians["tarfile"] / medians["ours"]
    result["ours_vs_raw_read"] = medians["raw_read"] / medians["ours"]
    result["dataset_vs_raw_read"] = medians["raw_read"] / medians["dataset"]
    return result


def measure_compression(paths: dict[str, str], samples: int, rounds: int) -> dict[str, float]:
    """Median samples/s of our reader over the same tar plain, gzip and zstd, interleaved."""
    times: dict[str, list[float]] = {name: [] for name in paths}
    for path in paths.values():  # untimed warm-up
        count_ours(path)
    for _ in range(rounds):
        for name, path in paths.items():
            elapsed, count = _time(count_ours, path)
            if count != samples:
                raise RuntimeError(f"{name} read {count} samples, expected {samples}")
            times[name].append(elapsed)
    medians = {name: statistics.median(values) for name, values in times.items()}
    tar_size = os.path.getsize(paths["plain"])
    result = {f"{name}_samples_per_s": samples / seconds for name, seconds in medians.items()}
    result.update({f"{name}_tar_mb_per_s": tar_size / s / 1e6 for name, s in medians.items()})
    for name, path in paths.items():
        result[f"{name}_file_mb"] = os.path.getsize(path) / 1e6
    result["zstd_vs_gzip"] = medians["gzip"] / medians["zstd"]
    result["zstd_vs_plain"] = medians["plain"] / medians["zstd"]
    result["gzip_vs_plain"] = medians["plain"] / medians["gzip"]
    return result


def run(
    rounds: int = 5,
    directory: str | None = None,
    small_samples: int = SMALL_SAMPLES,
    large_samples: int = LARGE_SAMPLES,
) -> dict[str, dict[str, float]]:
    """Build the shards and measure all readers: ``{"small_1KiB": {...}, ...}``."""
    with tempfile.TemporaryDirectory(dir=directory) as workdir:
        small = os.path.join(workdir, "small.tar")
        small_gz = os.path.join(workdir, "small.tar.gz")
        large = os.path.join(workdir, "large.tar")
        write_shard(small, small_samples, SMALL_SIZE)
        with open(small, "rb") as plain, gzip.open(small_gz, "wb", compresslevel=6) as packed:
            packed.write(plain.read())
        text = os.path.join(workdir, "text.tar")
        write_text_shard(text, small_samples, SMALL_SIZE)
        with open(text, "rb") as plain, gzip.open(text + ".gz", "wb", compresslevel=6) as packed:
            packed.write(plain.read())
        with open(text, "rb") as plain, open(text + ".zst", "wb") as target:
            packed = zstd.open_writer(target)
            packed.write(plain.read())
            packed.close()
        write_shard(large, large_samples, LARGE_SIZE)
        compressed = {"plain": text, "gzip": text + ".gz", "zstd": text + ".zst"}
        return {
            "small_1KiB": measure(small, small_samples, rounds),
            "small_1KiB_gz": measure(small_gz, small_samples, rounds),
            "large_1MiB": measure(large, large_samples, rounds),
            "text_1KiB_plain_gzip_zstd": measure_compression(compressed, small_samples, rounds),
        }


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved repeats (default 5)")
    parser.add_argument("--small-samples", type=int, default=SMALL_SAMPLES)
    parser.add_argument("--large-samples", type=int, default=LARGE_SAMPLES)
    arguments = parser.parse_args(argv)
    results = run(
        arguments.rounds,
        small_samples=arguments.small_samples,
        large_samples=arguments.large_samples,
    )
    print_results(results)
    return results


if __name__ == "__main__":
    main()
