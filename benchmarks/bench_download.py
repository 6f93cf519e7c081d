"""Benchmark cold downloads over the network path: nginx (http) and moto (s3) on loopback.

Where ``bench_integrity.py`` reads local files (``cat_file`` under the hood), this one goes
through the streaming transports: ranged GETs on the backend's event loop, every response
checked against the object's version. Two cases per backend: cold downloads into a fresh
cache (``prefetch``) and streamed reads with ``cache=False``. The backends run interleaved,
in an order that rotates from round to round.

    python benchmarks/bench_download.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import fsspec  # noqa: E402
from report import print_results  # noqa: E402

from tests.integration import servers  # noqa: E402

FILES = 4
FILE_SIZE = 32 << 20
READ_CHUNK = 4 << 20


def cold_fetch(backend: servers.Backend, urls: list[str], workdir: str) -> float:
    """Seconds to download every file into an empty cache."""
    cache_dir = tempfile.mkdtemp(dir=workdir)
    fs = fsspec.filesystem(
        "wds",
        target_protocol=backend.protocol,
        target_options=backend.storage_options,
        skip_instance_cache=True,
        cache_dir=cache_dir,
    )
    fs.info(urls[0])  # the client is set up (an S3 client takes a while) before timing
    started = time.perf_counter()
    for url in urls:
        fs.prefetch(url)
    elapsed = time.perf_counter() - started
    misses = fs.cache_stats()["misses"]
    shutil.rmtree(cache_dir)
    if misses != len(urls):
        raise RuntimeError(f"expected {len(urls)} downloads, counted {misses}")
    return elapsed


def streamed_read(backend: servers.Backend, urls: list[str], workdir: str) -> float:
    """Seconds to read every file through ``cache=False``."""
    fs = fsspec.filesystem(
        "wds",
        target_protocol=backend.protocol,
        target_options=backend.storage_options,
        skip_instance_cache=True,
        cache=False,
    )
    fs.info(urls[0])
    started = time.perf_counter()
    for url in urls:
        with fs.open(url, "rb") as handle:
            while handle.read(READ_CHUNK):
                pass
    return time.perf_counter() - started


def run(rounds: int = 5, directory: str | None = None) -> dict[str, dict[str, float]]:
    """``{"cold_download_4x32MiB": {...MB/s}, "streamed_read_4x32MiB": {...MB/s}}``."""
    with tempfile.TemporaryDirectory(dir=directory) as workdir:
        http_service = servers.start_http(Path(workdir, "nginx"))
        s3_service = servers.start_s3(Path(workdir, "s3"))
        try:
            backends = {
                "http": http_service.backend(servers.unique_prefix()),
                "s3": s3_service.backend(servers.unique_prefix()),
            }
            urls = {
                name: [
                    backend.put(f"file-{index}.bin", os.urandom(FILE_SIZE))
                    for index in range(FILES)
                ]
                for name, backend in backends.items()
            }
            cases = {"cold_download_4x32MiB": cold_fetch, "streamed_read_4x32MiB": streamed_read}
            times = {case: {name: [] for name in backends} for case in cases}
            names = list(backends)
            for round_number in range(rounds):
                shift = round_number % len(names)
                for name in names[shift:] + names[:shift]:
                    for case, measure in cases.items():
                        times[case][name].append(measure(backends[name], urls[name], workdir))
        finally:
            http_service.stop()
            s3_service.stop()
    megabytes = FILES * FILE_SIZE / 1e6
    return {
        case: {
            f"{name}_mb_per_s": megabytes / statistics.median(values) for name, values in by.items()
        }
        for case, by in times.items()
    }


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved repeats (default 5)")
    results = run(parser.parse_args(argv).rounds)
    print_results(results)
    return results


if __name__ == "__main__":
    main()
