"""Time to the first sample after resuming at 90% of a stream, against replaying to that point.

Builds a local dataset of about ``--total-mib`` MiB (default 1024) in tar shards of
``--shard-mib`` MiB with ``--sample-kib`` KiB samples. A run to 90% of the samples gives the
state; then, interleaved over ``--rounds`` rounds, "resume" is a fresh dataset that loads the
state and yields one sample, and "replay" is a fresh dataset that iterates to the same point
(what a library without seeking resumes must do). Medians and their ratio are printed.

    python benchmarks/bench_resume.py [--total-mib 1024] [--rounds 3] [--shuffle-buffer 100]
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import tarfile
import tempfile
import time

from fsspec_shards.iteration.dataset import ShardDataset

RESUME_FRACTION = 0.9


def write_dataset(directory: str, total_mib: int, shard_mib: int, sample_kib: int) -> list[str]:
    """Write shards of ``sample_kib`` KiB samples, ``total_mib`` MiB in all; their paths."""
    payload = os.urandom(sample_kib * 1024)
    per_shard = max(1, shard_mib * 1024 // sample_kib)
    shards = max(1, -(-total_mib // shard_mib))
    paths = []
    for shard in range(shards):
        path = os.path.join(directory, f"shard-{shard:05d}.tar")
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
            for index in range(per_shard):
                for extension, data in (("bin", payload), ("cls", str(index % 10).encode())):
                    info = tarfile.TarInfo(f"s{shard:05d}_{index:07d}.{extension}")
                    info.size = len(data)
                    info.mtime = 1_700_000_000
                    tar.addfile(info, io.BytesIO(data))
        paths.append(path)
    return paths


def _first_sample_after_resume(urls: list[str], state: dict, shuffle_buffer: int) -> float:
    started = time.perf_counter()
    dataset = ShardDataset(urls, shuffle_buffer=shuffle_buffer, prefetch=0)
    dataset.load_state_dict(state)
    next(iter(dataset))
    return time.perf_counter() - started


def _replay_to(urls: list[str], count: int, shuffle_buffer: int) -> float:
    started = time.perf_counter()
    iterator = iter(ShardDataset(urls, shuffle_buffer=shuffle_buffer, prefetch=0))
    for _ in range(count + 1):
        next(iterator)
    return time.perf_counter() - started


def run(
    rounds: int = 3,
    directory: str | None = None,
    total_mib: int = 1024,
    shard_mib: int = 64,
    sample_kib: int = 100,
    shuffle_buffer: int = 100,
) -> dict[str, float]:
    """Build the dataset, measure both ways of continuing; medians (s) and their ratio."""
    with tempfile.TemporaryDirectory(dir=directory) as workdir:
        urls = write_dataset(workdir, total_mib, shard_mib, sample_kib)
        total = sum(1 for _ in ShardDataset(urls, shuffle_buffer=shuffle_buffer, prefetch=0))
        point = int(total * RESUME_FRACTION)
        dataset = ShardDataset(urls, shuffle_buffer=shuffle_buffer, prefetch=0)
        iterator = iter(dataset)
        for _ in range(point):
            next(iterator)
        state = dataset.state_dict()
        iterator.close()
        resume_times, replay_times = [], []
        for _ in range(rounds):
            resume_times.append(_first_sample_after_resume(urls, state, shuffle_buffer))
            replay_times.append(_replay_to(urls, point, shuffle_buffer))
        resume, replay = statistics.median(resume_times), statistics.median(replay_times)
        return {
            "total_mib": float(sum(os.path.getsize(url) for url in urls) / 2**20),
            "samples": float(total),
            "resume_point": float(point),
            "resume_first_sample_s": resume,
            "replay_to_point_s": replay,
            "replay_vs_resume": replay / resume,
        }


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="interleaved repeats (default 3)")
    parser.add_argument("--total-mib", type=int, default=1024, help="dataset size (default 1024)")
    parser.add_argument("--shard-mib", type=int, default=64, help="shard size (default 64)")
    parser.add_argument("--sample-kib", type=int, default=100, help="sample size (default 100)")
    parser.add_argument("--shuffle-buffer", type=int, default=100, help="default 100")
    arguments = parser.parse_args(argv)
    result = run(
        arguments.rounds,
        total_mib=arguments.total_mib,
        shard_mib=arguments.shard_mib,
        sample_kib=arguments.sample_kib,
        shuffle_buffer=arguments.shuffle_buffer,
    )
    for name, value in result.items():
        print(f"  {name:24s} {value:12.4f}")
    return result


if __name__ == "__main__":
    main()
