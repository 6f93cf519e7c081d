"""Benchmark training input: ShardDataset vs webdataset 1.0.2, the loader alone and a
training step against synthetic data, cold and warm.

Two datasets are written with ``ShardWriter`` into a temporary directory: JPEG images (each
sample a ``.jpg`` and a ``.cls``) and token rows (a 2 KiB ``.bin`` of 512 int32 tokens).
Loaders, each a ``torch.utils.data.DataLoader`` over the same shards with the same workers
and batch size, interleaved round by round:

- ``ours_paths``: ``ShardDataset`` over the local paths;
- ``ours_warm`` / ``ours_cold``: ``ShardDataset`` over ``wds::file://`` URLs with the
  SHA256SUMS manifest, the cache filled before / a fresh cache each round (every shard
  filled and verified on the way);
- ``wds``: ``webdataset.WebDataset`` over the local paths (nothing verified, no cache).

The loader alone: samples/s of one epoch, loader start included, and the time to its first
batch. Images are decoded with PIL and center-cropped in the workers (the same function for
both); token rows become int32 tensors. Ours is made with ``batch_size=`` and the sample
counts, so every batch is whole.

The training step: one epoch of images through a model (ResNet-50 from torchvision when it
is installed at full size, else a small conv net), bf16 autocast and channels_last on CUDA,
against the same number of steps on one synthetic batch already on the device (the input
pipeline's ceiling). Ratios are images/s over the synthetic images/s; ``wait_pct`` is the
share of the wall time spent waiting for the next batch. webdataset ends each worker's share
with a partial batch (a new shape: cuDNN tunes again with ``benchmark=True``), so it is also
run with ``drop_last=True``, which drops those samples (``dropped_pct``).

Full size (the default where CUDA is present): 32,000 images of about 27 KB in 64 shards,
12 workers, batches of 256 (token rows: 524,288 rows in 64 shards, batches of 512). Small
(the default on CPU, and what the test suite runs): a few hundred samples, seconds.

    python benchmarks/bench_gpu.py                  # full on a GPU, small on CPU
    python benchmarks/bench_gpu.py --size small --rounds 1
"""

from __future__ import annotations

import argparse
import functools
import io
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from report import print_results
from torch.utils.data import DataLoader

from fsspec_shards import ShardDataset, ShardWriter

Results = dict[str, dict[str, float]]


@dataclass(frozen=True)
class Size:
    """How much data, and how it is read."""

    images: int
    image_shards: int
    side: int
    crop: int
    image_batch: int
    rows: int
    row_shards: int
    row_batch: int
    workers: int
    resnet: bool


SIZES = {
    "full": Size(32_000, 64, 320, 224, 256, 524_288, 64, 512, 12, True),
    "small": Size(200, 4, 48, 32, 16, 2_048, 4, 256, 2, False),
}
DISTINCT_IMAGES = 64  # distinct JPEGs, reused under new keys: the decode work is the same
ROW_BYTES = 2048
CLASSES = 1000


# --- data ------------------------------------------------------------------------------------


def jpeg(rng: np.random.Generator, side: int) -> bytes:
    """A photo-like JPEG: smooth gradients plus mild noise (about 27 KB at 320 px)."""
    y, x = np.mgrid[0:side, 0:side] / side
    channels = [
        np.sin(rng.uniform(2, 9) * x + rng.uniform(2, 9) * y + rng.uniform(0, 6)) for _ in "rgb"
    ]
    image = (np.stack(channels, -1) + 1) * 110 + rng.normal(0, 12, (side, side, 3))
    out = io.BytesIO()
    Image.fromarray(image.clip(0, 255).astype(np.uint8)).save(out, "JPEG", quality=85)
    return out.getvalue()


def write_images(directory: Path, size: Size) -> list[str]:
    rng = np.random.default_rng(0)
    images = [jpeg(rng, size.side) for _ in range(min(DISTINCT_IMAGES, size.images))]
    per_shard = -(-size.images // size.image_shards)
    with ShardWriter(str(directory / "images-%06d.tar"), max_count=per_shard) as writer:
        for index in range(size.images):
            jpg = images[index % len(images)]
            writer.write({"__key__": f"{index:08d}", "jpg": jpg, "cls": str(index % CLASSES)})
    return [shard.url for shard in writer.shards]


def write_rows(directory: Path, size: Size) -> list[str]:
    rng = np.random.default_rng(1)
    per_shard = -(-size.rows // size.row_shards)
    with ShardWriter(str(directory / "rows-%06d.tar"), max_count=per_shard) as writer:
        for start in range(0, size.rows, 4096):
            block = rng.integers(0, 50_000, (min(4096, size.rows - start), ROW_BYTES // 4))
            for offset, row in enumerate(block.astype(np.int32)):
                writer.write({"__key__": f"{start + offset:09d}", "bin": row.tobytes()})
    return [shard.url for shard in writer.shards]


# --- per-sample work (module level: DataLoader workers pickle it) ------------------------------


def decode_image(sample: dict, crop: int) -> tuple[torch.Tensor, int]:
    """PIL decode and a center crop: (a uint8 CHW tensor, the label)."""
    with Image.open(io.BytesIO(sample["jpg"])) as image:
        image = image.convert("RGB")
        left, top = (image.width - crop) // 2, (image.height - crop) // 2
        array = np.asarray(image.crop((left, top, left + crop, top + crop)))
    return torch.from_numpy(array.copy()).permute(2, 0, 1), int(sample["cls"])


def decode_row(sample: dict) -> tuple[torch.Tensor, int]:
    return torch.frombuffer(bytearray(sample["bin"]), dtype=torch.int32), 0


# --- loaders ---------------------------------------------------------------------------------


@dataclass
class Data:
    """One dataset's shards and how to read them."""

    paths: list[str]
    root: Path
    decode: Callable[[dict], Any]
    batch: int
    workers: int

    def counts(self) -> str:
        return str(self.root / "sample-counts.json")

    def ours(
        self, urls: list[str], options: dict | None = None, workers: int | None = None
    ) -> DataLoader:
        dataset = ShardDataset(
            urls,
            storage_options=options,
            shuffle_shards=False,
            samples_per_shard=self.counts(),
            batch_size=self.batch,
            transforms=[self.decode],
            log_interval=None,
        )
        return self.loader(dataset, workers=workers)

    def cached(self, cache_dir: Path, workers: int | None = None) -> DataLoader:
        options = {"wds": {"cache_dir": str(cache_dir), "checksums": str(self.root / "SHA256SUMS")}}
        return self.ours([f"wds::file://{path}" for path in self.paths], options, workers)

    def fill(self, cache_dir: Path) -> None:
        """Fill a cache with every shard: read in this process, nothing decoded."""
        options = {"wds": {"cache_dir": str(cache_dir), "checksums": str(self.root / "SHA256SUMS")}}
        urls = [f"wds::file://{path}" for path in self.paths]
        for _ in ShardDataset(urls, storage_options=options, shuffle_shards=False):
            pass

    def webdataset(self, drop_last: bool = False) -> DataLoader:
        import webdataset

        dataset = webdataset.WebDataset(self.paths, shardshuffle=False, empty_check=False)
        return self.loader(dataset.map(self.decode), drop_last)

    def loader(
        self, dataset: Any, drop_last: bool = False, workers: int | None = None
    ) -> DataLoader:
        return DataLoader(
            dataset,
            batch_size=self.batch,
            num_workers=self.workers if workers is None else workers,
            drop_last=drop_last,
            pin_memory=torch.cuda.is_available(),
        )

    def total(self) -> int:
        import json

        return sum(json.loads(Path(self.counts()).read_text()).values())


def epoch(loader: Iterable) -> tuple[float, float, int]:
    """(seconds, seconds to the first batch, samples) of one epoch, loader start included."""
    started = time.perf_counter()
    first, samples = None, 0
    for inputs, _ in loader:
        if first is None:
            first = time.perf_counter() - started
        samples += len(inputs)
    return time.perf_counter() - started, first or 0.0, samples


def loader_alone(data: Data, rounds: int, scratch: Path) -> dict[str, float]:
    """samples/s and first-batch seconds of each loader, rounds interleaved; medians."""
    warm = scratch / "warm-cache"
    data.fill(warm)
    readers: dict[str, Callable[[int], DataLoader]] = {
        "ours_paths": lambda _: data.ours(data.paths),
        "ours_warm": lambda _: data.cached(warm),
        "ours_cold": lambda round_: data.cached(scratch / f"cold-{round_}"),
        "wds": lambda _: data.webdataset(),
    }
    rates: dict[str, list[float]] = {name: [] for name in readers}
    firsts: dict[str, list[float]] = {name: [] for name in readers}
    for round_ in range(rounds):
        for name, make in readers.items():
            seconds, first, samples = epoch(make(round_))
            rates[name].append(samples / seconds)
            firsts[name].append(first)
    result = {f"{name}_per_s": statistics.median(values) for name, values in rates.items()}
    result.update({f"{name}_first_batch_s": statistics.median(firsts[name]) for name in readers})
    for name in ("ours_paths", "ours_warm", "ours_cold"):
        result[f"{name}_vs_wds"] = result[f"{name}_per_s"] / result["wds_per_s"]
    return result


# --- the training step -----------------------------------------------------------------------


def model_for(size: Size, device: torch.device) -> torch.nn.Module:
    """ResNet-50 (torchvision) at full size when installed, else a small conv net."""
    model: torch.nn.Module
    try:
        if not size.resnet:
            raise ImportError("small size")
        import torchvision

        model = torchvision.models.resnet50(num_classes=CLASSES)
    except ImportError:
        model = torch.nn.Sequential(
            torch.nn.Conv2d(3, 16, 3, stride=2, padding=1),
            torch.nn.ReLU(),
            torch.nn.Conv2d(16, 32, 3, stride=2, padding=1),
            torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1),
            torch.nn.Flatten(),
            torch.nn.Linear(32, CLASSES),
        )
    return model.to(device, memory_format=torch.channels_last)


class Trainer:
    """SGD steps of one model on one device (bf16 autocast and channels_last on CUDA)."""

    def __init__(self, size: Size, device: torch.device) -> None:
        self.device = device
        self.model = model_for(size, device)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
        self.autocast = device.type == "cuda"

    def step(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        images = images.to(self.device, non_blocking=True)
        images = images.contiguous(memory_format=torch.channels_last).float().div_(255)
        labels = labels.to(self.device, non_blocking=True)
        with torch.autocast(self.device.type, torch.bfloat16, enabled=self.autocast):
            loss = torch.nn.functional.cross_entropy(self.model(images), labels)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def run(self, batches: Iterable) -> tuple[float, float, int]:
        """(wall seconds, seconds waiting for batches, images) of one pass."""
        self.sync()
        started = time.perf_counter()
        waited, images = 0.0, 0
        iterator = iter(batches)
        while True:
            asked = time.perf_counter()
            batch = next(iterator, None)
            waited += time.perf_counter() - asked
            if batch is None:
                break
            self.step(*batch)
            images += len(batch[0])
        self.sync()
        return time.perf_counter() - started, waited, images


def training(data: Data, size: Size, rounds: int, scratch: Path, device: torch.device) -> dict:
    """Images/s of a training epoch per loader over images/s on synthetic data; medians."""
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    trainer = Trainer(size, device)
    warm = scratch / "train-warm-cache"
    data.fill(warm)
    inputs, labels = next(iter(data.ours(data.paths, workers=0)))
    synthetic = (inputs.to(device), labels.to(device))
    steps = data.total() // data.batch
    trainer.run([synthetic] * min(steps, 5))  # warm-up: kernels chosen, memory allocated
    readers: dict[str, Callable[[int], Iterable]] = {
        "synthetic": lambda _: [synthetic] * steps,
        "ours_cold": lambda round_: data.cached(scratch / f"train-cold-{round_}"),
        "ours_warm": lambda _: data.cached(warm),
        "wds": lambda _: data.webdataset(),
        "wds_drop_last": lambda _: data.webdataset(drop_last=True),
    }
    rates: dict[str, list[float]] = {name: [] for name in readers}
    waits: dict[str, list[float]] = {name: [] for name in readers}
    seen: dict[str, int] = {}
    for round_ in range(rounds):
        for name, make in readers.items():
            seconds, waited, images = trainer.run(make(round_))
            rates[name].append(images / seconds)
            waits[name].append(100 * waited / seconds)
            seen[name] = images
    ceiling = statistics.median(rates["synthetic"])
    result = {"synthetic_images_per_s": ceiling}
    for name in readers:
        if name != "synthetic":
            result[f"{name}_vs_synthetic"] = statistics.median(rates[name]) / ceiling
            result[f"{name}_wait_pct"] = statistics.median(waits[name])
    result["wds_drop_last_dropped_pct"] = 100 * (1 - seen["wds_drop_last"] / data.total())
    return result


def run(rounds: int = 3, size: str | None = None, device: str | None = None) -> Results:
    """Every case at ``size`` ("full", "small"; default full on CUDA, else small)."""
    chosen = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    sizes = SIZES[size or ("full" if chosen.type == "cuda" else "small")]
    with tempfile.TemporaryDirectory(prefix="bench-gpu-") as temporary:
        scratch = Path(temporary)
        (scratch / "images").mkdir()
        (scratch / "rows").mkdir()
        images = Data(
            write_images(scratch / "images", sizes),
            scratch / "images",
            functools.partial(decode_image, crop=sizes.crop),
            sizes.image_batch,
            sizes.workers,
        )
        rows = Data(
            write_rows(scratch / "rows", sizes),
            scratch / "rows",
            decode_row,
            sizes.row_batch,
            sizes.workers,
        )
        return {
            "images_loader": loader_alone(images, rounds, scratch / "images"),
            "token_rows_loader": loader_alone(rows, rounds, scratch / "rows"),
            "training_step": training(images, sizes, rounds, scratch / "images", chosen),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--size", choices=sorted(SIZES), help="default: full on CUDA, else small")
    parser.add_argument("--device", help="default: cuda when available, else cpu")
    arguments = parser.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    print_results(run(arguments.rounds, arguments.size, arguments.device))


if __name__ == "__main__":
    main()
