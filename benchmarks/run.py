"""Run every benchmark, print medians and ratios, and write docs/benchmarks.md.

Each benchmark builds its own data in a temporary directory and runs the readers it
compares interleaved, round by round, so that load on a shared machine hits them alike.
Results are medians and ratios of medians: on a noisy machine the ratios mean more than
the absolute numbers.

    python benchmarks/run.py            # full sizes, a few minutes or more
    python benchmarks/run.py --quick    # smaller and fewer rounds, under two minutes
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import os
import platform
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for entry in (str(ROOT), str(HERE)):
    if entry not in sys.path:
        sys.path.insert(0, entry)

Results = dict[str, dict[str, float]]
PACKAGES = ("fsspec-shards", "fsspec", "webdataset", "torch", "diskcache", "filelock", "s3fs")


@dataclass(frozen=True)
class Benchmark:
    """One comparison: its module, what it shows, and how to run it full or quick."""

    name: str
    title: str
    explanation: str
    full: Callable[[], Results]
    quick: Callable[[], Results]


def tar_suite(rounds: int) -> Results:
    import bench_tar

    return bench_tar.run(rounds)


def writer_suite(rounds: int) -> Results:
    import bench_writer

    return bench_writer.run(rounds)


def cache_suite(rounds: int) -> Results:
    import bench_cache

    return bench_cache.run(rounds)


def prefetch_suite(rounds: int, settings: tuple[int, ...]) -> Results:
    import bench_prefetch

    return bench_prefetch.run(rounds, settings=settings)


def resume_suite(rounds: int, total_mib: int, shard_mib: int) -> Results:
    import bench_resume

    return {
        f"resume_at_90pct_of_{total_mib}MiB": bench_resume.run(
            rounds, total_mib=total_mib, shard_mib=shard_mib
        )
    }


def stateful_suite(rounds: int, samples: int) -> Results:
    import bench_stateful

    return bench_stateful.run(rounds, samples=samples)


def integrity_suite(rounds: int) -> Results:
    import bench_integrity

    return bench_integrity.run(rounds)


def manifest_suite(rounds: int) -> Results:
    import bench_manifest

    return bench_manifest.run(rounds)


def cold_suite(rounds: int, objects: int, mib: int) -> Results:
    import bench_cold

    return bench_cold.run(rounds, objects=objects, mib=mib)


def far_suite(rounds: int, objects: int, mib: int) -> Results:
    import bench_far

    return bench_far.run(rounds, objects=objects, mib=mib)


def warm_suite(rounds: int, mib: int) -> Results:
    import bench_warm

    return bench_warm.run(rounds, mib=mib)


def first_sample_suite(rounds: int, mib: int) -> Results:
    import bench_first_sample

    return bench_first_sample.run(rounds, mib=mib)


def eviction_suite(rounds: int, entries: int) -> Results:
    import bench_eviction

    return bench_eviction.run(rounds, entries=entries)


def random_access_suite(rounds: int, shards: int, per_shard: int) -> Results:
    import bench_random_access

    return bench_random_access.run(rounds, shards=shards, per_shard=per_shard)


def memory_suite(sizes: tuple[int, ...]) -> Results:
    import bench_memory

    return bench_memory.run(sizes)


def gpu_suite(rounds: int, size: str | None) -> Results:
    import bench_gpu

    return bench_gpu.run(rounds, size=size)


BENCHMARKS = (
    Benchmark(
        "tar",
        "Tar iteration: ours vs webdataset 1.0.2 vs a tarfile loop",
        "Shards on local disk turned into sample dicts, no decoding: small samples (1 KiB) "
        "and large ones (1 MiB). `ours_vs_X` is X's median time over ours: above 1, ours is "
        "faster. `ours_vs_raw_read` compares with plain `read()` of the file, the ceiling. "
        "`text_1KiB_plain_gzip_zstd` reads one shard of 1 KiB text-like samples (about 3x "
        "compressible) plain, gzip (level 6) and zstd (level 3, as `ShardWriter` writes "
        "`.tar.zst`) with our reader: `zstd_vs_gzip` is gzip's median time over zstd's.",
        lambda: tar_suite(5),
        lambda: tar_suite(1),
    ),
    Benchmark(
        "writer",
        "Writing shards: ShardWriter vs webdataset 1.0.2's ShardWriter; mixing's cost",
        "The same samples written to local shards of 2,000 samples: small (a 1 KiB `.bin`, a "
        "`.cls` int and a `.json` dict) and large (1 MiB). Ours also hashes every byte, syncs "
        "each shard to disk before renaming it into place and writes SHA256SUMS and the counts; "
        "webdataset does none of that. `mix_two_sources` iterates two small-sample datasets "
        "through a MixedDataset (`mixed`) and one after the other (`direct`).",
        lambda: writer_suite(5),
        lambda: writer_suite(1),
    ),
    Benchmark(
        "cache",
        "Cache hits: wds:: vs plain local reads vs fsspec simplecache:: / filecache::",
        "Every cache warmed first. Whole-file reads of 32 MiB files measure throughput; "
        "opening 64 KiB files to read 4 KiB measures the cost of finding the cached copy, "
        "through filesystem instances (`open_64KiB_files`) and through "
        '`fsspec.open("wds::file://...")` URLs, the whole path a user\'s code takes, next to '
        "Python's `open()` (`fsspec_open_64KiB_files`). `wds_vs_X` is the median over rounds "
        "of X's time over ours in the same round: above 1, `wds::` is faster.",
        lambda: cache_suite(9),
        lambda: cache_suite(2),
    ),
    Benchmark(
        "prefetch",
        "Cold epoch over a slow link: with and without shard prefetching",
        "nginx behind the tests' fault proxy limited to 4 MB/s with 50 ms added per request; "
        "the consumer spends 4 ms per sample. `download_only_s` and `compute_only_s` are the "
        "two lower bounds; `prefetch_N_speedup` is the epoch time without prefetching over "
        "the time with N shards prefetched.",
        lambda: prefetch_suite(3, (0, 1, 2, 4)),
        lambda: prefetch_suite(1, (0, 2)),
    ),
    Benchmark(
        "resume",
        "Resuming at 90% of an epoch: seek vs replay",
        "Time to the first sample of a fresh dataset that loads a `state_dict()` taken at "
        "90% of the stream (it replays the shuffle buffer's draws in memory, reads tar "
        "headers back to the oldest buffered sample, reads the buffered samples by range and "
        "seeks), against a fresh dataset iterating to the same point (what resuming without "
        "seeking costs). `replay_vs_resume` is their ratio.",
        lambda: resume_suite(3, 1024, 64),
        lambda: resume_suite(1, 128, 16),
    ),
    Benchmark(
        "stateful",
        "Checkpointing every step: StatefulDataLoader vs a plain DataLoader",
        "One epoch of 16 shards of small samples, shuffle buffer 2,000, 2 workers, batches "
        "of 32: a plain `DataLoader` against torchdata's `StatefulDataLoader` with "
        "`snapshot_every_n_steps=1` (every batch carries its worker's dataset state), and "
        "one that never snapshots. `stateful_slowdown` is the snapshotting loader's time "
        "over the plain one's (the goal: at most 1.2); `one_int_state_slowdown` the same "
        "for a dataset whose state is one int (torchdata's own cost per snapshot, the floor); "
        "`stateful_vs_plain` the inverse of `stateful_slowdown`; "
        "`snapshots_vs_none` the never-snapshotting loader's time over the snapshotting "
        "one's (below 1 is what the states cost); `loader_state_bytes` the loader state's "
        "JSON size at the end.",
        lambda: stateful_suite(7, 1000),
        lambda: stateful_suite(3, 500),
    ),
    Benchmark(
        "integrity",
        "Verification on vs off (reads from local disk)",
        "From local disk, the fastest source, so hashing costs the most it can: cold "
        "downloads into an empty cache (which also writes and syncs the cached copy), and "
        "streamed reads with `cache=False` (no disk writes). `X_vs_off` is the time with "
        "`verify=False` over the time with X: below 1 is the cost of checking.",
        lambda: integrity_suite(5),
        lambda: integrity_suite(2),
    ),
    Benchmark(
        "manifest",
        "`manifest` over 64 shards: local threads vs `--dask local:2`",
        "64 shards (about 120 MB) on local disk, so the work is CPU: reading, SHA-256 and "
        "walking every tar member. `cli_*` time the command end to end in a fresh process "
        "(`-j 8`, or `--dask local:2 -j 8`, which starts a local cluster of 2 worker "
        "processes); `warm_*` the same work through `fsspec_shards.distributed.manifest` on "
        "a cluster already running. `X_dask_vs_threads` is the threads' median time over "
        "dask's: above 1, dask is faster. Both runs write the same bytes.",
        lambda: manifest_suite(3),
        lambda: manifest_suite(1),
    ),
    Benchmark(
        "cold",
        "Cold downloads from S3 (moto on loopback) and nginx: plain GET, obstore, s3fs, "
        "simplecache, wds through each transport",
        "moto's S3 server in its own process, then nginx; 4 objects of 64 MiB, every reader "
        "reads all of them cold each round. `vs_plain_get` is the median per-round speed "
        "ratio to one urllib GET of the same bytes (the line rate), `vs_simplecache` to "
        "fsspec's `simplecache::` cold. `wds_<transport>_*` rows fill the cache through "
        '`transport="fsspec"` / `"obstore"`; the `wds_obstore_auto_*` variants undo one '
        "choice of the download path each (4 ranges in flight, hashing inline, no early "
        "writeback); `transport_file_sha256_no_fsync` is the obstore transport alone "
        "filling a file without the fsync the cache makes.",
        lambda: cold_suite(5, 4, 64),
        lambda: cold_suite(2, 2, 32),
    ),
    Benchmark(
        "far",
        "Cold fills from a far store: one GET, an 8-range tool, simplecache, wds",
        "nginx and moto behind a proxy that paces each connection like a far object store "
        "(25 MB/s per connection, +20 ms per connection and per request); every read cold "
        "into a fresh cache on disk, readers interleaved round by round. `vs_8_ranges_tool` is "
        "the median speed ratio to a hand-written download with 8 ranged GETs in flight "
        "(pwrite, fsync, then sha256 of the file); `cpu_s_per_gb` the reader process's CPU "
        "seconds per GB.",
        lambda: far_suite(3, 2, 128),
        lambda: far_suite(1, 1, 32),
    ),
    Benchmark(
        "warm",
        "Warm cache hits on S3: wds::s3:// vs wds::file:// vs open() vs simplecache::s3://",
        "One object in moto (loopback) and a local copy; every cache warm, so each round is "
        "hits only: `fsspec.open` of the URL and a read to the end. `vs_plain_open` is the "
        "median per-round speed ratio to Python's `open()` of the local copy, "
        "`vs_simplecache_s3` to `simplecache::s3://`; `cached_copy_open` is `open()` of the "
        "wds cache's own file (the file, apart from the open path).",
        lambda: warm_suite(9, 256),
        lambda: warm_suite(5, 64),
    ),
    Benchmark(
        "first_sample",
        "Time to the first sample of a cold shard: webdataset streaming vs wds with and "
        "without a block manifest",
        "One shard of 1 MiB samples on nginx behind the pacing proxy (25 MB/s per "
        "connection, +20 ms). webdataset 1.0.2 streams it unverified; `wds::` without a block "
        "manifest hands out the first sample once the whole shard verified, with one "
        "(`manifest --blocks`) as each block verifies. Ratios are over webdataset's times.",
        lambda: first_sample_suite(3, 128),
        lambda: first_sample_suite(1, 32),
    ),
    Benchmark(
        "eviction",
        "A cache of many small entries: halving its cap, and what other processes wait",
        "A cache of 1 KiB files (100,000; 5,000 in quick mode) on local disk, then its cap "
        "halved: `evicting_read_s` is the read whose miss evicts half the entries, "
        "`concurrent_miss_s` a miss in another process started 50 ms after it, both from "
        "the evicting read's start. `cache_info_s` and `cache_ls_s` time the commands in a "
        "fresh process; `open_us_at_N` is a hit's `open` with N entries, "
        "`open_1000_vs_many` their ratio (1: a hit costs the same in a large cache).",
        lambda: eviction_suite(1, 100_000),
        lambda: eviction_suite(1, 5_000),
    ),
    Benchmark(
        "random_access",
        "Random reads: IndexedShardDataset vs litdata-style chunk reads by hand",
        "Every sample read once in a seeded random order, from nginx on loopback: tar shards "
        "with their sample index through `wds::` (`ours_cold`: into an empty cache, each "
        "shard's first read filling it with the whole verified shard; `ours_warm`: cached; "
        '`ours_direct_cold`: `ranged_reads="direct"`, a ranged GET per sample), against the '
        "same samples as litdata-style chunk files read by hand (a chunk downloaded whole on "
        "its first read, then a ranged read of the local file per item). `stream_warm` is "
        "`ShardDataset` iterating the warm shards. `ours_X_vs_litdata_X` is litdata's median "
        "time over ours: above 1, ours is faster.",
        lambda: random_access_suite(3, 16, 200),
        lambda: random_access_suite(1, 4, 100),
    ),
    Benchmark(
        "memory",
        "Peak memory against shard size",
        "One shard of 1 MiB samples iterated in a fresh process. `traced_peak_mb` is the "
        "peak of Python allocations while iterating (tracemalloc), `rss_growth_mb` the "
        "peak growth of the resident set size, sampled after every sample. Ours includes "
        "downloading the shard into the cache.",
        lambda: memory_suite((16, 64, 256)),
        lambda: memory_suite((16, 64)),
    ),
    Benchmark(
        "gpu",
        "Training input: ShardDataset vs webdataset, the loader alone and a training step",
        "JPEG images (PIL decode + center crop in 12 workers, or 2 in the small size) and 2 KiB "
        "token rows through a DataLoader: ours over local paths, `wds::` warm and cold (the "
        "cache filled and verified), webdataset 1.0.2. Then a training epoch (ResNet-50 with "
        "torchvision on a GPU, else a small conv net) over images/s on synthetic data. Full "
        "size where CUDA is present, small on CPU; see benchmarks/bench_gpu.py.",
        lambda: gpu_suite(3, None),
        lambda: gpu_suite(1, "small"),
    ),
)


def machine() -> dict[str, str]:
    """What the numbers came from."""
    versions = []
    for package in PACKAGES:
        try:
            versions.append(f"{package} {importlib.metadata.version(package)}")
        except importlib.metadata.PackageNotFoundError:
            continue
    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpus": str(os.cpu_count()),
        "system": f"{platform.system()} {platform.release()} {platform.machine()}",
        "python": platform.python_version(),
        "packages": ", ".join(versions),
        "load average at start": load,
    }


def format_value(value: float) -> str:
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.2f}"


def print_results(benchmark: Benchmark, results: Results, seconds: float) -> None:
    print(f"\n== {benchmark.title} ({seconds:.0f} s)")
    for case, values in results.items():
        print(f"  {case}")
        for metric, value in values.items():
            print(f"    {metric:32s} {format_value(value):>12s}")


def is_ratio(metric: str) -> bool:
    """Ratios of medians (``ours_vs_webdataset``, ``prefetch_2_speedup``): the headline numbers."""
    return "_vs_" in metric or metric.startswith("vs_") or metric.endswith("_speedup")


def markdown(info: dict[str, str], quick: bool, outcomes: list[tuple]) -> str:
    """docs/benchmarks.md: the machine, then one section and table per benchmark."""
    lines = [
        "# Benchmarks",
        "",
        "Written by `python benchmarks/run.py" + (" --quick`" if quick else "`") + ". Each "
        "benchmark builds its data in a temporary directory and runs the readers it compares "
        "interleaved, round by round; the numbers are medians over the rounds, and ratios of "
        "medians. The machine was shared with other work while they ran: read the ratios, "
        "not the absolute numbers, and rerun on your own hardware:",
        "",
        "```bash",
        "python benchmarks/run.py --quick   # under two minutes",
        "python benchmarks/run.py           # full sizes and more rounds",
        "```",
        "",
        "| machine | |",
        "|---|---|",
        *[f"| {key} | {value} |" for key, value in info.items()],
        "",
    ]
    lines += [
        "## Summary: the ratios",
        "",
        "| comparison | case | ratio | value |",
        "|---|---|---|---:|",
    ]
    for benchmark, results, _, _ in outcomes:
        for case, values in results.items():
            for metric, value in values.items():
                if is_ratio(metric):
                    lines.append(
                        f"| {benchmark.name} | {case} | `{metric}` | {format_value(value)} |"
                    )
    lines.append("")
    for benchmark, results, seconds, error in outcomes:
        lines += [f"## {benchmark.title}", "", benchmark.explanation, ""]
        if error is not None:
            lines += [f"Not measured in this run: {error}", ""]
            continue
        lines += ["| case | metric | value |", "|---|---|---:|"]
        for case, values in results.items():
            for metric, value in values.items():
                lines.append(f"| {case} | `{metric}` | {format_value(value)} |")
        lines += ["", f"(`benchmarks/bench_{benchmark.name}.py`, {seconds:.0f} s)", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller data, fewer rounds")
    parser.add_argument(
        "--only", nargs="+", choices=[b.name for b in BENCHMARKS], help="run only these"
    )
    parser.add_argument(
        "--output",
        default=str(ROOT / "docs" / "benchmarks.md"),
        help="the Markdown report to write (default docs/benchmarks.md); '-' for none",
    )
    arguments = parser.parse_args(argv)
    info = machine()
    print("\n".join(f"{key}: {value}" for key, value in info.items()))
    outcomes = []
    for benchmark in BENCHMARKS:
        if arguments.only and benchmark.name not in arguments.only:
            continue
        started = time.perf_counter()
        try:
            results = (benchmark.quick if arguments.quick else benchmark.full)()
            error = None
        except Exception as exc:
            traceback.print_exc()
            results, error = {}, f"{type(exc).__name__}: {exc}"
        seconds = time.perf_counter() - started
        outcomes.append((benchmark, results, seconds, error))
        if error is None:
            print_results(benchmark, results, seconds)
        else:
            print(f"\n== {benchmark.title}: failed: {error}")
    if arguments.output != "-":
        Path(arguments.output).write_text(markdown(info, arguments.quick, outcomes))
        print(f"\nwrote {arguments.output}")
    return 1 if any(error for *_, error in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
