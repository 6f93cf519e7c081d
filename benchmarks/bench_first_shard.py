"""Benchmark the first shard of a process against the later ones (issue 36).

Shards of 10 samples of 16 KiB (a 160 KiB tar each) lie in a local directory. Each round
starts a fresh Python process that imports torch and ``fsspec_shards`` (not timed), then,
with an empty cache directory, reads ``wds::file://`` shards one by one, each through its
own ``ShardDataset``: ``first_s`` is the first (the dataset made and read to its end),
``later_s`` the median of the others, ``first_extra_s`` the difference (the one-time cost a
process pays on its first shard), split into making the dataset (``first_made_extra_s``:
the storage layer's imports, the cache directory and its index, paid there so that forked
DataLoader workers inherit them) and reading it (``first_read_extra_s``: the goal is <=
0.030 s). A second fresh process times a
torch ``DataLoader`` (2 workers, batch 16) over all the shards, from making the dataset to
its first batch (``loader_first_batch_s``) and to the end of the epoch
(``loader_epoch_s``). Medians over the rounds. The package is compiled first (``compileall``
into its ``__pycache__``, as pip does for a wheel), so that a fresh process reads bytecode
as an installed package's would, even where ``PYTHONDONTWRITEBYTECODE`` is set.

    python benchmarks/bench_first_shard.py [--rounds 5] [--shards 8]
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

SHARDS_SCRIPT = """
import json, sys, tempfile, time
import torch  # noqa: F401  (imported, as in a training script: not timed)
from fsspec_shards import ShardDataset

urls = json.loads(sys.argv[1])
options = {"wds": {"cache_dir": tempfile.mkdtemp(dir=sys.argv[2])}}
made, read = [], []
for url in urls:
    started = time.perf_counter()
    dataset = ShardDataset(url, storage_options=options)
    between = time.perf_counter()
    count = sum(1 for _ in dataset)
    made.append(between - started)
    read.append(time.perf_counter() - between)
    assert count == 10, count
print(json.dumps([made, read]))
"""

LOADER_SCRIPT = """
import json, sys, tempfile, time
import torch
from torch.utils.data import DataLoader
from fsspec_shards import ShardDataset

urls = json.loads(sys.argv[1])
options = {"wds": {"cache_dir": tempfile.mkdtemp(dir=sys.argv[2])}}
started = time.perf_counter()
dataset = ShardDataset(urls, storage_options=options)
loader = DataLoader(dataset, batch_size=16, num_workers=2, collate_fn=list)
batches = iter(loader)
count = len(next(batches))
first = time.perf_counter() - started
count += sum(len(batch) for batch in batches)
assert count == 10 * len(urls), count
print(json.dumps([first, time.perf_counter() - started]))
"""


def write_shards(directory: str, shards: int) -> list[str]:
    from fsspec_shards import ShardWriter

    rng = __import__("random").Random(0)
    with ShardWriter(os.path.join(directory, "train-%04d.tar"), max_count=10) as writer:
        for index in range(10 * shards):
            writer.write({"__key__": f"{index:06d}", "bin": rng.randbytes(16384), "cls": index})
    return [f"wds::file://{directory}/train-{index:04d}.tar" for index in range(shards)]


def _child(script: str, urls: list[str], scratch: str) -> list[float]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-c", script, json.dumps(urls), scratch],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def run(rounds: int = 5, shards: int = 8) -> dict[str, dict[str, float]]:
    """Medians over ``rounds`` fresh processes."""
    compileall.compile_dir(ROOT / "fsspec_shards", quiet=1)  # as a wheel install would
    firsts, laters, made_extra, read_extra, loader_firsts, epochs = [], [], [], [], [], []
    with tempfile.TemporaryDirectory() as workdir:
        urls = write_shards(workdir, shards)
        for _ in range(rounds):
            made, read = _child(SHARDS_SCRIPT, urls, workdir)
            times = [m + r for m, r in zip(made, read, strict=True)]
            firsts.append(times[0])
            laters.append(statistics.median(times[1:]))
            made_extra.append(made[0] - statistics.median(made[1:]))
            read_extra.append(read[0] - statistics.median(read[1:]))
            first_batch, epoch = _child(LOADER_SCRIPT, urls, workdir)
            loader_firsts.append(first_batch)
            epochs.append(epoch)
    first, later = statistics.median(firsts), statistics.median(laters)
    return {
        f"{shards}_shards_of_160KiB": {
            "first_s": first,
            "later_s": later,
            "first_extra_s": statistics.median(
                f - lt for f, lt in zip(firsts, laters, strict=True)
            ),
            "first_made_extra_s": statistics.median(made_extra),
            "first_read_extra_s": statistics.median(read_extra),
            "loader_first_batch_s": statistics.median(loader_firsts),
            "loader_epoch_s": statistics.median(epochs),
        }
    }


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="fresh processes (default 5)")
    parser.add_argument("--shards", type=int, default=8, help="default 8")
    parser.add_argument("--quick", action="store_true", help="3 rounds")
    arguments = parser.parse_args(argv)
    result = run(3 if arguments.quick else arguments.rounds, arguments.shards)
    for case, values in result.items():
        print(case)
        for name, value in values.items():
            print(f"  {name:24s} {value:10.4f}")
    return result


if __name__ == "__main__":
    main()
