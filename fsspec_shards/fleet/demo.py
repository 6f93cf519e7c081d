"""A small, seeded webdataset-format dataset on local disk, for the ``demo`` command and tests.

Each sample is three tar members sharing a key: ``<key>.jpg`` (random image-like bytes with
a JPEG signature), ``<key>.cls`` (an integer label as text) and ``<key>.json`` (metadata).
The tar bytes depend only on the arguments, so checksums are the same on every machine; the
``SHA256SUMS`` manifest is written in the format ``fsspec-shards manifest`` writes.
"""

from __future__ import annotations

import io
import json
import random
import tarfile
from dataclasses import dataclass
from pathlib import Path

from fsspec_shards.checksums import SUMS_NAME, Checksum, StreamingHasher, format_sums
from fsspec_shards.fleet.shards import open_filesystem

JPEG_SIGNATURE = b"\xff\xd8\xff\xe0\x00\x10JFIF\x00"


@dataclass(frozen=True)
class DemoDataset:
    """Where a demo dataset was written and what it holds."""

    directory: Path
    shards: list[Path]
    manifest: Path
    samples_per_shard: int

    @property
    def pattern(self) -> str:
        """A brace pattern naming every shard, e.g. ``/d/demo-{000000..000007}.tar``."""
        last = len(self.shards) - 1
        return str(self.directory / f"demo-{{000000..{last:06d}}}.tar")

    @property
    def total_samples(self) -> int:
        return self.samples_per_shard * len(self.shards)


def sample_members(rng: random.Random, key: str, index: int, image_bytes: int) -> list[tuple]:
    """The (name, payload) members of one sample, drawn from ``rng``."""
    size = rng.randint(image_bytes // 2, image_bytes * 3 // 2)
    image = JPEG_SIGNATURE + rng.randbytes(size)
    label = rng.randrange(10)
    metadata = {"index": index, "label": label, "width": 64, "height": 64}
    return [
        (f"{key}.jpg", image),
        (f"{key}.cls", str(label).encode()),
        (f"{key}.json", json.dumps(metadata, sort_keys=True).encode()),
    ]


def write_shard(path: Path, members: list[tuple]) -> None:
    """Write ``members`` as a ustar archive with fixed owner and time (reproducible bytes)."""
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as archive:
        for name, payload in members:
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            info.mtime = 1_700_000_000
            info.mode = 0o644
            info.uname = info.gname = "fsspec-shards"
            archive.addfile(info, io.BytesIO(payload))


def sha256_file(path: Path) -> Checksum:
    """The SHA-256 of a local file, read in 1 MiB blocks."""
    hasher = StreamingHasher("sha256")
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            hasher.update(block)
    return hasher.checksum()


def make_demo_dataset(
    directory: str | Path,
    shards: int = 8,
    samples_per_shard: int = 250,
    image_bytes: int = 4096,
    seed: int = 0,
) -> DemoDataset:
    """Write ``shards`` tar shards and their ``SHA256SUMS`` manifest into ``directory``."""
    root = Path(directory).expanduser().resolve()
    root.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    paths = []
    for shard_index in range(shards):
        members = []
        for offset in range(samples_per_shard):
            index = shard_index * samples_per_shard + offset
            members += sample_members(rng, f"sample{index:08d}", index, image_bytes)
        path = root / f"demo-{shard_index:06d}.tar"
        write_shard(path, members)
        paths.append(path)
    manifest = root / SUMS_NAME
    manifest.write_text(format_sums((path.name, sha256_file(path)) for path in paths))
    return DemoDataset(root, paths, manifest, samples_per_shard)


def make_cold(urls: list[str], options: dict[str, dict], own_cache: bool) -> None:
    """Make a first pass over ``urls`` cold: empty the demo's own cache, or drop just these
    shards from the user's cache (its other entries stay)."""
    fs, _ = open_filesystem(urls[0], options)
    if own_cache:
        fs.clear_cache()
        return
    for url in urls:
        fs.invalidate_cache(open_filesystem(url, options)[1])
