"""Checkpointing every step: torchdata's StatefulDataLoader against a plain DataLoader.

One epoch of ``--shards`` x ``--samples`` small samples (a 64-byte ``.txt`` and a ``.cls``
member each) with a shuffle buffer of ``--shuffle-buffer``, ``--workers`` DataLoader
workers and batches of ``--batch-size``, read by a plain ``torch.utils.data.DataLoader`` and
by a ``StatefulDataLoader`` with ``snapshot_every_n_steps=1`` (every batch carries its
worker's dataset state: the setting that resumes exactly without replaying), by one
that never snapshots (what the loader costs without any state), and by one snapshotting
every step a dataset whose state is one int (torchdata's own cost per snapshot: the floor
no dataset state can go under). The four run interleaved, round by round; medians and
their ratios are printed, and the size of the loader's state at the end of the epoch.

    python benchmarks/bench_stateful.py [--rounds 5] [--shuffle-buffer 2000]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import tarfile
import tempfile
import time
import warnings

from fsspec_shards.iteration.dataset import ShardDataset

NEVER = 10**9
"""snapshot_every_n_steps for a StatefulDataLoader that never takes a snapshot."""


def write_dataset(directory: str, shards: int, samples: int) -> list[str]:
    """Shards of small two-member samples; their paths."""
    paths = []
    for shard in range(shards):
        path = os.path.join(directory, f"shard-{shard:04d}.tar")
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
            for index in range(samples):
                payload = f"{shard:04d}-{index:05d}|".encode() * 6
                for extension, data in (("txt", payload[:64]), ("cls", str(index % 10).encode())):
                    info = tarfile.TarInfo(f"s{shard:04d}_{index:05d}.{extension}")
                    info.size = len(data)
                    info.mtime = 1_700_000_000
                    tar.addfile(info, io.BytesIO(data))
        paths.append(path)
    return paths


class OneIntState(ShardDataset):
    """The same dataset with a state of one int: what torchdata's snapshots cost alone."""

    def state_dict(self) -> dict:
        return {"n": 1}


def count_batch(batch: list[dict]) -> int:
    return len(batch)


def _epoch(
    loader_class, urls: list[str], expected: int, dataset_class=ShardDataset, **options
) -> tuple[float, int]:
    """Seconds for one epoch, and the loader state's JSON size (0 for a plain loader)."""
    dataset = dataset_class(urls, shuffle_buffer=options.pop("shuffle_buffer"), seed=0)
    loader = loader_class(dataset, collate_fn=count_batch, **options)
    started = time.perf_counter()
    total = sum(loader)
    seconds = time.perf_counter() - started
    if total != expected:
        raise RuntimeError(f"read {total} samples, expected {expected}")
    state = loader.state_dict() if hasattr(loader, "state_dict") else None
    return seconds, 0 if state is None else len(json.dumps(state))


def run(
    rounds: int = 5,
    shards: int = 16,
    samples: int = 1000,
    shuffle_buffer: int = 2000,
    workers: int = 2,
    batch_size: int = 32,
) -> dict[str, dict[str, float]]:
    """Medians (s) of the four loaders, their ratios, and the state size."""
    from torch.utils.data import DataLoader
    from torchdata.stateful_dataloader import StatefulDataLoader

    warnings.filterwarnings("ignore", category=UserWarning)
    options = dict(shuffle_buffer=shuffle_buffer, num_workers=workers, batch_size=batch_size)
    with tempfile.TemporaryDirectory() as workdir:
        urls = write_dataset(workdir, shards, samples)
        expected = shards * samples
        plain, stateful, never, floor, state_bytes = [], [], [], [], 0
        for _ in range(rounds):
            plain.append(_epoch(DataLoader, urls, expected, **options)[0])
            seconds, state_bytes = _epoch(
                StatefulDataLoader, urls, expected, snapshot_every_n_steps=1, **options
            )
            stateful.append(seconds)
            never.append(
                _epoch(StatefulDataLoader, urls, expected, snapshot_every_n_steps=NEVER, **options)[
                    0
                ]
            )
            floor.append(
                _epoch(
                    StatefulDataLoader,
                    urls,
                    expected,
                    dataset_class=OneIntState,
                    snapshot_every_n_steps=1,
                    **options,
                )[0]
            )
    plain_s, stateful_s = statistics.median(plain), statistics.median(stateful)
    never_s, floor_s = statistics.median(never), statistics.median(floor)
    case = f"{shards}x{samples}_buffer{shuffle_buffer}_{workers}workers_batch{batch_size}"
    return {
        case: {
            "plain_dataloader_s": plain_s,
            "stateful_every_step_s": stateful_s,
            "stateful_never_snapshot_s": never_s,
            "stateful_one_int_state_s": floor_s,
            "stateful_slowdown": stateful_s / plain_s,
            "one_int_state_slowdown": floor_s / plain_s,
            "stateful_vs_plain": plain_s / stateful_s,
            "snapshots_vs_none": never_s / stateful_s,
            "loader_state_bytes": float(state_bytes),
        }
    }


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved repeats (default 5)")
    parser.add_argument("--shards", type=int, default=16, help="default 16")
    parser.add_argument("--samples", type=int, default=1000, help="per shard (default 1000)")
    parser.add_argument("--shuffle-buffer", type=int, default=2000, help="default 2000")
    parser.add_argument("--workers", type=int, default=2, help="default 2")
    parser.add_argument("--batch-size", type=int, default=32, help="default 32")
    arguments = parser.parse_args(argv)
    result = run(
        arguments.rounds,
        arguments.shards,
        arguments.samples,
        arguments.shuffle_buffer,
        arguments.workers,
        arguments.batch_size,
    )
    for case, values in result.items():
        print(case)
        for name, value in values.items():
            print(f"  {name:24s} {value:12.4f}")
    return result


if __name__ == "__main__":
    main()
