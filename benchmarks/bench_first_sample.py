"""Benchmark the first sample of a cold shard from a far store, and the whole shard.

One tar shard of 1 MiB samples (128 MiB by default) lies on nginx behind
``pacing_proxy.py`` (a process of its own: 25 MB/s per connection, +20 ms per connection and
per request by default, like a far object store). Each round every reader reads the shard
cold (a fresh cache directory), in an order that rotates from round to round, and the times
to its first sample and to its last are taken. The cache directory of the ``wds`` readers
exists and is empty (a node that has run before; making a new one costs 0.05-0.4 s more on
this machine, mostly the index's SQLite set-up). Readers:

- ``webdataset``: webdataset 1.0.2 streaming, ``webdataset.WebDataset(url)`` over http
  (curl; nothing verified)
- ``wds_blocks``: ``ShardDataset("wds::http://...")`` with ``checksums=SHA256SUMS`` and the
  block manifest beside it, written by ``fsspec-shards manifest --blocks``: each block is
  handed out as soon as it is verified
- ``wds_whole``: the same with a manifest that has no block manifest beside it: the whole
  shard is verified before the first sample (today's rule without blocks)
- ``wds_blocks_4_ranges``: ``wds_blocks`` with ``ranges_in_flight=4`` (what a block fill
  does under ``ranges_in_flight="auto"``): spans of 16 MiB on 4 connections, the extra three
  once the first block is verified

The table gives medians and the median of the per-round ratios to webdataset (below 1:
faster), and the CPU seconds per GB of this process (every thread: ``time.process_time``;
nginx, curl and the proxy run elsewhere).

    python benchmarks/bench_first_sample.py [--rounds 3] [--mib 128] [--rate 25MB]
                                            [--latency 0.02] [--block-size 2MiB]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import subprocess
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

from pacing_proxy import DEFAULT_LATENCY, DEFAULT_RATE, paced, parse_rate  # noqa: E402

from fsspec_shards import ShardDataset, ShardWriter  # noqa: E402
from fsspec_shards.checksums import DEFAULT_BLOCK_SIZE  # noqa: E402
from fsspec_shards.config import parse_size  # noqa: E402
from fsspec_shards.storage.cache import ShardCache  # noqa: E402
from tests.integration import servers  # noqa: E402

MiB = 1024 * 1024
SHARD = "first/train-000000.tar"
Reader = Callable[[str, str], tuple[float, float]]
"""``reader(shard URL, fresh directory)`` -> (seconds to the first sample, to the last)."""


def make_shard(directory: Path, mib: int, block_size: int) -> Path:
    """A shard of ``mib`` samples of 1 MiB (random bytes), its SHA256SUMS and block manifest
    written by ``fsspec-shards manifest --blocks``, and ``SHA256SUMS.whole`` (no blocks)."""
    rng = random.Random(0)
    with ShardWriter(str(directory / "train-%06d.tar"), manifest=None, counts=None) as writer:
        for index in range(mib):
            writer.write({"__key__": f"sample{index:06d}", "bin": rng.randbytes(MiB - 1024)})
    shard = directory / "train-000000.tar"
    command = [sys.executable, "-m", "fsspec_shards", "manifest", str(shard), "-q"]
    command += ["-o", str(directory / "SHA256SUMS"), "--blocks", "--block-size", str(block_size)]
    subprocess.run(command, check=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    shutil.copy(directory / "SHA256SUMS", directory / "SHA256SUMS.whole")
    return shard


def webdataset_reader(url: str, directory: str) -> tuple[float, float]:
    import webdataset

    started = time.perf_counter()
    first = None
    for _ in webdataset.WebDataset(url, shardshuffle=False):
        if first is None:
            first = time.perf_counter() - started
    return first, time.perf_counter() - started


def wds_reader(manifest: str, **wds: object) -> Reader:
    def read(url: str, directory: str) -> tuple[float, float]:
        ShardCache(directory, 1 << 40)  # this node's cache exists, empty: the shard is cold
        sums = url.rsplit("/", 1)[0] + "/" + manifest
        options = {
            "wds": {"cache_dir": directory, "checksums": sums, "skip_instance_cache": True, **wds}
        }
        started = time.perf_counter()
        first = None
        dataset = ShardDataset(
            f"wds::{url}",
            storage_options=options,
            shuffle_shards=False,
            split_by_node=False,
            split_by_worker=False,
        )
        for _ in dataset:
            if first is None:
                first = time.perf_counter() - started
        return first, time.perf_counter() - started

    return read


READERS: dict[str, Reader] = {
    "webdataset": webdataset_reader,
    "wds_blocks": wds_reader("SHA256SUMS"),
    "wds_whole": wds_reader("SHA256SUMS.whole"),
    "wds_blocks_4_ranges": wds_reader("SHA256SUMS", ranges_in_flight=4),
}


def measure(url: str, rounds: int, size: int, workdir: str) -> dict[str, dict[str, float]]:
    """Every reader, interleaved round by round in a rotating order (after a warm-up each)."""
    names = list(READERS)
    firsts: dict[str, list[float]] = {name: [] for name in names}
    ends: dict[str, list[float]] = {name: [] for name in names}
    cpus: dict[str, list[float]] = {name: [] for name in names}
    for round_number in range(rounds + 1):
        shift = round_number % len(names)
        for name in names[shift:] + names[:shift]:
            directory = tempfile.mkdtemp(prefix=f"{name}-", dir=workdir)
            cpu_started = time.process_time()
            first, end = READERS[name](url, directory)
            cpu = time.process_time() - cpu_started
            shutil.rmtree(directory, ignore_errors=True)
            if round_number:  # round 0 warms up: imports, connections, nginx's page cache
                firsts[name].append(first)
                ends[name].append(end)
                cpus[name].append(cpu)
    results = {}
    for name in names:
        results[name] = {
            "first_s": statistics.median(firsts[name]),
            "end_s": statistics.median(ends[name]),
            "first_vs_webdataset": statistics.median(
                own / other for own, other in zip(firsts[name], firsts["webdataset"], strict=True)
            ),
            "end_vs_webdataset": statistics.median(
                own / other for own, other in zip(ends[name], ends["webdataset"], strict=True)
            ),
            "cpu_s_per_gb": statistics.median(cpus[name]) / (size / 1e9),
        }
    return results


def run(
    rounds: int = 3,
    mib: int = 128,
    rate: float | None = DEFAULT_RATE,
    latency: float = DEFAULT_LATENCY,
    block_size: int = DEFAULT_BLOCK_SIZE,
) -> dict[str, dict[str, float]]:
    with tempfile.TemporaryDirectory(prefix="bench-first-") as workdir:
        made = Path(workdir, "made")
        made.mkdir()
        shard = make_shard(made, mib, block_size)
        with servers.running(servers.start_http, os.path.join(workdir, "nginx")) as service:
            backend = service.backend("bench")
            for name in ("train-000000.tar", "SHA256SUMS", "SHA256SUMS.blocks", "SHA256SUMS.whole"):
                backend.put(f"first/{name}", (made / name).read_bytes())
            with paced(backend.address(), rate, latency) as proxy:
                url = backend.through(proxy).url(SHARD)
                return measure(url, rounds, shard.stat().st_size, workdir)


def print_table(results: dict[str, dict[str, float]], title: str) -> None:
    print(f"\n{title}\n")
    print("| reader | first sample s | vs webdataset | whole shard s | vs webdataset | CPU s/GB |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, values in results.items():
        print(
            f"| {name} | {values['first_s']:.3f} | {values['first_vs_webdataset']:.2f}x "
            f"| {values['end_s']:.2f} | {values['end_vs_webdataset']:.2f}x "
            f"| {values['cpu_s_per_gb']:.2f} |"
        )


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="measured rounds (default 3)")
    parser.add_argument("--mib", type=int, default=128, help="samples of 1 MiB (default 128)")
    parser.add_argument("--rate", default="25MB", help="per connection (default 25MB; 0: none)")
    parser.add_argument("--latency", type=float, default=DEFAULT_LATENCY, help="s (default 0.02)")
    parser.add_argument("--block-size", default="2MiB", help="of the block manifest (2MiB)")
    arguments = parser.parse_args(argv)
    rate = parse_rate(arguments.rate) or None
    block_size = parse_size(arguments.block_size)
    results = run(arguments.rounds, arguments.mib, rate, arguments.latency, block_size)
    shown_rate = "unlimited" if rate is None else f"{rate / 1e6:g} MB/s"
    print_table(
        results,
        f"a cold {arguments.mib} MiB shard of 1 MiB samples through a pacing proxy "
        f"({shown_rate} per connection, +{arguments.latency * 1000:g} ms per connection and "
        f"request), blocks of {block_size // 1024} KiB, medians of {arguments.rounds} rounds",
    )
    return results


if __name__ == "__main__":
    main()
