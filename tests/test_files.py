"""The file objects of :mod:`fsspec_shards.storage.files`, over local and in-memory files:
what closing a written file does, how an open cached file pickles, when a streamed file is
verified."""

from __future__ import annotations

import errno
import hashlib
import os
import pickle
import uuid

import fsspec
import pytest

from fsspec_shards.checksums import BlockHasher, format_block_manifest, format_sums
from fsspec_shards.errors import IntegrityError
from fsspec_shards.storage.files import CachedFile, DropCachedOnClose, RetryingFile
from fsspec_shards.storage.filesystem import WdsFileSystem
from tests.planned_faults import PlannedFaultFileSystem, UnknownSizeFileSystem
from tests.wds_filesystem import wds_filesystem

DATA = bytes(range(256)) * 256  # 64 KiB, deterministic
WRONG = "sha256:" + hashlib.sha256(b"other").hexdigest()


@pytest.fixture
def shard(tmp_path):
    path = tmp_path / "train-0000.tar"
    path.write_bytes(DATA)
    return str(path), {"cache_dir": str(tmp_path / "cache"), "backoff": 0.001}


def _memory_file():
    memory = fsspec.filesystem("memory")
    path = f"/files-{uuid.uuid4().hex}/out.bin"
    return memory, path, memory.open(path, "wb")


def test_a_written_file_reaches_the_backend_and_closing_drops_the_cached_copy_once():
    memory, path, handle = _memory_file()
    drops = []
    written = DropCachedOnClose(handle, lambda: drops.append(path))
    assert written.writable() and not written.readable() and not written.seekable()
    assert written.write(b"abc") == 3 and written.tell() == 3
    assert written.path == handle.path  # what the backend file knows, passed through
    written.close()
    written.close()
    assert drops == [path] and memory.cat_file(path) == b"abc"


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
def test_the_cached_copy_is_dropped_even_when_the_backend_fails_to_close():
    drops = []
    handle = fsspec.filesystem("file").open("/dev/full", "wb")  # every flush: ENOSPC
    written = DropCachedOnClose(handle, lambda: drops.append(1))
    written.write(b"x" * 10)
    with pytest.raises(OSError) as raised:
        written.close()
    assert raised.value.errno == errno.ENOSPC
    assert drops == [1] and written.closed


def test_a_cached_file_names_its_filesystem_and_path_and_pickles_reopened(shard):
    path, options = shard
    fs = wds_filesystem("file", **options)
    with fs.open(path) as handle:
        assert isinstance(handle, CachedFile)
        assert handle.fs is fs and handle.path == path
        assert handle.raw.name != path  # the local copy, not the backend's file
        handle.seek(500)
    with pickle.loads(pickle.dumps(handle)) as clone:  # closed: reopened at the start
        assert clone.tell() == 0 and clone.read(4) == DATA[:4]


def test_a_streamed_file_read_in_order_in_pieces_is_verified_at_its_last_byte(shard):
    path, options = shard
    fs = wds_filesystem("file", cache=False, block_size=4096, checksums={path: WRONG}, **options)
    with fs.open(path) as handle:
        assert isinstance(handle, RetryingFile)
        got = bytearray()
        with pytest.raises(IntegrityError, match="train-0000.tar"):
            while piece := handle.read(1000):
                got += piece
    # raised when the last byte arrived: read ahead of the caller by a block at most
    assert len(DATA) - 2 * 4096 <= len(got) < len(DATA) and got == DATA[: len(got)]
    assert fs.cache_stats()["integrity_failures"] == 1


def test_a_streamed_file_not_read_from_its_start_is_not_checked(shard):
    path, options = shard
    fs = wds_filesystem("file", cache=False, block_size=4096, checksums={path: WRONG}, **options)
    with fs.open(path) as handle:
        handle.seek(4096)
        assert handle.read() == DATA[4096:]
        assert handle.read() == b""
    assert fs.cache_stats()["integrity_failures"] == 0


def test_a_streamed_file_with_the_right_checksum_reads_whole(shard):
    path, options = shard
    right = "sha256:" + hashlib.sha256(DATA).hexdigest()
    fs = wds_filesystem("file", cache=False, block_size=4096, checksums={path: right}, **options)
    with fs.open(path) as handle:
        assert handle.read() == DATA
    stats = fs.cache_stats()
    assert stats["integrity_failures"] == 0 and stats["bytes_downloaded"] == len(DATA)


# -- fsspec's file interface on every kind of file ``open`` returns ----------------------

LINES = b"".join(b"line %d %s\n" % (i, b"x" * (i % 37)) for i in range(2000))
BLOCK = 4096
BLOCKS = [(0, 5000), (5000, 5000), (12345, 1), (len(LINES) - 100, 500), (0, None)]


def _with_manifests(backend, directory: str, path: str) -> str:
    """A sums file and a block manifest of ``LINES`` at ``path``; the sums file's path."""
    hasher = BlockHasher(BLOCK)
    hasher.update(LINES)
    blocks = hasher.block_list()
    name = path.rsplit("/", 1)[1]
    backend.pipe_file(f"{directory}/SHA256SUMS", format_sums([(name, blocks.checksum)]).encode())
    manifest = format_block_manifest([(name, blocks)], BLOCK).encode()
    backend.pipe_file(f"{directory}/SHA256SUMS.blocks", manifest)
    return f"{directory}/SHA256SUMS"


def _shared_tier_hit(backend, path: str, tmp_path) -> WdsFileSystem:
    """A wds filesystem whose next read of ``path`` comes from the shared tier (another
    node filled it)."""
    shared = str(tmp_path / "shared")
    WdsFileSystem(fs=backend, cache_dir=str(tmp_path / "node-a"), shared_cache_dir=shared).cat_file(
        path
    )
    return WdsFileSystem(fs=backend, cache_dir=str(tmp_path / "node-b"), shared_cache_dir=shared)


KINDS = {  # the wds options that make open() return each kind of file (None: set up below)
    "cached": {},
    "filling by blocks": {"checksums": "SUMS"},
    "streamed": {"cache": False},
    "streamed by blocks": {"cache": False, "checksums": "SUMS"},
    "spooled without a size": {"cache": False},
    "shared tier": None,
}


@pytest.mark.parametrize("kind", KINDS)
def test_every_file_open_returns_has_fsspecs_file_interface_and_read_block_works(kind, tmp_path):
    sizeless = kind == "spooled without a size"
    backend = UnknownSizeFileSystem() if sizeless else PlannedFaultFileSystem()
    directory = f"/files-{uuid.uuid4().hex}"
    path = f"{directory}/train-0000.tar"
    backend.pipe_file(path, LINES)
    sums = _with_manifests(backend, directory, path)
    if kind == "shared tier":
        fs = _shared_tier_hit(backend, path, tmp_path)
    else:
        options = {name: sums if value == "SUMS" else value for name, value in KINDS[kind].items()}
        fs = WdsFileSystem(fs=backend, cache_dir=str(tmp_path / "cache"), **options)
    plain = PlannedFaultFileSystem()  # the reference: fsspec's own read_block over the bytes
    plain.pipe_file(path, LINES)

    with fs.open(path, "rb") as handle:
        assert handle.size == len(LINES) and handle.info()["size"] == len(LINES)
        assert handle.info()["name"].endswith("train-0000.tar") and handle.loc == 0
        handle.seek(100)
        assert handle.read(10) == LINES[100:110] and handle.loc == 110
    for offset, length in BLOCKS:
        expected = plain.read_block(path, offset, length, delimiter=b"\n")
        assert fs.read_block(path, offset, length, delimiter=b"\n") == expected
        assert fs.read_block(path, offset, length) == plain.read_block(path, offset, length)
    if kind == "shared tier":
        assert fs.cache_stats()["shared_hits"] == 1


@pytest.mark.parametrize("end", ["commit", "discard"])
def test_a_file_written_in_a_transaction_drops_the_cached_copy_at_its_end_too(end, tmp_path):
    path = str(tmp_path / "out.bin")
    local = fsspec.filesystem("file")
    drops = []  # whether the path held the new bytes at each drop
    handle = local.open(path, "wb", autocommit=False)
    written = DropCachedOnClose(handle, lambda: drops.append(os.path.exists(path)))
    written.write(b"abc")
    written.close()
    getattr(written, end)()
    assert drops == [False, end == "commit"]  # at the close, then after the commit/discard
