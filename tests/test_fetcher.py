"""The reads of the wds filesystem (``storage/fetcher.py``): the cached copy and its fill,
streamed reads with the cache off, ranges, prefetch, counters, and the per-process state
(backend, transport chosen when the filesystem is made, a forked child's own fetcher)."""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import uuid

import fsspec
import pytest

from fsspec_shards.errors import IntegrityError
from fsspec_shards.storage.fetcher import Fetcher
from fsspec_shards.storage.files import RetryingFile
from fsspec_shards.storage.filesystem import WdsFileSystem
from tests.faults import Flip
from tests.planned_faults import UnknownSizeFileSystem
from tests.wds_filesystem import SHARD_DATA, local_shard, planned_filesystem, wds_filesystem

DATA = SHARD_DATA


@pytest.fixture
def shard(tmp_path):
    """A local file and the options of a fresh cache directory."""
    return local_shard(tmp_path)


def test_the_filesystem_makes_one_fetcher_holding_backend_transport_and_policy(tmp_path):
    fs, backend, path = planned_filesystem(tmp_path, retries=4)
    fetcher = fs.fetcher
    assert isinstance(fetcher, Fetcher) and fs.fetcher is fetcher
    assert fetcher.fs is backend is fs.fs
    assert fetcher.transport is fs.download_transport  # built with the fetcher
    assert fetcher.policy is fs.policy and fs.policy.attempts == 4
    assert fetcher.owner is fs
    assert fetcher.object(path) is fetcher.object(path)  # remembered


def test_a_fetcher_of_another_process_is_replaced_once_keeping_the_loaded_manifest(shard):
    path, options = shard
    sums = {"train-0000.tar": "sha256:" + hashlib.sha256(DATA).hexdigest()}
    fs = wds_filesystem(target_protocol="file", checksums=sums, **options)
    parent = fs.fetcher
    parent.pid = -1  # as a forked child sees its parent's fetcher
    child = fs.fetcher
    assert child is not parent and child.pid == os.getpid() and fs.fetcher is child
    assert parent.in_this_process() is child  # built once
    assert child.manifest is parent.manifest
    assert child.policy == parent.policy and child.options is parent.options
    assert fs.cat_file(path) == DATA


def _read_in_child(fs: WdsFileSystem, path: str, queue) -> None:
    queue.put((fs.cat_file(path, 0, 10), fs.fetcher.pid == os.getpid()))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork() only")
def test_a_forked_child_reads_through_a_fetcher_of_its_own(shard):
    path, options = shard
    fs = wds_filesystem(target_protocol="file", **options)
    assert fs.cat_file(path) == DATA
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_read_in_child, args=(fs, path, queue))
    child.start()
    assert queue.get(timeout=60) == (DATA[:10], True)
    child.join(60)
    assert child.exitcode == 0


def test_ranges_of_one_path_are_read_of_one_opened_copy(tmp_path):
    fs, backend, path = planned_filesystem(tmp_path, cache=False)
    assert fs.fetcher.read_ranges(path, [(0, 3), (-3, None), (5, 5)]) == [
        DATA[:3],
        DATA[-3:],
        b"",
    ]
    assert sum(length for _, _, length in backend.reads) == 6


def test_a_cache_hit_makes_no_backend_read(tmp_path):
    fs, backend, path = planned_filesystem(tmp_path)
    assert fs.cat_file(path) == DATA
    reads = len(backend.reads)
    with fs.open(path) as handle:
        handle.seek(1000)
        assert handle.read(10) == DATA[1000:1010]
    assert fs.cat_file(path, 5, 50) == DATA[5:50]
    assert len(backend.reads) == reads


def test_without_cache_reads_stream_seekably_and_keep_nothing(shard, tmp_path):
    path, options = shard
    fs = wds_filesystem(target_protocol="file", cache=False, block_size=4096, **options)
    with fs.open(path) as handle:
        assert isinstance(handle, RetryingFile)
        handle.seek(len(DATA) - 100)
        assert handle.read() == DATA[-100:]
        handle.seek(10)
        assert handle.read(5) == DATA[10:15]
    assert fs.cat_file(path) == DATA
    stats = fs.cache_stats()
    assert stats["cached_files"] == 0 and stats["bytes_downloaded"] > len(DATA)
    assert not os.path.exists(options["cache_dir"])
    assert fs.prefetch(path) is None


def test_an_uncached_file_replaced_while_open_raises_instead_of_mixing_versions(tmp_path):
    fs, backend, path = planned_filesystem(tmp_path, cache=False, block_size=4096)
    with fs.open(path) as handle:
        assert handle.read(4096) == DATA[:4096]
        backend.pipe_file(path, bytes(reversed(DATA)))
        with pytest.raises(OSError, match="changed while it was read"):
            handle.read()


def test_streamed_read_checks_the_checksum_at_the_end(shard):
    path, options = shard
    wrong = {path: "sha256:" + hashlib.sha256(b"other").hexdigest()}
    fs = wds_filesystem(target_protocol="file", cache=False, checksums=wrong, **options)
    with fs.open(path) as handle, pytest.raises(IntegrityError, match="train-0000.tar"):
        handle.read()
    assert fs.cache_stats()["integrity_failures"] == 1


def test_wrong_manifest_checksum_raises_integrity_error_and_caches_nothing(shard):
    path, options = shard
    wrong = {"train-0000.tar": "md5:" + hashlib.md5(b"other").hexdigest()}
    fs = wds_filesystem(target_protocol="file", checksums=wrong, retries=2, **options)
    with pytest.raises(IntegrityError) as raised:
        fs.cat_file(path)
    assert raised.value.expected == wrong["train-0000.tar"]
    stats = fs.cache_stats()
    assert (stats["integrity_failures"], stats["cached_files"]) == (2, 0)


def test_verify_size_ignores_a_wrong_checksum(shard):
    path, options = shard
    wrong = {"train-0000.tar": "md5:" + hashlib.md5(b"other").hexdigest()}
    fs = wds_filesystem(target_protocol="file", checksums=wrong, verify="size", **options)
    assert fs.cat_file(path) == DATA


def test_a_flipped_byte_is_caught_by_the_sums_file_and_fetched_again(tmp_path):
    # the sums file, the block manifest beside it (none), then the shard
    fs, backend, path = planned_filesystem(tmp_path, plan=[None, None, Flip(99)])
    sums = os.path.dirname(path) + "/SHA256SUMS"
    backend.pipe_file(sums, f"{hashlib.sha256(DATA).hexdigest()} *train-0000.tar\n".encode())
    fs = wds_filesystem(fs=backend, cache_dir=str(tmp_path / "c2"), backoff=0.001, checksums=sums)
    assert fs.cat_file(path) == DATA
    assert fs.cache_stats()["integrity_failures"] == 1
    metadata = fs.shard_cache.metadata(fs.fetcher.object(path))
    assert metadata["checksum"] == "sha256:" + hashlib.sha256(DATA).hexdigest()


def test_a_ranged_miss_fills_the_cache_with_the_whole_verified_file(tmp_path):
    fs, backend, path = planned_filesystem(tmp_path)
    assert fs.cat_file(path, 10, 20) == DATA[10:20]
    assert fs.cache_stats()["cached_files"] == 1
    reads = len(backend.reads)
    assert fs.cat_file(path, -10) == DATA[-10:]
    results = fs.cat_ranges([path, path, path], [0, 100, -5], [4, 110, None])
    assert results == [DATA[:4], DATA[100:110], DATA[-5:]]
    assert len(backend.reads) == reads


def test_a_ranged_miss_with_a_checksum_known_never_returns_a_corrupted_byte(tmp_path):
    manifest = {"train-0000.tar": "sha256:" + hashlib.sha256(DATA).hexdigest()}
    fs, _, path = planned_filesystem(tmp_path, plan=[Flip(15)] * 10, checksums=manifest)
    with pytest.raises(IntegrityError, match="train-0000.tar"):
        fs.cat_file(path, 10, 20)
    assert isinstance(fs.cat_ranges([path], [10], [20])[0], IntegrityError)
    assert fs.cache_stats()["cached_files"] == 0


def test_direct_ranged_reads_read_just_the_range_and_keep_nothing(tmp_path):
    fs, backend, path = planned_filesystem(tmp_path, ranged_reads="direct")
    assert fs.cat_file(path, 10, 20) == DATA[10:20]
    assert fs.cat_file(path, -10) == DATA[-10:]
    results = fs.cat_ranges([path, path, path], [0, 100, -5], [4, 110, None])
    assert results == [DATA[:4], DATA[100:110], DATA[-5:]]
    assert fs.cache_stats()["cached_files"] == 0
    assert sum(length for _, _, length in backend.reads) == 10 + 10 + 4 + 10 + 5
    assert fs.prefetch(path).startswith(fs.options.cache_dir)
    reads = len(backend.reads)
    assert fs.cat_file(path, 10, 20) == DATA[10:20]  # a cached copy serves direct reads too
    assert len(backend.reads) == reads


def test_auto_transport_uses_the_fsspec_backend_where_obstore_has_no_store_and_says_why(
    tmp_path, caplog
):
    from fsspec_shards.storage.transfer.streams import CatFileTransport

    with caplog.at_level("DEBUG", logger="fsspec_shards.storage.transfer.obstore_transport"):
        fs = wds_filesystem(target_protocol="file", cache_dir=str(tmp_path))  # chosen now
    assert isinstance(fs.download_transport, CatFileTransport)
    pytest.importorskip("obstore")  # with it installed, the reason is the protocol
    assert "obstore has no store for protocol 'file'" in caplog.records[0].getMessage()


def test_an_option_obstore_cannot_carry_over_is_named_or_sends_auto_to_fsspec(tmp_path, caplog):
    pytest.importorskip("obstore")
    pytest.importorskip("s3fs")
    options = {
        "key": "AKID",
        "secret": "not-used",
        "client_kwargs": {"endpoint_url": "http://127.0.0.1:9"},
        "config_kwargs": {"signature_version": "s3"},  # SigV2: obstore signs SigV4 only
    }
    with pytest.raises(ValueError, match="config_kwargs.signature_version"):
        wds_filesystem(target_protocol="s3", target_options=options, transport="obstore")
    with caplog.at_level("DEBUG", logger="fsspec_shards.storage.transfer.obstore_transport"):
        fs = wds_filesystem(target_protocol="s3", target_options=options, cache_dir=str(tmp_path))
    assert type(fs.download_transport.backend).__name__ == "S3Backend"  # fsspec's stream
    assert "config_kwargs.signature_version" in caplog.records[0].getMessage()


def test_a_file_larger_than_the_cache_is_streamed_with_a_warning(shard):
    path, options = shard
    fs = wds_filesystem(target_protocol="file", cache_size=1000, **options)
    with pytest.warns(UserWarning, match="streaming"):
        with fs.open(path) as handle:
            assert handle.read() == DATA
    assert fs.cache_stats()["cached_files"] == 0


def test_check_stale_notices_a_changed_object_and_the_default_trusts_the_cache(shard):
    path, options = shard
    trusting = wds_filesystem(target_protocol="file", **options)
    checking = wds_filesystem(target_protocol="file", check_stale=True, **options)
    assert trusting.cat_file(path) == DATA
    with open(path, "wb") as handle:
        handle.write(b"changed")
    assert trusting.cat_file(path) == DATA
    assert checking.cat_file(path) == b"changed"


def test_clear_cache_empties_it(shard):
    path, options = shard
    fs = wds_filesystem(target_protocol="file", **options)
    fs.prefetch(path)
    fs.clear_cache()
    stats = fs.cache_stats()
    assert stats["cached_files"] == 0 and stats["cached_bytes"] == 0


def test_an_uncached_object_of_unknown_size_is_read_whole_and_seekable(tmp_path):
    backend = UnknownSizeFileSystem()
    path = f"/fs-{uuid.uuid4().hex}/no-length.bin"
    backend.pipe_file(path, DATA)
    fs = wds_filesystem(fs=backend, cache=False, cache_dir=str(tmp_path / "cache"))
    with fs.open(path) as handle:
        handle.seek(1000)
        assert handle.read(10) == DATA[1000:1010]
        handle.seek(0)
        assert handle.read() == DATA


def test_prefetch_counts_a_miss_when_it_downloads_and_nothing_when_already_cached(shard):
    path, options = shard
    fs = wds_filesystem(target_protocol="file", **options)
    local = fs.prefetch(path)
    assert fs.prefetch(path) == local
    stats = fs.cache_stats()
    assert (stats["misses"], stats["hits"]) == (1, 0)
    for hits in (0, 1):  # the read the prefetch was for is no hit of its own; the next one is
        with fs.open(path) as handle:
            assert handle.read() == DATA
        assert fs.cache_stats()["hits"] == hits


@pytest.mark.parametrize("cache", [True, False])
def test_reading_a_directory_raises_is_a_directory_error_naming_the_url(tmp_path, cache):
    """Object stores list prefixes as size-0 directories: reading one is no empty file."""
    backend = fsspec.filesystem("memory", skip_instance_cache=True)
    folder = f"/fs-{uuid.uuid4().hex}/shards"
    backend.pipe_file(f"{folder}/train-0000.tar", DATA)
    fs = wds_filesystem(fs=backend, cache_dir=str(tmp_path / "cache"), cache=cache)
    for read in (lambda: fs.open(folder).read(), lambda: fs.cat_file(folder)):
        with pytest.raises(IsADirectoryError, match=f"memory://{folder}"):
            read()
    assert fs.cache_stats()["cached_files"] == 0


def test_without_cache_the_counters_include_reads_made_in_other_threads(shard):
    """fsspec makes one instance per thread; DataLoader and dask threads read through theirs."""
    import threading

    path, options = shard
    options = {**options, "cache": False}

    def read() -> None:
        with fsspec.open(f"wds::file://{path}", "rb", wds=options) as handle:
            handle.read()

    thread = threading.Thread(target=read)
    thread.start()
    thread.join(60)
    fs, _ = fsspec.core.url_to_fs(f"wds::file://{path}", wds=options)
    assert fs.cache_stats()["bytes_downloaded"] == len(DATA)
    fs.clear_cache()
    assert fs.cache_stats()["bytes_downloaded"] == 0


def test_the_manifest_loads_beside_the_first_files_stat(tmp_path):
    """A process's first file waits for the longer of its stat and the manifest's reads,
    not for both: here the manifest's read waits until the file's stat has been asked."""
    import threading

    from fsspec.implementations.memory import MemoryFileSystem

    stat_asked = threading.Event()

    class StatFirst(MemoryFileSystem):
        def info(self, path, **kwargs):
            if path.endswith(".tar"):
                stat_asked.set()
            return super().info(path, **kwargs)

        def cat_file(self, path, *args, **kwargs):
            if path.endswith("SHA256SUMS") and not stat_asked.wait(10):
                raise TimeoutError("the manifest was read before the stat was asked")
            return super().cat_file(path, *args, **kwargs)

    backend = StatFirst(skip_instance_cache=True)
    path = f"/fs-{uuid.uuid4().hex}/train-0000.tar"
    backend.pipe_file(path, DATA)
    sums = os.path.dirname(path) + "/SHA256SUMS"
    backend.pipe_file(sums, f"{hashlib.sha256(DATA).hexdigest()} *train-0000.tar\n".encode())
    fs = wds_filesystem(fs=backend, cache_dir=str(tmp_path / "cache"), retries=1, checksums=sums)
    with fs.open(path) as handle:
        assert handle.read() == DATA
    metadata = fs.shard_cache.metadata(fs.fetcher.object(path))
    assert metadata["checksum"] == "sha256:" + hashlib.sha256(DATA).hexdigest()
