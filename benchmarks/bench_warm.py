"""Benchmark warm cache hits on S3: ``wds::s3://`` vs ``wds::file://`` vs ``open()`` vs
``simplecache::s3://``.

One object in moto's S3 server (a process of its own, on loopback) and a local copy of it.
Every cache is warmed first, so each round measures hits only: the whole path a user's
code takes (``fsspec.open`` of a URL: URL parsing, the filesystem instance, identity, the
cache lookup) and a read of the whole file to its end (``bench_cold.read_through``, 1 MiB
at a time into one buffer). Readers run interleaved, once per round, in an order that
rotates from round to round; the table gives median milliseconds and the medians of the
per-round ratios to ``open()`` of the local copy and to ``simplecache::s3://`` (above 1:
faster). The readers:

- ``plain_open``: Python's ``open()`` of the local copy
- ``cached_copy_open``: ``open()`` of the file in the ``wds`` cache: the same read on the
  cache's own copy, which tells the open path from the file
- ``wds_file``: ``fsspec.open("wds::file://<local copy>")``
- ``wds_s3``: ``fsspec.open("wds::s3://...")`` with the cache warm (the defaults: no round
  trip to the store on a hit, see docs/cache.md)
- ``simplecache_s3``: ``fsspec.open("simplecache::s3://...")`` with its cache warm

    python benchmarks/bench_warm.py [--rounds 9] [--mib 256] [--quick]
"""

from __future__ import annotations

import argparse
import glob
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for entry in (str(ROOT), str(HERE)):
    if entry not in sys.path:
        sys.path.insert(0, entry)

import bench_cold  # noqa: E402
import fsspec  # noqa: E402

Reader = Callable[[], None]


def readers(setup: bench_cold.Setup, workdir: str) -> dict[str, Reader]:
    """The readers compared, every cache warm."""
    url = setup.urls[0]
    local = os.path.join(workdir, "local-copy.bin")
    with fsspec.open(url, "rb", **setup.options) as source, open(local, "wb") as out:
        while piece := source.read(8 << 20):
            out.write(piece)
    wds_cache = os.path.join(workdir, "wds-cache")
    wds_file_cache = os.path.join(workdir, "wds-file-cache")
    simple_cache = os.path.join(workdir, "simplecache")
    backend = {"s3": setup.options}

    def opened(path: str) -> Reader:
        def read() -> None:
            with open(path, "rb") as handle:
                bench_cold.read_through(handle)

        return read

    def through_fsspec(chained: str, **options: object) -> Reader:
        def read() -> None:
            with fsspec.open(chained, "rb", **options) as handle:
                bench_cold.read_through(handle)

        return read

    chosen = {
        "plain_open": opened(local),
        "wds_file": through_fsspec(f"wds::file://{local}", wds={"cache_dir": wds_file_cache}),
        "wds_s3": through_fsspec(f"wds::{url}", wds={"cache_dir": wds_cache}, **backend),
        "simplecache_s3": through_fsspec(
            f"simplecache::{url}", simplecache={"cache_storage": simple_cache}, **backend
        ),
    }
    for read in chosen.values():  # warm every cache (and the page cache)
        read()
    cached = glob.glob(os.path.join(wds_cache, "files", "*", "*"))
    if len(cached) != 1:
        raise RuntimeError(f"expected one file in the wds cache, found {cached}")
    chosen["cached_copy_open"] = opened(cached[0])
    chosen["cached_copy_open"]()
    return chosen


def measure(chosen: dict[str, Reader], rounds: int) -> dict[str, dict[str, float]]:
    """``{reader: {ms, vs_plain_open, vs_simplecache_s3}}``: medians over the rounds."""
    names = list(chosen)
    times: dict[str, list[float]] = {name: [] for name in names}
    for round_number in range(rounds):
        shift = round_number % len(names)
        for name in names[shift:] + names[:shift]:
            started = time.perf_counter()
            chosen[name]()
            times[name].append(time.perf_counter() - started)
    return {
        name: {
            "ms": 1000 * statistics.median(times[name]),
            "vs_plain_open": statistics.median(
                other / own for other, own in zip(times["plain_open"], times[name], strict=True)
            ),
            "vs_simplecache_s3": statistics.median(
                other / own for other, own in zip(times["simplecache_s3"], times[name], strict=True)
            ),
        }
        for name in names
    }


def run(rounds: int = 9, mib: int = 256, directory: str | None = None) -> dict:
    """``{"moto <reader>": {ms, vs_plain_open, vs_simplecache_s3}}``."""
    with tempfile.TemporaryDirectory(prefix="bench-warm-", dir=directory) as workdir:
        with bench_cold.moto_process(workdir) as endpoint:
            setup = bench_cold.s3_setup(endpoint, 1, mib, workdir)
            results = measure(readers(setup, workdir), rounds)
    return {f"moto {name}": values for name, values in results.items()}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9, help="interleaved repeats (default 9)")
    parser.add_argument("--mib", type=int, default=256, help="MiB of the object (default 256)")
    parser.add_argument("--quick", action="store_true", help="5 rounds of 64 MiB")
    arguments = parser.parse_args(argv)
    rounds, mib = (5, 64) if arguments.quick else (arguments.rounds, arguments.mib)
    results = run(rounds, mib)
    print(f"\nwarm hits, one object of {mib} MiB, {rounds} rounds (medians)\n")
    print("| reader | ms | vs open() | vs simplecache::s3 |")
    print("|---|---:|---:|---:|")
    for case, values in results.items():
        print(
            f"| {case.split(' ', 1)[1]} | {values['ms']:.1f} | {values['vs_plain_open']:.2f}x "
            f"| {values['vs_simplecache_s3']:.2f}x |"
        )
    return results


if __name__ == "__main__":
    main()
