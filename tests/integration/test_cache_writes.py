"""Writes through ``wds`` against the cache, on real servers: every write operation drops
the cached copy of each path it wrote, for the writing process and for another process
sharing the cache (the old version read and cached first); a write invalidates downloads in
flight in other processes; ``invalidate_cache`` drops poisoned copies."""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import multiprocessing
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import fsspec
import pytest

from fsspec_shards.storage.cache import ShardCache
from tests.cache_objects import payload
from tests.faults import Stall

if TYPE_CHECKING:  # spawned workers import this module: keep it light
    from tests.integration import servers

SPAWN = multiprocessing.get_context("spawn")
JOIN_TIMEOUT = 120


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read_through_wds(url: str, options: dict, results) -> None:
    try:
        with fsspec.open(f"wds::{url}", "rb", **options) as handle:
            results.put(digest(handle.read()))
    except OSError as error:
        results.put(f"error: {error}")


@pytest.mark.parametrize("through", ["pipe", "transaction"])
def test_a_write_during_another_processs_download_is_what_every_later_read_returns(
    s3_backend: servers.S3Backend, fault_proxy, tmp_path: Path, through: str
) -> None:
    """With ``through="transaction"`` the file is written and closed before the read
    starts, and committed while it downloads the old version: the commit stops it from
    publishing."""
    path = "writes/shard-0000.tar"
    old, new = payload("old version", 300_000), payload("new version", 200_000)
    s3_backend.put(path, old)
    proxy, proxied = fault_proxy(s3_backend)
    proxy.add(Stall(seconds=4, after_bytes=64 * 1024), method="GET", path=path, times=1)
    wds = {"cache_dir": str(tmp_path / "cache"), "cache_size": "16MB", "timeout": 30}
    options = {"wds": wds, "s3": proxied.storage_options}
    writer = fsspec.filesystem(
        "wds", target_protocol="s3", target_options=proxied.storage_options, **wds
    )
    results = SPAWN.Queue()
    reader = SPAWN.Process(target=read_through_wds, args=(proxied.url(path), options, results))
    with contextlib.ExitStack() as transaction:
        if through == "transaction":
            transaction.enter_context(writer.transaction)
            with writer.open(proxied.url(path), "wb") as handle:
                handle.write(new)
        reader.start()
        deadline = time.monotonic() + JOIN_TIMEOUT
        while not proxy.requests("GET", path):
            assert time.monotonic() < deadline and reader.is_alive(), "the download never started"
            time.sleep(0.02)
        if through == "pipe":
            writer.pipe_file(proxied.url(path), new)  # lands while the download is stalled
    # (a transaction commits here, while the reader's download is stalled)
    first = results.get(timeout=JOIN_TIMEOUT)
    reader.join(JOIN_TIMEOUT)
    assert first in (digest(old), digest(new)) or first.startswith("error: "), first

    for _ in range(2):  # a fresh process, then this one: both see only the new version
        again = SPAWN.Process(target=read_through_wds, args=(proxied.url(path), options, results))
        again.start()
        assert results.get(timeout=JOIN_TIMEOUT) == digest(new)
        again.join(JOIN_TIMEOUT)
    assert writer.cat_file(proxied.url(path)) == new
    entries = ShardCache.existing(wds["cache_dir"]).entries()
    assert [entry["size"] for entry in entries] == [len(new)]


def test_invalidate_cache_drops_the_cached_copy_and_the_backend_listing(
    s3_backend: servers.S3Backend, tmp_path: Path
) -> None:
    url = s3_backend.put("poisoned/shard.tar", b"<html>maintenance</html>")
    fs = fsspec.filesystem(
        "wds",
        target_protocol="s3",
        target_options=s3_backend.storage_options,
        cache_dir=str(tmp_path / "cache"),
        skip_instance_cache=True,
    )
    assert fs.cat_file(url) == b"<html>maintenance</html>"
    assert fs.ls(s3_backend.url("poisoned"), detail=False) == [url.split("://", 1)[1]]
    s3_backend.put("poisoned/shard.tar", b"the real shard bytes")  # behind wds's back
    s3_backend.put("poisoned/other.tar", b"x")
    assert fs.cat_file(url) == b"<html>maintenance</html>"  # the cached copy, as promised

    fs.invalidate_cache(url)
    assert fs.cat_file(url) == b"the real shard bytes"
    fs.invalidate_cache(s3_backend.url("poisoned"))
    assert len(fs.ls(s3_backend.url("poisoned"), detail=False)) == 2


def test_invalidate_cache_reaches_through_fsspec_for_chained_urls(
    s3_backend: servers.S3Backend, tmp_path: Path
) -> None:
    """The dataset calls it through fsspec only (no storage import): ``url_to_fs`` + path."""
    url = s3_backend.put("chained/shard.tar", b"first")
    options = {"wds": {"cache_dir": str(tmp_path / "cache")}, "s3": s3_backend.storage_options}
    fs, path = fsspec.core.url_to_fs(f"wds::{url}", **options)
    assert fs.cat_file(path) == b"first"
    s3_backend.put("chained/shard.tar", b"second")
    fs.invalidate_cache(path)
    with fsspec.open(f"wds::{url}", "rb", **options) as handle:
        assert handle.read() == b"second"


# -- one invalidation rule: every write operation, with the old version cached first -----

WRITTEN = "dir/shard-0000.tar"
OLD, NEW = b"old version " * 1000, b"new version, longer " * 1000


def serve_reads(requests, results) -> None:
    """Another process sharing the cache: reads ``wds::<url>`` for each request."""
    while (request := requests.get()) is not None:
        number, url, options = request
        try:
            with fsspec.open(f"wds::{url}", "rb", **options) as handle:
                results.put((number, handle.read()))
        except FileNotFoundError:
            results.put((number, None))
        except Exception as error:  # reported to the test, which fails on it
            results.put((number, f"error: {error!r}"))


@pytest.fixture(scope="module")
def other_process() -> Iterator[Callable[[str, dict], bytes | None]]:
    """``read(url, options)`` in one spawned process kept for the module (spawning one per
    read would cost a second each); answers to reads a failed test gave up on are skipped."""
    requests, results = SPAWN.Queue(), SPAWN.Queue()
    process = SPAWN.Process(target=serve_reads, args=(requests, results), daemon=True)
    process.start()
    numbers = itertools.count()

    def read(url: str, options: dict) -> bytes | None:
        number = next(numbers)
        requests.put((number, url, options))
        while True:
            answered, result = results.get(timeout=JOIN_TIMEOUT)
            if answered == number:
                return result

    yield read
    requests.put(None)
    process.join(JOIN_TIMEOUT)


@pytest.fixture(params=["file", "s3", "az"])
def writable(request: pytest.FixtureRequest) -> servers.Backend:
    return request.getfixturevalue(f"{request.param}_backend")


class Layer:
    """A wds filesystem over ``backend`` and the same cache seen from another process."""

    def __init__(self, backend: servers.Backend, cache_dir: Path, other_process) -> None:
        self.backend = backend
        wds = {"cache_dir": str(cache_dir), "timeout": 30}
        self.options = {"wds": wds, backend.protocol: backend.storage_options}
        self.fs = fsspec.filesystem(
            "wds",
            target_protocol=backend.protocol,
            target_options=backend.storage_options,
            skip_instance_cache=True,
            **wds,
        )
        self.other_process = other_process

    def read_here(self, url: str) -> bytes | None:
        try:
            with self.fs.open(url, "rb") as handle:
                return handle.read()
        except FileNotFoundError:
            return None

    def reads(self, url: str) -> tuple[bytes | None, bytes | None]:
        """What this process and the other one read at ``url``."""
        return self.read_here(url), self.other_process(url, self.options)


def write_pipe(layer: Layer, url: str, tmp_path: Path) -> bytes:
    layer.fs.pipe({url: NEW})
    return NEW


def write_open(layer: Layer, url: str, tmp_path: Path) -> bytes:
    with layer.fs.open(url, "wb") as handle:
        handle.write(NEW)
    return NEW


def write_put(layer: Layer, url: str, tmp_path: Path) -> bytes:
    local = tmp_path / "upload.tar"
    local.write_bytes(NEW)
    layer.fs.put(str(local), url)
    return NEW


def write_cp(layer: Layer, url: str, tmp_path: Path) -> bytes:
    layer.fs.cp(layer.backend.put("elsewhere/source.tar", NEW), url)
    return NEW


def write_mv(layer: Layer, url: str, tmp_path: Path) -> bytes:
    """``mv(src, "dir/")``: what is written is ``dir/<name of src>``, not ``dir`` (local
    files refuse to move into a directory that holds the name: there, onto the file)."""
    source = layer.backend.put(f"incoming/{WRITTEN.rsplit('/', 1)[1]}", NEW)
    into = url if layer.backend.protocol == "file" else layer.backend.url("dir") + "/"
    layer.fs.mv(source, into)
    assert layer.read_here(source) is None
    return NEW


def write_rm(layer: Layer, url: str, tmp_path: Path) -> bytes:
    """Removed through the layer, then written again behind its back: the copy is gone."""
    layer.fs.rm(url)
    assert layer.reads(url) == (None, None)
    layer.backend.put(WRITTEN, NEW)
    return NEW


def write_touch(layer: Layer, url: str, tmp_path: Path) -> bytes:
    layer.fs.touch(url)
    return b""


def write_transaction(layer: Layer, url: str, tmp_path: Path) -> bytes:
    """Both processes read between the file's close and the commit and cache what the
    backend holds then (the old version, but on Azure, where adlfs writes at the close);
    the commit drops it."""
    with layer.fs.transaction:
        with layer.fs.open(url, "wb") as handle:
            handle.write(NEW)
        between = layer.backend.filesystem().cat_file(url)
        assert between == (NEW if layer.backend.protocol == "az" else OLD)
        assert layer.reads(url) == (between, between)
    return NEW


WRITES = [
    write_pipe,
    write_open,
    write_put,
    write_cp,
    write_mv,
    write_rm,
    write_touch,
    write_transaction,
]


@pytest.mark.parametrize("write", WRITES, ids=lambda write: write.__name__[len("write_") :])
def test_a_write_through_the_layer_is_what_every_process_reads_next(
    writable: servers.Backend, write, other_process, tmp_path: Path
) -> None:
    layer = Layer(writable, tmp_path / "cache", other_process)
    url = writable.put(WRITTEN, OLD)
    assert layer.reads(url) == (OLD, OLD)  # cached here, then a hit in the other process

    new = write(layer, url, tmp_path)
    assert layer.reads(url) == (new, new)
    assert writable.filesystem().cat_file(url) == new  # what the backend holds


def test_a_discarded_transaction_leaves_what_the_backend_holds_everywhere(
    writable: servers.Backend, other_process, tmp_path: Path
) -> None:
    """The old version (on Azure the new one: adlfs writes at the close and cannot take it
    back); the copies read in between are dropped at the discard."""
    layer = Layer(writable, tmp_path / "cache", other_process)
    url = writable.put(WRITTEN, OLD)
    plain = writable.filesystem()
    assert layer.reads(url) == (OLD, OLD)
    with pytest.raises(RuntimeError, match="abandoned"), layer.fs.transaction:
        with layer.fs.open(url, "wb") as handle:
            handle.write(NEW)
        between = plain.cat_file(url)
        assert layer.reads(url) == (between, between)
        raise RuntimeError("abandoned")
    assert layer.fs.cache_stats()["cached_files"] == 0  # dropped at the discard
    held = plain.cat_file(url)
    assert held == (NEW if writable.protocol == "az" else OLD)
    assert layer.reads(url) == (held, held)


@pytest.mark.parametrize(("name", "method"), [("s3", "setxattr"), ("az", "setxattrs")])
def test_setting_attributes_drops_the_copy_of_the_version_it_replaced(
    name: str, method: str, request: pytest.FixtureRequest, other_process, tmp_path: Path
) -> None:
    """S3 sets metadata by copying the object onto itself (a new version of the same
    bytes); Azure gives the blob a new ETag."""
    backend = request.getfixturevalue(f"{name}_backend")
    layer = Layer(backend, tmp_path / "cache", other_process)
    url = backend.put(WRITTEN, OLD)
    assert layer.reads(url) == (OLD, OLD)
    getattr(layer.fs, method)(url, purpose="evaluation")
    assert layer.fs.cache_stats()["cached_files"] == 0
    assert layer.reads(url) == (OLD, OLD)
    assert backend.filesystem().getxattr(url, "purpose") == "evaluation"


def test_setting_attributes_on_a_backend_without_them_is_refused_naming_the_path(
    file_backend: servers.FileBackend, other_process, tmp_path: Path
) -> None:
    layer = Layer(file_backend, tmp_path / "cache", other_process)
    url = file_backend.put(WRITTEN, OLD)
    with pytest.raises(NotImplementedError, match="file backend has no setxattr.*shard-0000"):
        layer.fs.setxattr(url, purpose="evaluation")


@pytest.mark.parametrize("spelling", ["d/./f.tar", "d//f.tar", "d/e/../f.tar"])
def test_a_local_write_drops_the_copy_read_under_another_spelling_of_the_path(
    file_backend: servers.FileBackend, spelling: str, other_process, tmp_path: Path
) -> None:
    layer = Layer(file_backend, tmp_path / "cache", other_process)
    url = file_backend.put("d/f.tar", OLD)
    (Path(url.removeprefix("file://")).parent / "e").mkdir()
    spelled = f"{file_backend.url()}/{spelling}"
    assert layer.reads(spelled) == (OLD, OLD)
    layer.fs.pipe_file(url, NEW)
    assert layer.reads(spelled) == (NEW, NEW)
