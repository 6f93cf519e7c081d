"""Benchmark a cold epoch with and without shard prefetching, over a slow link.

nginx serves the shards; the tests' fault proxy sits in front of it, in a process of its
own, with a bandwidth limit and an added latency per request, so downloads take time as
they would from remote storage. The consumer spends a fixed time per sample (a stand-in
for a training step), so without prefetching it waits for each download, and with it the
next shards download while it works. Each round starts from an empty cache; settings run
interleaved, in an order that rotates from round to round.

    python benchmarks/bench_prefetch.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from report import print_results  # noqa: E402

from fsspec_shards.fleet.demo import make_demo_dataset  # noqa: E402
from tests.integration import servers  # noqa: E402
from tests.integration.fault_proxy import FaultProxy  # noqa: E402

SHARDS = 8
SAMPLES_PER_SHARD = 50
IMAGE_BYTES = 16_000
BANDWIDTH = 4_000_000
LATENCY = 0.05
STEP_SECONDS = 0.004
PREFETCH_SETTINGS = (0, 1, 2, 4, "auto")


@dataclass(frozen=True)
class ProxyAddress:
    """Where the proxy listens (what ``Backend.through`` needs)."""

    host: str
    port: int


def serve_proxy(upstream: tuple[str, int], ready: Queue, stop: Event) -> None:
    """In a child process: run the throttling proxy until ``stop`` is set."""
    with FaultProxy(upstream, bandwidth=BANDWIDTH, latency=LATENCY) as proxy:
        ready.put((proxy.host, proxy.port))
        stop.wait()


@contextmanager
def slow_link(upstream: tuple[str, int]) -> Iterator[ProxyAddress]:
    """The fault proxy in its own process, so its relaying does not share our interpreter."""
    context = multiprocessing.get_context("spawn")
    ready, stop = context.Queue(), context.Event()
    process = context.Process(target=serve_proxy, args=(upstream, ready, stop), daemon=True)
    process.start()
    try:
        yield ProxyAddress(*ready.get(timeout=60))
    finally:
        stop.set()
        process.join(timeout=30)


def cold_epoch(pattern: str, cache_dir: str, prefetch: int | str) -> tuple[float, int]:
    """Seconds for one epoch from an empty cache directory, and the samples it gave."""
    from fsspec_shards import ShardDataset

    dataset = ShardDataset(
        pattern,
        storage_options={"wds": {"cache_dir": cache_dir}, "http": {"skip_instance_cache": True}},
        shuffle_shards=False,
        split_by_node=False,
        split_by_worker=False,
        prefetch=prefetch,
    )
    started = time.perf_counter()
    samples = 0
    for _ in dataset:
        time.sleep(STEP_SECONDS)
        samples += 1
    elapsed = time.perf_counter() - started
    shutil.rmtree(cache_dir, ignore_errors=True)
    return elapsed, samples


def run(
    rounds: int = 3,
    directory: str | None = None,
    settings: tuple[int | str, ...] = PREFETCH_SETTINGS,
) -> dict[str, dict[str, float]]:
    """``{"cold_epoch_slow_link": {prefetch_<n>_s, prefetch_<n>_speedup}}``; 0 must be in
    ``settings`` (the baseline)."""
    with tempfile.TemporaryDirectory(dir=directory) as workdir:
        demo = make_demo_dataset(
            os.path.join(workdir, "shards"),
            shards=SHARDS,
            samples_per_shard=SAMPLES_PER_SHARD,
            image_bytes=IMAGE_BYTES,
        )
        with servers.running(servers.start_http, os.path.join(workdir, "nginx")) as service:
            backend = service.backend("bench")
            for path in demo.shards:
                backend.put(path.name, path.read_bytes())
            with slow_link(backend.address()) as proxy:
                slow = backend.through(proxy)
                pattern = "wds::" + slow.url(f"demo-{{000000..{SHARDS - 1:06d}}}.tar")
                times: dict[int | str, list[float]] = {n: [] for n in settings}
                for round_number in range(rounds):
                    shift = round_number % len(settings)
                    for prefetch in settings[shift:] + settings[:shift]:
                        cache_dir = os.path.join(workdir, f"cache-{round_number}-{prefetch}")
                        seconds, samples = cold_epoch(pattern, cache_dir, prefetch)
                        if samples != demo.total_samples:
                            raise RuntimeError(f"prefetch={prefetch} gave {samples} samples")
                        times[prefetch].append(seconds)
        medians = {n: statistics.median(values) for n, values in times.items()}
        megabytes = sum(path.stat().st_size for path in demo.shards) / 1e6
        result = {"download_only_s": megabytes / (BANDWIDTH / 1e6)}
        result["compute_only_s"] = demo.total_samples * STEP_SECONDS
        for prefetch, seconds in medians.items():
            result[f"prefetch_{prefetch}_s"] = seconds
        for prefetch, seconds in medians.items():
            if prefetch:
                result[f"prefetch_{prefetch}_speedup"] = medians[0] / seconds
        return {"cold_epoch_slow_link": result}


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="interleaved repeats (default 3)")
    results = run(parser.parse_args(argv).rounds)
    print_results(results)
    return results


if __name__ == "__main__":
    main()
