"""Benchmark peak memory while iterating one shard, against the shard's size.

Each measurement runs in a fresh subprocess: it builds the reader, then iterates every
sample of the shard and reports the peak of Python allocations made meanwhile
(``tracemalloc``) and the peak growth of the resident set size over its value before
iterating, sampled after every sample (``/proc/self/statm``, Linux). A reader that streams
stays flat as shards grow; one that holds a shard whole grows with it. Ours reads through
``wds::`` (download into a fresh cache, then read from it); webdataset 1.0.2 reads the
local file, for reference.

    python benchmarks/bench_memory.py [--sizes 16,64,256]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import tracemalloc
from pathlib import Path

from report import print_results

ROOT = Path(__file__).resolve().parents[1]
SAMPLE_BYTES = 1 << 20
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
READERS = ("ours", "webdataset")
DEFAULT_SIZES_MB = (16, 64, 256)


def current_rss_bytes() -> int:
    """The process's resident set size now (Linux: /proc/self/statm)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * PAGE_SIZE


def iterate(reader: str, shard: str, cache_dir: str) -> dict[str, float]:
    """In the child: the samples read and the growth of the peak RSS while reading them."""
    if reader == "ours":
        sys.modules.setdefault("torch", None)
        from fsspec_shards import ShardDataset

        samples = ShardDataset(
            "wds::file://" + shard,
            storage_options={"wds": {"cache_dir": cache_dir}},
            shuffle_shards=False,
            split_by_node=False,
            split_by_worker=False,
            prefetch=0,
        )
    else:
        import webdataset

        samples = webdataset.WebDataset(shard, shardshuffle=False)
    baseline = current_rss_bytes()
    peak = baseline
    tracemalloc.start()
    count = 0
    for _ in samples:
        count += 1
        peak = max(peak, current_rss_bytes())
    traced_peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return {
        "samples": count,
        "traced_peak_mb": traced_peak / 1e6,
        "rss_growth_mb": (peak - baseline) / 1e6,
    }


def measure(reader: str, shard: str, workdir: str) -> dict[str, float]:
    """Run :func:`iterate` in a fresh interpreter and return what it printed."""
    cache_dir = tempfile.mkdtemp(dir=workdir)
    command = [sys.executable, __file__, "--child", reader, shard, cache_dir]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    output = subprocess.run(
        command, capture_output=True, text=True, check=True, env=env, timeout=600
    ).stdout
    return json.loads(output.strip().splitlines()[-1])


def run(
    sizes_mb: tuple[int, ...] = DEFAULT_SIZES_MB, directory: str | None = None
) -> dict[str, dict[str, float]]:
    """``{"shard_<n>MB": {<reader>_traced_peak_mb, <reader>_rss_growth_mb}}`` per size."""
    from fsspec_shards.fleet.demo import make_demo_dataset

    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(dir=directory) as workdir:
        for size in sizes_mb:
            samples = max(1, size * 10**6 // SAMPLE_BYTES)
            demo = make_demo_dataset(
                os.path.join(workdir, f"{size}MB"),
                shards=1,
                samples_per_shard=samples,
                image_bytes=SAMPLE_BYTES,
            )
            shard = str(demo.shards[0])
            case = {"shard_mb": os.path.getsize(shard) / 1e6}
            for reader in READERS:
                measured = measure(reader, shard, workdir)
                if measured["samples"] != samples:
                    raise RuntimeError(f"{reader} read {measured['samples']} of {samples} samples")
                case[f"{reader}_traced_peak_mb"] = measured["traced_peak_mb"]
                case[f"{reader}_rss_growth_mb"] = measured["rss_growth_mb"]
            results[f"shard_{size}MB"] = case
    return results


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sizes", default=",".join(map(str, DEFAULT_SIZES_MB)), help="shard sizes in MB"
    )
    parser.add_argument(
        "--child", nargs=3, metavar=("READER", "SHARD", "CACHE"), help=argparse.SUPPRESS
    )
    arguments = parser.parse_args(argv)
    if arguments.child:
        print(json.dumps(iterate(*arguments.child)))
        return {}
    results = run(tuple(int(size) for size in arguments.sizes.split(",")))
    print_results(results)
    return results


if __name__ == "__main__":
    main()
