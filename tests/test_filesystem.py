"""The wds filesystem over local and in-memory backends: options, cache, verify, writes."""

from __future__ import annotations

import hashlib
import os
import pickle
import subprocess
import sys
import textwrap
import uuid

import fsspec
import pytest

from fsspec_shards.errors import IntegrityError
from fsspec_shards.storage.files import RetryingFile
from fsspec_shards.storage.filesystem import WdsFileSystem
from tests.planned_faults import Flip, PlannedFaultFileSystem, UnknownSizeFileSystem

DATA = os.urandom(0) or bytes(range(256)) * 4000  # 1 MB, deterministic


@pytest.fixture
def shard(tmp_path):
    """A local file and the options of a fresh cache directory."""
    path = tmp_path / "data" / "train-0000.tar"
    path.parent.mkdir()
    path.write_bytes(DATA)
    return str(path), {"cache_dir": str(tmp_path / "cache"), "backoff": 0.001}


def _wds(**options) -> WdsFileSystem:
    return fsspec.filesystem("wds", skip_instance_cache=True, **options)


def _planned(tmp_path, plan=None, **options):
    backend = PlannedFaultFileSystem(plan)
    path = f"/fs-{uuid.uuid4().hex}/train-0000.tar"
    backend.pipe_file(path, DATA)
    fs = _wds(fs=backend, cache_dir=str(tmp_path / "cache"), backoff=0.001, **options)
    return fs, backend, path


def test_chained_url_reads_the_backend_bytes_and_a_second_read_is_a_cache_hit(shard):
    path, options = shard
    for _ in range(2):
        with fsspec.open(f"wds::file://{path}", "rb", wds=options) as handle:
            assert handle.read() == DATA
    fs, _ = fsspec.core.url_to_fs(f"wds::file://{path}", wds=options)
    stats = fs.cache_stats()
    assert (stats["misses"], stats["hits"], stats["bytes_downloaded"]) == (1, 1, len(DATA))
    assert (stats["cached_files"], stats["cached_bytes"]) == (1, len(DATA))


def test_a_cache_hit_makes_no_backend_read(tmp_path):
    fs, backend, path = _planned(tmp_path)
    assert fs.cat_file(path) == DATA
    reads = len(backend.reads)
    with fs.open(path) as handle:
        handle.seek(1000)
        assert handle.read(10) == DATA[1000:1010]
    assert fs.cat_file(path, 5, 50) == DATA[5:50]
    assert len(backend.reads) == reads


def test_every_url_form_of_one_object_maps_to_one_instance_and_path(shard):
    path, options = shard
    fs1, p1 = fsspec.core.url_to_fs(f"wds::file://{path}", wds=options)
    fs2, p2 = fsspec.core.url_to_fs(f"wds::{path}", wds=options)
    assert fs1 is fs2 and p1 == p2 == path
    assert fs1.cat_file(f"wds::file://{path}", 0, 4) == fs1.cat_file(path, 0, 4) == DATA[:4]


def test_options_come_from_fsspec_config_and_explicit_arguments_win(monkeypatch, tmp_path):
    conf: dict = {}
    fsspec.config.set_conf_env(
        conf,
        {"FSSPEC_WDS_RETRIES": "3", "FSSPEC_WDS_CACHE_SIZE": "1GiB", "FSSPEC_WDS_VERIFY": "size"},
    )
    monkeypatch.setitem(fsspec.config.conf, "wds", conf["wds"])
    fs = _wds(target_protocol="file", cache_dir=str(tmp_path))
    assert (fs.policy.attempts, fs.options.cache_size, fs.options.verify) == (3, 1024**3, "size")
    fs = _wds(target_protocol="file", cache_dir=str(tmp_path), retries=7)
    assert fs.policy.attempts == 7


def test_a_request_counts_as_stalled_after_30_seconds_without_progress_by_default(tmp_path):
    assert _wds(target_protocol="file", cache_dir=str(tmp_path)).policy.timeout == 30.0
    assert _wds(target_protocol="file", cache_dir=str(tmp_path), timeout=5).policy.timeout == 5.0


def test_cache_location_and_size_default_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("FSSPEC_SHARDS_CACHE", str(tmp_path / "c"))
    monkeypatch.setenv("WDS_CACHE_SIZE", "5MB")
    fs = _wds(target_protocol="file")
    assert (fs.options.cache_dir, fs.options.cache_size) == (str(tmp_path / "c"), 5_000_000)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"retries": 0}, "retries"),
        ({"retries": "many"}, "retries"),
        ({"verify": "sha256"}, "verify"),
        ({"cache_size": "lots"}, "cache_size"),
        ({"timeout": -1}, "timeout"),
        ({"cache": "maybe"}, "cache"),
        ({"checksums": 5}, "checksums"),
        ({"checksums": {"train-0000.tar": "sha1:00"}}, "checksums entry for train-0000.tar"),
        ({"anon": True}, "unknown option.*anon"),
        ({"target_protocol": None}, "needs a backend"),
    ],
)
def test_invalid_options_raise_a_value_error_naming_the_option(options, message):
    arguments = {"target_protocol": "file", **options}
    with pytest.raises(ValueError, match=message):
        _wds(**arguments)


def test_instances_pickle_and_tokenize_stably(shard):
    path, options = shard
    fs, _ = fsspec.core.url_to_fs(f"wds::file://{path}", wds=options)
    clone = pickle.loads(pickle.dumps(fs))
    assert clone._fs_token == fs._fs_token
    assert clone.cat_file(path) == DATA
    other = _wds(target_protocol="file", cache_dir=options["cache_dir"], retries=2)
    assert other._fs_token != fs._fs_token


def test_fresh_interpreter_resolves_wds_urls_without_importing_the_package(shard):
    path, options = shard
    script = textwrap.dedent(
        f"""
        import sys, fsspec
        assert "fsspec_shards" not in sys.modules
        with fsspec.open("wds::file://{path}", "rb", wds={options!r}) as f:
            data = f.read()
        print(len(data), type(f).__name__)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    assert result.stdout.split()[0] == str(len(DATA))


def test_without_cache_reads_stream_seekably_and_keep_nothing(shard, tmp_path):
    path, options = shard
    fs = _wds(target_protocol="file", cache=False, block_size=4096, **options)
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
    fs, backend, path = _planned(tmp_path, cache=False, block_size=4096)
    with fs.open(path) as handle:
        assert handle.read(4096) == DATA[:4096]
        backend.pipe_file(path, bytes(reversed(DATA)))
        with pytest.raises(OSError, match="changed while it was read"):
            handle.read()


def test_streamed_read_checks_the_checksum_at_the_end(shard):
    path, options = shard
    wrong = {path: "sha256:" + hashlib.sha256(b"other").hexdigest()}
    fs = _wds(target_protocol="file", cache=False, checksums=wrong, **options)
    with fs.open(path) as handle, pytest.raises(IntegrityError, match="train-0000.tar"):
        handle.read()
    assert fs.cache_stats()["integrity_failures"] == 1


def test_wrong_manifest_checksum_raises_integrity_error_and_caches_nothing(shard):
    path, options = shard
    wrong = {"train-0000.tar": "md5:" + hashlib.md5(b"other").hexdigest()}
    fs = _wds(target_protocol="file", checksums=wrong, retries=2, **options)
    with pytest.raises(IntegrityError) as raised:
        fs.cat_file(path)
    assert raised.value.expected == wrong["train-0000.tar"]
    stats = fs.cache_stats()
    assert (stats["integrity_failures"], stats["cached_files"]) == (2, 0)


def test_verify_size_ignores_a_wrong_checksum(shard):
    path, options = shard
    wrong = {"train-0000.tar": "md5:" + hashlib.md5(b"other").hexdigest()}
    fs = _wds(target_protocol="file", checksums=wrong, verify="size", **options)
    assert fs.cat_file(path) == DATA


def test_a_flipped_byte_is_caught_by_the_sums_file_and_fetched_again(tmp_path):
    # the sums file, the block manifest beside it (none), then the shard
    fs, backend, path = _planned(tmp_path, plan=[None, None, Flip(99)])
    sums = os.path.dirname(path) + "/SHA256SUMS"
    backend.pipe_file(sums, f"{hashlib.sha256(DATA).hexdigest()} *train-0000.tar\n".encode())
    fs = _wds(fs=backend, cache_dir=str(tmp_path / "c2"), backoff=0.001, checksums=sums)
    assert fs.cat_file(path) == DATA
    assert fs.cache_stats()["integrity_failures"] == 1
    metadata = fs.shard_cache.metadata(fs._object(path))
    assert metadata["checksum"] == "sha256:" + hashlib.sha256(DATA).hexdigest()


def test_a_ranged_miss_fills_the_cache_with_the_whole_verified_file(tmp_path):
    fs, backend, path = _planned(tmp_path)
    assert fs.cat_file(path, 10, 20) == DATA[10:20]
    assert fs.cache_stats()["cached_files"] == 1
    reads = len(backend.reads)
    assert fs.cat_file(path, -10) == DATA[-10:]
    results = fs.cat_ranges([path, path, path], [0, 100, -5], [4, 110, None])
    assert results == [DATA[:4], DATA[100:110], DATA[-5:]]
    assert len(backend.reads) == reads


def test_a_ranged_miss_with_a_checksum_known_never_returns_a_corrupted_byte(tmp_path):
    manifest = {"train-0000.tar": "sha256:" + hashlib.sha256(DATA).hexdigest()}
    fs, _, path = _planned(tmp_path, plan=[Flip(15)] * 10, checksums=manifest)
    with pytest.raises(IntegrityError, match="train-0000.tar"):
        fs.cat_file(path, 10, 20)
    assert isinstance(fs.cat_ranges([path], [10], [20])[0], IntegrityError)
    assert fs.cache_stats()["cached_files"] == 0


def test_direct_ranged_reads_read_just_the_range_and_keep_nothing(tmp_path):
    fs, backend, path = _planned(tmp_path, ranged_reads="direct")
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


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"ranged_reads": "sometimes"}, "ranged_reads"),
        ({"ranged_reads": "cache", "cache": False}, "direct"),
    ],
)
def test_ranged_reads_option_is_checked(tmp_path, options, message):
    with pytest.raises(ValueError, match=message):
        _wds(target_protocol="file", cache_dir=str(tmp_path), **options)


def test_transport_option_is_checked_and_named(tmp_path):
    with pytest.raises(ValueError, match="'transport'.*auto, obstore, fsspec"):
        _wds(target_protocol="file", cache_dir=str(tmp_path), transport="fast")
    pytest.importorskip("obstore")
    with pytest.raises(ValueError, match="transport='obstore' cannot serve 'file'"):
        _wds(target_protocol="file", cache_dir=str(tmp_path), transport="obstore")


def test_auto_transport_uses_the_fsspec_backend_where_obstore_has_no_store_and_says_why(
    tmp_path, caplog
):
    from fsspec_shards.storage.transfer.streams import CatFileTransport

    fs = _wds(target_protocol="file", cache_dir=str(tmp_path))
    with caplog.at_level("DEBUG", logger="fsspec_shards.storage.transfer.obstore_transport"):
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
        _wds(target_protocol="s3", target_options=options, transport="obstore")
    fs = _wds(target_protocol="s3", target_options=options, cache_dir=str(tmp_path))
    with caplog.at_level("DEBUG", logger="fsspec_shards.storage.transfer.obstore_transport"):
        assert type(fs.download_transport.backend).__name__ == "S3Backend"  # fsspec's stream
    assert "config_kwargs.signature_version" in caplog.records[0].getMessage()


def test_transport_comes_from_the_environment(monkeypatch, tmp_path):
    conf: dict = {}
    fsspec.config.set_conf_env(conf, {"FSSPEC_WDS_TRANSPORT": "fsspec"})
    monkeypatch.setitem(fsspec.config.conf, "wds", conf["wds"])
    fs = _wds(target_protocol="http", cache_dir=str(tmp_path))
    assert fs.options.transport == "fsspec"
    assert type(fs.download_transport.backend).__name__ == "HttpBackend"  # fsspec's stream


def test_cat_ranges_reports_a_missing_path_without_failing_the_others(tmp_path):
    fs, _, path = _planned(tmp_path)
    results = fs.cat_ranges([path, path + ".missing"], [0, 0], [3, 3])
    assert results[0] == DATA[:3] and isinstance(results[1], FileNotFoundError)


def test_writes_go_to_the_backend_and_drop_the_cached_copy(shard):
    path, options = shard
    fs = _wds(target_protocol="file", **options)
    assert fs.cat_file(path) == DATA
    fs.pipe_file(path, b"new content")
    assert fs.cat_file(path) == b"new content"
    with fs.open(path, "wb") as handle:
        handle.write(b"written")
    assert fs.cat_file(path) == b"written"
    with fs.open(path, "w") as handle:
        handle.write("text")
    assert fs.cat_file(path) == b"text"
    fs.rm(path)
    assert not fs.exists(path)
    with pytest.raises(FileNotFoundError, match="train-0000.tar"):
        fs.cat_file(path)
    assert fs.cache_stats()["cached_files"] == 0


def test_a_file_larger_than_the_cache_is_streamed_with_a_warning(shard):
    path, options = shard
    fs = _wds(target_protocol="file", cache_size=1000, **options)
    with pytest.warns(UserWarning, match="streaming"):
        with fs.open(path) as handle:
            assert handle.read() == DATA
    assert fs.cache_stats()["cached_files"] == 0


def test_check_stale_notices_a_changed_object_and_the_default_trusts_the_cache(shard):
    path, options = shard
    trusting = _wds(target_protocol="file", **options)
    checking = _wds(target_protocol="file", check_stale=True, **options)
    assert trusting.cat_file(path) == DATA
    with open(path, "wb") as handle:
        handle.write(b"changed")
    assert trusting.cat_file(path) == DATA
    assert checking.cat_file(path) == b"changed"


def test_listing_calls_agree_with_the_backend(shard):
    path, options = shard
    fs = _wds(target_protocol="file", **options)
    local = fsspec.filesystem("file")
    folder = os.path.dirname(path)
    assert fs.ls(folder, detail=False) == local.ls(folder, detail=False)
    assert fs.find(folder) == local.find(folder)
    assert fs.glob(folder + "/*.tar") == local.glob(folder + "/*.tar")
    assert fs.info(path)["size"] == local.info(path)["size"] == fs.size(path)
    assert fs.exists(path) and not fs.exists(path + ".nope")
    assert fs.isdir(folder) and fs.isfile(path) and not fs.isfile(folder)
    assert fs.ukey(path) == local.ukey(path)
    assert fs.modified(path) == local.modified(path)


def test_clear_cache_empties_it(shard):
    path, options = shard
    fs = _wds(target_protocol="file", **options)
    fs.prefetch(path)
    fs.clear_cache()
    stats = fs.cache_stats()
    assert stats["cached_files"] == 0 and stats["cached_bytes"] == 0


def test_an_uncached_object_of_unknown_size_is_read_whole_and_seekable(tmp_path):
    backend = UnknownSizeFileSystem()
    path = f"/fs-{uuid.uuid4().hex}/no-length.bin"
    backend.pipe_file(path, DATA)
    fs = _wds(fs=backend, cache=False, cache_dir=str(tmp_path / "cache"))
    with fs.open(path) as handle:
        handle.seek(1000)
        assert handle.read(10) == DATA[1000:1010]
        handle.seek(0)
        assert handle.read() == DATA


def test_prefetch_counts_a_miss_when_it_downloads_and_nothing_when_already_cached(shard):
    path, options = shard
    fs = _wds(target_protocol="file", **options)
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
    fs = _wds(fs=backend, cache_dir=str(tmp_path / "cache"), cache=cache)
    for read in (lambda: fs.open(folder).read(), lambda: fs.cat_file(folder)):
        with pytest.raises(IsADirectoryError, match=f"memory://{folder}"):
            read()
    assert fs.cache_stats()["cached_files"] == 0


def test_an_invalid_target_options_value_is_rejected_without_showing_its_secrets():
    with pytest.raises(ValueError, match="target_options") as raised:
        _wds(target_protocol="file", target_options='{"key": "AKIA", "secret": "hunter2"}')
    assert "hunter2" not in str(raised.value)


@pytest.mark.parametrize("cache", [True, False])
def test_open_files_pickle_and_reopen_at_their_position(shard, cache):
    """As fsspec's own files do: dask ships open file objects to its workers."""
    path, options = shard
    fs = _wds(target_protocol="file", cache=cache, **options)
    with fs.open(path) as handle:
        handle.seek(1000)
        assert handle.read(10) == DATA[1000:1010]
        with pickle.loads(pickle.dumps(handle)) as clone:
            assert clone.tell() == 1010
            assert clone.read(10) == DATA[1010:1020]


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


def test_a_misspelt_backend_option_is_refused_when_the_filesystem_is_made(tmp_path):
    from fsspec_shards.errors import OptionError

    with pytest.raises(OptionError, match=r"invalid storage option s3\.endpoint_urll") as error:
        fsspec.filesystem(
            "wds",
            target_protocol="s3",
            target_options={"endpoint_urll": "http://127.0.0.1:9", "skip_instance_cache": True},
            cache_dir=str(tmp_path / "cache"),
        )
    assert "did you mean 'endpoint_url'" in str(error.value)


def test_sections_reach_the_layer_and_the_backend_and_others_are_dropped(tmp_path):
    fs = fsspec.filesystem(
        "wds",
        target_protocol="file",
        target_options={"auto_mkdir": True},
        wds={"cache_dir": str(tmp_path / "cache"), "retries": 2},
        s3={"endpoint_url": "http://never-used.invalid"},
        skip_instance_cache=True,
    )
    assert fs.options.cache_dir == str(tmp_path / "cache")
    assert fs.policy.attempts == 2
    assert fs.fs.auto_mkdir is True
    (tmp_path / "a.bin").write_bytes(b"abc")
    assert fs.cat_file(str(tmp_path / "a.bin")) == b"abc"
