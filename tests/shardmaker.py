"""Small webdataset-format tar shards made by tests (shared by the dataset tests)."""

from __future__ import annotations

import gzip
import io
import tarfile
from pathlib import Path
from typing import Any


def sample_bytes(shard: int, index: int, size: int = 64) -> bytes:
    """Deterministic payload of one sample, different for every (shard, index)."""
    seed = f"{shard:04d}-{index:05d}|".encode()
    return (seed * (size // len(seed) + 1))[:size]


def shard_tar(shard: int, samples: int, payload_size: int = 64) -> bytes:
    """A tar with ``samples`` samples of two members each (``.txt`` and ``.cls``)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as archive:
        for index in range(samples):
            key = f"s{shard:04d}_{index:05d}"
            for extension, data in (
                ("txt", sample_bytes(shard, index, payload_size)),
                ("cls", str(index % 10).encode()),
            ):
                info = tarfile.TarInfo(f"{key}.{extension}")
                info.size = len(data)
                info.mtime = 0
                archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def write_shards(
    directory: Path,
    shards: int,
    samples: int | list[int],
    gz: bool = False,
    payload_size: int = 64,
    zst: bool = False,
) -> list[str]:
    """Write ``shards`` tar files into ``directory``; return their paths in order.

    ``samples`` is the sample count of every shard, or one count per shard; ``gz`` / ``zst``
    compress them (``.tar.gz`` / ``.tar.zst``).
    """
    counts = samples if isinstance(samples, list) else [samples] * shards
    paths = []
    for shard in range(shards):
        data = shard_tar(shard, counts[shard], payload_size)
        name = f"shard-{shard:04d}.tar" + (".gz" if gz else ".zst" if zst else "")
        path = Path(directory) / name
        if gz:
            data = gzip.compress(data, mtime=0)
        elif zst:
            data = zstd_compress(data)
        path.write_bytes(data)
        paths.append(str(path))
    return paths


def zstd_compress(data: bytes) -> bytes:
    """``data`` as ``ShardWriter`` compresses a ``.tar.zst`` shard."""
    from fsspec_shards.iteration import zstd

    buffer = io.BytesIO()
    writer = zstd.open_writer(buffer)
    writer.write(data)
    writer.close()
    return buffer.getvalue()


def keys(samples) -> list[str]:
    """The ``__key__`` of every sample dict, in order."""
    return [sample["__key__"] for sample in samples]


def regular(name: str, data: bytes, **fields) -> tuple[tarfile.TarInfo, bytes]:
    """A regular-file tar entry for :func:`make_tar`; ``fields`` set other TarInfo fields."""
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 1_700_000_000
    for field, value in fields.items():
        setattr(info, field, value)
    return info, data


def special(name: str, kind: bytes, linkname: str = "") -> tuple[tarfile.TarInfo, None]:
    """A non-regular tar entry (directory, link, device) for :func:`make_tar`."""
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    return info, None


def make_tar(entries, tar_format=tarfile.PAX_FORMAT, **open_options) -> bytes:
    """A tar written by Python's tarfile from ``(TarInfo, data)`` entries."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tar_format, **open_options) as archive:
        for info, data in entries:
            archive.addfile(info, io.BytesIO(data) if data is not None else None)
    return buffer.getvalue()


def compressed_zeros(size: int, compressor: Any) -> bytes:
    """A compressed tar of one member of ``size`` zero bytes (a decompression bomb), through
    ``compressor`` (a zlib or zstandard compressobj: ``compress`` and ``flush``)."""
    info = tarfile.TarInfo("bomb.bin")
    info.size = size
    pieces = [compressor.compress(info.tobuf(tarfile.USTAR_FORMAT))]
    chunk = bytes(1 << 20)
    for start in range(0, size, len(chunk)):
        pieces.append(compressor.compress(chunk[: size - start]))
    pieces.append(compressor.compress(bytes(-size % 512 + 1024)))
    pieces.append(compressor.flush())
    return b"".join(pieces)
