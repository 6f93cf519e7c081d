"""Reads through ``wds::`` equal the backend's own, on every real backend."""

from __future__ import annotations

import functools
import hashlib
import http.server
import multiprocessing
import random
import threading

import fsspec
import pytest

from fsspec_shards.errors import IntegrityError
from tests.integration import servers

DATA = random.Random(1202).randbytes(700_000)


def _wds_options(backend: servers.Backend, tmp_path, **wds) -> dict:
    return {
        "wds": {"cache_dir": str(tmp_path / "cache"), "backoff": 0.01, **wds},
        backend.protocol: backend.storage_options,
    }


def _wds_fs(backend: servers.Backend, tmp_path, **wds):
    fs, _ = fsspec.core.url_to_fs(
        f"wds::{backend.url()}", skip_instance_cache=True, **_wds_options(backend, tmp_path, **wds)
    )
    return fs


def test_reads_through_wds_equal_the_backend_bytes_and_then_come_from_the_cache(
    backend: servers.Backend, tmp_path
):
    url = backend.put("shards/train-0000.tar", DATA)
    options = _wds_options(backend, tmp_path)
    with fsspec.open(f"wds::{url}", "rb", **options) as handle:
        assert handle.read() == DATA
    with fsspec.open(f"wds::{url}", "rb", **options) as handle:
        handle.seek(12345)
        assert handle.read(100) == DATA[12345:12445]
    fs, path = fsspec.core.url_to_fs(f"wds::{url}", **options)
    stats = fs.cache_stats()
    assert (stats["misses"], stats["hits"], stats["bytes_downloaded"]) == (1, 1, len(DATA))


def test_uncached_streamed_reads_equal_the_backend_bytes(backend: servers.Backend, tmp_path):
    url = backend.put("shards/train-0001.tar", DATA)
    fs = _wds_fs(backend, tmp_path, cache=False, block_size=65536)
    with fs.open(url) as handle:
        assert handle.read() == DATA
        handle.seek(500_000)
        assert handle.read(10) == DATA[500_000:500_010]
    assert fs.cat_file(url) == DATA


@pytest.mark.parametrize(("start", "end"), [(0, 1), (10, 20), (123_456, 234_567), (-7, None)])
def test_ranged_cat_file_agrees_with_the_backend(backend: servers.Backend, tmp_path, start, end):
    url = backend.put("ranged.bin", DATA)
    fs = _wds_fs(backend, tmp_path)
    assert fs.cat_file(url, start, end) == DATA[start:end]
    fs.prefetch(url)
    assert fs.cat_file(url, start, end) == DATA[start:end]


def test_listing_calls_agree_with_the_backend(backend: servers.Backend, tmp_path):
    for name in ("a/train-0000.tar", "a/train-0001.tar", "a/sub/other.txt"):
        backend.put(name, DATA[:1000])
    fs = _wds_fs(backend, tmp_path)
    plain = backend.filesystem()
    folder = backend.url("a")
    file_url = backend.url("a/train-0000.tar")
    assert sorted(fs.ls(folder, detail=False)) == sorted(plain.ls(folder, detail=False))
    if backend.protocol != "http":  # nginx autoindex has no recursive listing semantics
        assert fs.find(folder) == plain.find(folder)
    assert fs.glob(backend.url("a/*.tar")) == plain.glob(backend.url("a/*.tar"))
    assert fs.info(file_url)["size"] == plain.info(file_url)["size"] == 1000
    assert fs.exists(file_url) and not fs.exists(backend.url("a/absent.tar"))
    assert fs.isfile(file_url)


def test_missing_object_raises_file_not_found_naming_the_url(backend: servers.Backend, tmp_path):
    backend.put("present.bin", b"x")
    fs = _wds_fs(backend, tmp_path)
    with pytest.raises(FileNotFoundError, match="absent.bin"):
        fs.cat_file(backend.url("absent.bin"))
    with pytest.raises(FileNotFoundError, match="absent.bin"):
        fs.open(backend.url("absent.bin"))


def test_reading_a_directory_raises_is_a_directory_error_naming_the_url(
    backend: servers.Backend, tmp_path
):
    if backend.protocol == "http":
        pytest.skip("over HTTP a directory URL is a page like any other")
    backend.put("folder/inside.bin", b"x")
    fs = _wds_fs(backend, tmp_path)
    with pytest.raises(IsADirectoryError, match="folder"):
        fs.cat_file(backend.url("folder"))
    with pytest.raises(IsADirectoryError, match="folder"):
        fs.open(backend.url("folder"))
    assert fs.cache_stats()["cached_files"] == 0


def test_writes_through_wds_reach_the_backend_and_drop_the_cached_copy(
    backend: servers.Backend, tmp_path
):
    if backend.protocol == "http":
        pytest.skip("the HTTP backend is read-only")
    url = backend.put("w.bin", DATA[:100])
    fs = _wds_fs(backend, tmp_path)
    assert fs.cat_file(url) == DATA[:100]
    fs.pipe_file(url, b"replaced")
    assert backend.filesystem().cat_file(url) == b"replaced"
    assert fs.cat_file(url) == b"replaced"
    fs.rm(url)
    assert not fs.exists(url)


def test_signed_urls_keep_their_secrets_out_of_messages_logs_and_the_cache(
    http_backend, tmp_path, caplog
):
    secret = "X-Amz-Signature=s3cr3tsignature&X-Amz-Credential=AKIAS3CR3T"
    url = http_backend.put("signed.bin", DATA[:5000])
    fs = _wds_fs(http_backend, tmp_path)
    with caplog.at_level("DEBUG", logger="fsspec_shards"):
        assert fs.cat_file(f"{url}?{secret}") == DATA[:5000]
        with pytest.raises(FileNotFoundError) as raised:
            fs.cat_file(f"{http_backend.url('absent.bin')}?{secret}")
    entries = fs.shard_cache.entries()
    shown = [str(raised.value), caplog.text, repr(entries)]
    assert raised.value.__cause__ is None
    for text in shown:
        assert "s3cr3t" not in text and "AKIAS3CR3T" not in text
    assert len(entries) == 1 and "signed.bin" in entries[0]["url"]


def test_a_manifest_verifies_signed_http_urls_whatever_their_query(http_backend, tmp_path):
    url = http_backend.put("signed/a.tar", DATA[:5000])
    wrong = hashlib.sha256(b"other bytes").hexdigest()
    sums = http_backend.put("signed/SHA256SUMS", f"{wrong}  a.tar\n".encode())
    fs = _wds_fs(http_backend, tmp_path, checksums=f"{sums}?sig=s3cr3t", retries=1)
    with pytest.raises(IntegrityError, match="a.tar"):
        fs.cat_file(f"{url}?sig=s3cr3t&se=2030-01-01")
    assert fs.cache_stats()["cached_files"] == 0


def _read_in_child(fs, url, queue) -> None:
    queue.put(fs.cat_file(url, 0, 1000))


def _read_in_forked_child(fs, url) -> bytes:
    """The first 1000 bytes of ``url`` as a forked child process reads them through ``fs``."""
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_read_in_child, args=(fs, url, queue))
    child.start()
    try:
        data = queue.get(timeout=60)
    finally:
        child.join(timeout=60)
    assert child.exitcode == 0
    return data


@pytest.mark.parametrize("backend_name", ["http", "s3"])
def test_an_instance_used_before_a_fork_still_reads_in_the_forked_child(
    request, tmp_path, backend_name
):
    """DataLoader workers fork; the parent's event loop does not survive, the backend is
    rebuilt in the child."""
    backend = request.getfixturevalue(f"{backend_name}_backend")
    first = backend.put("fork-0.bin", DATA[:2000])
    second = backend.put("fork-1.bin", DATA[2000:4000])
    fs = _wds_fs(backend, tmp_path, cache=False)
    assert fs.cat_file(first) == DATA[:2000]
    assert _read_in_forked_child(fs, second) == DATA[2000:3000]


@pytest.mark.parametrize("backend_name", ["http", "s3"])
def test_a_given_backend_instance_used_before_a_fork_still_reads_in_the_forked_child(
    request, tmp_path, backend_name
):
    """``fs=`` an async backend: fsspec refuses to use it after a fork (its event loop stayed
    in the parent), so the child reads through an equal one."""
    backend = request.getfixturevalue(f"{backend_name}_backend")
    first = backend.put("given-0.bin", DATA[:2000])
    second = backend.put("given-1.bin", DATA[2000:4000])
    given = fsspec.filesystem(backend.protocol, **backend.storage_options)
    fs = fsspec.filesystem(
        "wds", fs=given, skip_instance_cache=True, cache_dir=str(tmp_path / "cache")
    )
    assert fs.cat_file(first) == DATA[:2000]
    assert _read_in_forked_child(fs, second) == DATA[2000:3000]
    assert fs.fs is given


def _transport_in_child(fs, url, queue) -> None:
    try:
        queue.put((fs.cat_file(url, 0, 1000), "using obstore" in repr(fs.download_transport)))
    except Exception as error:
        queue.put((None, str(error)))


def _forked(target, fs, url):
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=target, args=(fs, url, queue))
    child.start()
    try:
        return queue.get(timeout=60)
    finally:
        child.join(timeout=60)


@pytest.mark.parametrize("backend_name", ["http", "s3"])
def test_a_child_forked_after_obstore_was_used_downloads_through_fsspec(
    request, tmp_path, backend_name
):
    """obstore's runtime does not survive fork(): the child of a parent that downloaded
    through it chooses the fsspec backend ("auto"), or says why it cannot ("obstore")."""
    pytest.importorskip("obstore")
    backend = request.getfixturevalue(f"{backend_name}_backend")
    first = backend.put("forked-0.bin", DATA[:2000])
    second = backend.put("forked-1.bin", DATA[2000:4000])
    fs = _wds_fs(backend, tmp_path, cache=False)
    assert "using obstore" in repr(fs.download_transport)
    assert fs.cat_file(first) == DATA[:2000]
    assert _forked(_transport_in_child, fs, second) == (DATA[2000:3000], False)
    required = _wds_fs(backend, tmp_path, cache=False, transport="obstore")
    data, error = _forked(_transport_in_child, required, second)
    assert data is None and "fork" in error and "transport='obstore'" in error


class _RangeIgnoringHandler(http.server.SimpleHTTPRequestHandler):
    """Python's own file server: it ignores Range and always sends the whole file."""

    gets: list[str] = []

    def do_GET(self) -> None:
        type(self).gets.append(self.headers.get("Range", ""))
        super().do_GET()

    def log_message(self, *args) -> None:
        pass


def test_a_server_that_ignores_range_sends_a_large_object_once_not_once_per_chunk(tmp_path):
    data = random.Random(7).randbytes(20 * 1024 * 1024)  # several download chunks
    (tmp_path / "big.bin").write_bytes(data)
    handler = functools.partial(_RangeIgnoringHandler, directory=str(tmp_path))
    _RangeIgnoringHandler.gets = []
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            url = f"http://127.0.0.1:{server.server_address[1]}/big.bin"
            with fsspec.open(f"wds::{url}", "rb", wds={"cache_dir": str(tmp_path / "c")}) as f:
                assert f.read() == data
        finally:
            server.shutdown()
    ranged = [header for header in _RangeIgnoringHandler.gets if header]
    assert len(ranged) == 1, ranged


def test_auto_falls_back_to_fsspec_for_a_server_obstore_cannot_read_and_says_why_once(
    gcs_backend, tmp_path, caplog
):
    """gcp-storage-emulator answers obstore's GCS reads with 501 (see docs/transport.md):
    "auto" reads through gcsfs from then on, "obstore" raises naming the server's answer."""
    pytest.importorskip("obstore")
    first = gcs_backend.put("fallback-0.bin", DATA[:3000])
    second = gcs_backend.put("fallback-1.bin", DATA[3000:6000])
    fs = _wds_fs(gcs_backend, tmp_path)
    assert "using obstore" in repr(fs.download_transport)
    with caplog.at_level("DEBUG", logger="fsspec_shards.storage.transfer.obstore_transport"):
        assert fs.cat_file(first) == DATA[:3000]
        assert fs.cat_file(second) == DATA[3000:6000]
    assert "using fsspec" in repr(fs.download_transport)
    switches = [r for r in caplog.records if "from now on" in r.getMessage()]
    assert len(switches) == 1 and "cannot serve obstore" in switches[0].getMessage()
    required = _wds_fs(gcs_backend, tmp_path / "required", transport="obstore")
    with pytest.raises(OSError, match="cannot serve obstore"):
        required.cat_file(first)


def _counted(name: str, original, asked: list[str]):
    def counting(self, *args, **kwargs):
        asked.append(name)
        return original(self, *args, **kwargs)

    return counting


def test_a_cold_read_through_obstore_on_s3_never_asks_s3fs(s3_backend, tmp_path, monkeypatch):
    """The stat before a download comes from obstore's HEAD where the transport is obstore
    on S3: a DataLoader worker reading through obstore then never builds s3fs's client
    (100-250 ms of its first batch). The cached copy records the version s3fs sees."""
    import s3fs

    from fsspec_shards.storage.backends import backend_for

    url = s3_backend.put("shards/train-0002.tar", DATA)
    theirs = backend_for("s3").identity(s3_backend.filesystem().info(url.split("://", 1)[1]))
    asked: list[str] = []
    for name in ("_info", "_call_s3", "set_session"):
        original = getattr(s3fs.S3FileSystem, name)
        monkeypatch.setattr(s3fs.S3FileSystem, name, _counted(name, original, asked))
    fs = _wds_fs(s3_backend, tmp_path, transport="obstore")
    with fs.open(url) as handle:
        assert handle.read() == DATA
    assert asked == []
    path = fs._backend_path(url)
    assert fs.shard_cache.metadata(fs.fetcher.object(path))["identity"] == theirs
