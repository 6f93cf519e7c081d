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

from fsspec_shards.errors import IntegrityError
from fsspec_shards.storage.files import CachedFile, DropCachedOnClose, RetryingFile

DATA = bytes(range(256)) * 256  # 64 KiB, deterministic
WRONG = "sha256:" + hashlib.sha256(b"other").hexdigest()


@pytest.fixture
def shard(tmp_path):
    path = tmp_path / "train-0000.tar"
    path.write_bytes(DATA)
    return str(path), {"cache_dir": str(tmp_path / "cache"), "backoff": 0.001}


def _wds(**options):
    return fsspec.filesystem("wds", skip_instance_cache=True, target_protocol="file", **options)


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
    fs = _wds(**options)
    with fs.open(path) as handle:
        assert isinstance(handle, CachedFile)
        assert handle.fs is fs and handle.path == path
        assert handle.raw.name != path  # the local copy, not the backend's file
        handle.seek(500)
    with pickle.loads(pickle.dumps(handle)) as clone:  # closed: reopened at the start
        assert clone.tell() == 0 and clone.read(4) == DATA[:4]


def test_a_streamed_file_read_in_order_in_pieces_is_verified_at_its_last_byte(shard):
    path, options = shard
    fs = _wds(cache=False, block_size=4096, checksums={path: WRONG}, **options)
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
    fs = _wds(cache=False, block_size=4096, checksums={path: WRONG}, **options)
    with fs.open(path) as handle:
        handle.seek(4096)
        assert handle.read() == DATA[4096:]
        assert handle.read() == b""
    assert fs.cache_stats()["integrity_failures"] == 0


def test_a_streamed_file_with_the_right_checksum_reads_whole(shard):
    path, options = shard
    right = "sha256:" + hashlib.sha256(DATA).hexdigest()
    fs = _wds(cache=False, block_size=4096, checksums={path: right}, **options)
    with fs.open(path) as handle:
        assert handle.read() == DATA
    stats = fs.cache_stats()
    assert stats["integrity_failures"] == 0 and stats["bytes_downloaded"] == len(DATA)
