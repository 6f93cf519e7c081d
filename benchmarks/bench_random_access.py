"""Benchmark random reads: IndexedShardDataset vs litdata-style chunk reads done by hand.

nginx serves the same samples twice: as tar shards written by ``ShardWriter`` (with their
sample index) and as litdata-style chunk files (a header of item offsets, then the items;
one file per chunk, a chunk per shard). Every sample is read once in a seeded random order:

- ``ours_cold``: ``IndexedShardDataset`` over ``wds::http://`` into an empty cache (each
  shard's first read fills the cache with the whole verified shard);
- ``ours_warm``: the same dataset again, every shard cached;
- ``ours_direct_cold``: ``ranged_reads="direct"`` into an empty cache (a ranged GET per
  sample);
- ``litdata_cold``: as litdata reads: a chunk's first read downloads the whole chunk file
  into a local directory (one GET, no verification), then each item is a ranged read of the
  local chunk file (its offsets from the header, then its bytes);
- ``litdata_warm``: the same, every chunk local.

Also ``stream_warm``: ``ShardDataset`` iterating the same shards from the warm cache, for the
ceiling of sequential reading. Readers run interleaved round by round; the medians of
reads/s are reported with their ratios (``ours_X_vs_litdata_X``: litdata's median time over
ours; above 1, ours is faster).

    python benchmarks/bench_random_access.py [--rounds 3] [--quick]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import struct
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from report import print_results  # noqa: E402

from fsspec_shards import IndexedShardDataset, ShardDataset, ShardWriter  # noqa: E402
from tests.integration import servers  # noqa: E402

SHARDS = 16
PER_SHARD = 200
SAMPLE_BYTES = 16 * 1024
_HEADER = struct.Struct("<I")
_OFFSET = struct.Struct("<II")
_ITEM = struct.Struct("<II")


def sample(number: int) -> dict:
    payload = random.Random(number).randbytes(SAMPLE_BYTES)
    return {"__key__": f"k{number:07d}", "bin": payload, "cls": str(number % 1000).encode()}


def write_chunk(path: Path, samples: list[dict]) -> None:
    """A litdata-style chunk: item count, offsets of every item (and the end), the items."""
    items = [
        _ITEM.pack(len(s["bin"]), len(s["cls"])) + s["__key__"].encode() + s["bin"] + s["cls"]
        for s in samples
    ]
    start = _HEADER.size + 4 * (len(items) + 1)
    offsets = [start]
    for item in items:
        offsets.append(offsets[-1] + len(item))
    header = _HEADER.pack(len(items)) + struct.pack(f"<{len(offsets)}I", *offsets)
    path.write_bytes(header + b"".join(items))


class ChunkReader:
    """litdata's read path done by hand: chunks downloaded whole into ``local``, then one
    ranged read of the local chunk file per item."""

    def __init__(self, base_url: str, chunks: int, per_chunk: int, local: str) -> None:
        self.base_url = base_url
        self.per_chunk = per_chunk
        self.chunks = chunks
        self.local = local

    def __len__(self) -> int:
        return self.chunks * self.per_chunk

    def _chunk(self, chunk: int) -> str:
        path = os.path.join(self.local, f"chunk-{chunk}.bin")
        if not os.path.exists(path):
            with urllib.request.urlopen(f"{self.base_url}/chunk-{chunk}.bin") as response:
                data = response.read()
            partial = path + ".part"
            with open(partial, "wb") as handle:
                handle.write(data)
            os.replace(partial, path)
        return path

    def __getitem__(self, number: int) -> dict:
        chunk, item = divmod(number, self.per_chunk)
        with open(self._chunk(chunk), "rb") as handle:
            handle.seek(_HEADER.size + 4 * item)
            start, end = _OFFSET.unpack(handle.read(_OFFSET.size))
            handle.seek(start)
            data = handle.read(end - start)
        size, cls = _ITEM.unpack_from(data)
        key_end = len(data) - size - cls
        return {
            "__key__": data[_ITEM.size : key_end].decode(),
            "bin": data[key_end : key_end + size],
            "cls": data[key_end + size :],
        }


def without_url(sample: dict) -> dict:
    return {key: value for key, value in sample.items() if key != "__url__"}


def read_all(dataset, order: list[int]) -> float:
    started = time.perf_counter()
    for number in order:
        dataset[number]
    return time.perf_counter() - started


def run(
    rounds: int = 3,
    shards: int = SHARDS,
    per_shard: int = PER_SHARD,
    directory: str | None = None,
) -> dict[str, dict[str, float]]:
    """``{"random_reads_16KiB": {<reader>_reads_per_s, ratios}}``."""
    total = shards * per_shard
    with tempfile.TemporaryDirectory(dir=directory) as workdir:
        data = Path(workdir, "data")
        data.mkdir()
        with ShardWriter(str(data / "train-%04d.tar"), max_count=per_shard) as writer:
            for number in range(total):
                writer.write(sample(number))
        for chunk in range(shards):
            numbers = range(chunk * per_shard, (chunk + 1) * per_shard)
            write_chunk(data / f"chunk-{chunk}.bin", [sample(n) for n in numbers])
        with servers.running(servers.start_http, os.path.join(workdir, "nginx")) as service:
            backend = service.backend("bench")
            for path in data.iterdir():
                backend.put(path.name, path.read_bytes())
            urls = [f"wds::{backend.url(f'train-{n:04d}.tar')}" for n in range(shards)]
            base_url = backend.url("").rstrip("/")
            times: dict[str, list[float]] = {}
            caches = Path(workdir, "caches")

            def fresh(name: str) -> str:
                """An empty directory of its own: a cache no filesystem has seen yet."""
                path = caches / name
                path.mkdir(parents=True)
                return str(path)

            check = IndexedShardDataset(urls, {"wds": {"cache_dir": fresh("check")}})
            by_hand = ChunkReader(base_url, shards, per_shard, fresh("check-litdata"))
            for number in (0, total // 2, total - 1):
                if without_url(check[number]) != by_hand[number]:
                    raise RuntimeError(f"the two layouts hold different samples at {number}")
            for round_number in range(rounds):
                order = list(range(total))
                random.Random(round_number).shuffle(order)
                cache = fresh(f"ours-{round_number}")
                ours = IndexedShardDataset(urls, {"wds": {"cache_dir": cache}})
                direct_cache = fresh(f"direct-{round_number}")
                direct_options = {"wds": {"cache_dir": direct_cache, "ranged_reads": "direct"}}
                direct = IndexedShardDataset(urls, direct_options)
                chunks = ChunkReader(base_url, shards, per_shard, fresh(f"lit-{round_number}"))
                backwards = order[::-1]
                cases: list[tuple[str, Callable[..., float], tuple]] = [
                    ("ours_cold", read_all, (ours, order)),
                    ("litdata_cold", read_all, (chunks, order)),
                    ("ours_direct_cold", read_all, (direct, order)),
                    ("ours_warm", read_all, (ours, backwards)),
                    ("litdata_warm", read_all, (chunks, backwards)),
                    ("stream_warm", _stream, (urls, cache, total)),
                ]
                for name, case, arguments in cases:
                    times.setdefault(name, []).append(case(*arguments))
    medians = {name: statistics.median(values) for name, values in times.items()}
    result = {f"{name}_reads_per_s": total / seconds for name, seconds in medians.items()}
    result["ours_cold_vs_litdata_cold"] = medians["litdata_cold"] / medians["ours_cold"]
    result["ours_warm_vs_litdata_warm"] = medians["litdata_warm"] / medians["ours_warm"]
    result["ours_direct_cold_vs_litdata_cold"] = (
        medians["litdata_cold"] / medians["ours_direct_cold"]
    )
    result["ours_warm_vs_stream_warm"] = medians["stream_warm"] / medians["ours_warm"]
    return {f"random_reads_{SAMPLE_BYTES // 1024}KiB_{total}_samples": result}


def _stream(urls: list[str], cache_dir: str, total: int) -> float:
    started = time.perf_counter()
    dataset = ShardDataset(urls, {"wds": {"cache_dir": cache_dir}}, shuffle_shards=False)
    count = sum(1 for _ in dataset)
    if count != total:
        raise RuntimeError(f"streamed {count} samples, expected {total}")
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="interleaved repeats (default 3)")
    parser.add_argument("--quick", action="store_true", help="4 shards of 100 samples, 1 round")
    arguments = parser.parse_args(argv)
    results = run(1, shards=4, per_shard=100) if arguments.quick else run(arguments.rounds)
    print_results(results)
    return results


if __name__ == "__main__":
    main()
