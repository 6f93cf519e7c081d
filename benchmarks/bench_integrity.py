"""Benchmark the cost of verification on cold downloads through wds:: (cache misses).

The source is local disk, the fastest backend there is, so hashing shows at its largest:
over a network the download dominates. Two cases: cold downloads into a fresh cache (which
adds writing and syncing the cached copy) and streamed reads with ``cache=False`` (no disk
writes, so the hashing cost stands out). Each setting runs once per round, interleaved in
an order that rotates from round to round: ``verify=False``, ``verify="size"``, and
``verify="auto"`` with a manifest of sha256, md5 or crc32c checksums.

    python benchmarks/bench_integrity.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import tempfile
import time

import fsspec
import google_crc32c
from report import print_results

FILES = 4
FILE_SIZE = 32 << 20
READ_CHUNK = 4 << 20

SETTINGS = {
    "off": {"verify": False},
    "size": {"verify": "size"},
    "sha256": {"verify": "auto", "checksums": "sha256"},
    "md5": {"verify": "auto", "checksums": "md5"},
    "crc32c": {"verify": "auto", "checksums": "crc32c"},
}


def digest(path: str, algorithm: str) -> str:
    with open(path, "rb") as handle:
        data = handle.read()
    if algorithm == "crc32c":
        return f"crc32c:{google_crc32c.value(data):08x}"
    return f"{algorithm}:{hashlib.new(algorithm, data).hexdigest()}"


def wds_filesystem(options: dict, manifests: dict, **extra) -> fsspec.AbstractFileSystem:
    """A fresh wds filesystem over local files with one verification setting."""
    settings = dict(options)
    if "checksums" in settings:
        settings["checksums"] = manifests[settings["checksums"]]
    return fsspec.filesystem(
        "wds", target_protocol="file", skip_instance_cache=True, **settings, **extra
    )


def cold_fetch(paths: list[str], workdir: str, options: dict, manifests: dict) -> float:
    """Seconds to download every file into an empty cache with ``options``."""
    cache_dir = tempfile.mkdtemp(dir=workdir)
    fs = wds_filesystem(options, manifests, cache_dir=cache_dir)
    started = time.perf_counter()
    for path in paths:
        fs.prefetch(path)
    elapsed = time.perf_counter() - started
    stats = fs.cache_stats()
    shutil.rmtree(cache_dir)
    if stats["misses"] != len(paths) or stats["integrity_failures"]:
        raise RuntimeError(f"unexpected cache counters: {stats}")
    return elapsed


def streamed_read(paths: list[str], workdir: str, options: dict, manifests: dict) -> float:
    """Seconds to read every file through ``cache=False`` (no disk writes) with ``options``."""
    fs = wds_filesystem(options, manifests, cache=False)
    started = time.perf_counter()
    for path in paths:
        with fs.open(path, "rb") as handle:
            while handle.read(READ_CHUNK):
                pass
    return time.perf_counter() - started


def measure(read, paths: list[str], workdir: str, manifests: dict, rounds: int) -> dict:
    """Medians of each setting, interleaved in an order rotating from round to round."""
    times: dict[str, list[float]] = {name: [] for name in SETTINGS}
    names = list(SETTINGS)
    for round_number in range(rounds):
        shift = round_number % len(names)
        for name in names[shift:] + names[:shift]:
            times[name].append(read(paths, workdir, SETTINGS[name], manifests))
    medians = {name: statistics.median(values) for name, values in times.items()}
    megabytes = FILES * FILE_SIZE / 1e6
    result = {f"{name}_mb_per_s": megabytes / seconds for name, seconds in medians.items()}
    for name in SETTINGS:
        if name != "off":
            result[f"{name}_vs_off"] = medians["off"] / medians[name]
    return result


def run(rounds: int = 5, directory: str | None = None) -> dict[str, dict[str, float]]:
    """``{"cold_download_4x32MiB" | "streamed_read_4x32MiB": {<setting>_mb_per_s,
    <setting>_vs_off}}``."""
    with tempfile.TemporaryDirectory(dir=directory) as workdir:
        paths = []
        for index in range(FILES):
            path = os.path.join(workdir, f"file-{index}.bin")
            with open(path, "wb") as handle:
                handle.write(os.urandom(FILE_SIZE))
            paths.append(path)
        manifests = {
            algorithm: {path: digest(path, algorithm) for path in paths}
            for algorithm in ("sha256", "md5", "crc32c")
        }
        return {
            "cold_download_4x32MiB": measure(cold_fetch, paths, workdir, manifests, rounds),
            "streamed_read_4x32MiB": measure(streamed_read, paths, workdir, manifests, rounds),
        }


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved repeats (default 5)")
    results = run(parser.parse_args(argv).rounds)
    print_results(results)
    return results


if __name__ == "__main__":
    main()
