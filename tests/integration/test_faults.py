"""Faults injected by plan between the wds filesystem and real servers (http, s3, gcs, az).

Each test checks the bytes delivered, the exception type and message, and, from the fault
proxy's log, that a transfer that broke off was resumed rather than started over. Every test
runs through both download transports (the fsspec backend and obstore): faults behave the
same through either.
"""

from __future__ import annotations

import functools
import hashlib
import random
import time

import fsspec
import pytest

from fsspec_shards.errors import IntegrityError
from fsspec_shards.storage.backends import backend_for
from tests.faults import Cut, Flip, Reset, Stall, Status
from tests.integration import servers
from tests.integration.conftest import backend_fixture, served
from tests.integration.range_layout import range_starts

MiB = 1024 * 1024
SIZE = 3_000_000
DATA = random.Random(31).randbytes(SIZE)
NAME = "shards/train-0000.tar"


def _data_gets(backend: servers.Backend) -> dict:
    """Proxy rule match for the GETs that carry the object's bytes (on GCS: gcsfs's
    ``alt=media`` downloads or obstore's XML reads, whose paths are percent-encoded; both
    ask for a range, gcsfs's metadata GETs do not)."""
    if backend.protocol == "gcs":
        return {"method": "GET", "has_range": True}
    return {"method": "GET", "path": NAME}


def _resend_allowance(cuts: int) -> int:
    """Bytes a resumed download may send twice: what sat in the client's socket buffers when
    the cut came (aiohttp drops it)."""
    return cuts * 512 * 1024


def _range_start(exchange) -> int:
    header = exchange.range or exchange.headers.get("x-ms-range") or "bytes=0-"
    return int(header.split("=", 1)[1].split("-", 1)[0])


def _through_proxy(backend, fault_proxy, tmp_path, transport, data=DATA, **wds):
    url = backend.put(NAME, data)
    proxy, proxied = fault_proxy(backend)
    options = {
        "cache_dir": str(tmp_path / "cache"),
        "backoff": 0.01,
        "max_backoff": 0.05,
        "transport": served(backend, transport),
        **wds,
    }
    fs, path = fsspec.core.url_to_fs(
        f"wds::{proxied.url(NAME)}",
        skip_instance_cache=True,
        wds=options,
        **{proxied.protocol: proxied.storage_options},
    )
    assert ("using obstore" in repr(fs.download_transport)) == (transport == "obstore")
    return fs, path, proxy, url


def _data_exchanges(proxy, backend, transport):
    """The GETs of the object's bytes; checks that they went through ``transport``."""
    match = _data_gets(backend)
    exchanges = [
        e
        for e in proxy.requests(method=match["method"], path=match.get("path"))
        if not match.get("has_range") or e.range is not None
    ]
    agents = {str(e.headers.get("user-agent")).startswith("object_store/") for e in exchanges}
    assert agents == {transport == "obstore"}, agents
    return exchanges


def _answers_prove_no_version(backend, transport: str) -> bool:
    """The bare GCS emulator's answers carry no ETag, generation or Last-Modified (its XML
    front, which obstore reads it through, adds them): a cut cannot be resumed onto them
    (docs/fault-model.md, the version rule), the download starts over from byte 0."""
    return (
        backend.protocol in ("gcs", "gs")
        and "front" not in backend.server
        and (transport == "fsspec")
    )


def test_one_cut_mid_body_resumes_from_the_byte_reached(
    remote_backend, fault_proxy, tmp_path, transport
):
    fs, path, proxy, _ = _through_proxy(remote_backend, fault_proxy, tmp_path, transport)
    proxy.add(Cut(after_bytes=1_000_000), **_data_gets(remote_backend))
    assert fs.cat_file(path) == DATA
    assert fs.cache_stats()["retries"] >= 1  # every retry counted (Azure's SDK retried unseen)
    exchanges = _data_exchanges(proxy, remote_backend, transport)
    cut = next(index for index, e in enumerate(exchanges) if e.fault_applied)
    if _answers_prove_no_version(remote_backend, transport):
        assert _range_start(exchanges[-1]) == 0  # the resume refused: one request from 0
        return
    assert _range_start(exchanges[cut + 1]) > 0  # not started over
    assert sum(e.body_bytes for e in exchanges) <= SIZE + 1_000_000
    assert sum(e.body_bytes for e in exchanges) <= SIZE + _resend_allowance(1)


def test_several_cuts_in_one_object_still_deliver_it_whole(
    remote_backend, fault_proxy, tmp_path, transport
):
    fs, path, proxy, _ = _through_proxy(remote_backend, fault_proxy, tmp_path, transport)
    proxy.add(Cut(after_bytes=400_000), times=4, **_data_gets(remote_backend))
    with fs.open(path) as handle:
        assert handle.read() == DATA
    exchanges = _data_exchanges(proxy, remote_backend, transport)
    if _answers_prove_no_version(remote_backend, transport):
        # each cut starts over from byte 0 (see above); a refused resume may take a cut
        # meant for it before 400 kB flowed
        assert sum(e.fault_applied for e in exchanges) >= 1
        return
    assert sum(e.fault_applied for e in exchanges) == 4
    assert sum(e.body_bytes for e in exchanges) <= SIZE + _resend_allowance(4)
    starts = [_range_start(e) for e in exchanges]
    assert starts == sorted(starts)


@pytest.mark.parametrize("action", [Reset(), Reset(after_bytes=700_000)], ids=str)
def test_a_connection_reset_is_survived(remote_backend, fault_proxy, tmp_path, action, transport):
    fs, path, proxy, _ = _through_proxy(remote_backend, fault_proxy, tmp_path, transport)
    proxy.add(action, **_data_gets(remote_backend))
    assert fs.cat_file(path) == DATA
    assert _data_exchanges(proxy, remote_backend, transport)[0].fault_applied


@pytest.mark.parametrize("code", [503, 429])
def test_a_burst_of_throttling_or_unavailability_is_retried_quickly(
    remote_backend,
    fault_proxy,
    tmp_path,
    code,
    transport,
):
    fs, path, proxy, _ = _through_proxy(remote_backend, fault_proxy, tmp_path, transport)
    proxy.add(Status(code), times=3)
    started = time.monotonic()
    assert fs.cat_file(path) == DATA
    assert time.monotonic() - started < 15  # the backends' own retries would take 30-50 s
    assert fs.cache_stats()["retries"] >= 1
    assert len(proxy.log) <= 12  # nested retries would multiply the requests (25 for s3)


def test_a_stalled_transfer_times_out_and_resumes(remote_backend, fault_proxy, tmp_path, transport):
    fs, path, proxy, _ = _through_proxy(
        remote_backend, fault_proxy, tmp_path, transport, timeout=1.0
    )
    proxy.add(Stall(seconds=30, after_bytes=500_000), **_data_gets(remote_backend))
    started = time.monotonic()
    assert fs.cat_file(path) == DATA
    assert time.monotonic() - started < 15
    exchanges = _data_exchanges(proxy, remote_backend, transport)
    stalled = next(index for index, e in enumerate(exchanges) if e.fault_applied)
    assert _range_start(exchanges[stalled + 1]) > 0
    assert fs.cache_stats()["retries"] >= 1


def _backend_timeout(backend: servers.Backend, seconds: float) -> dict:
    """The backend's own option for a socket time-out of ``seconds``."""
    if backend.protocol == "http":
        import aiohttp

        return {"client_kwargs": {"timeout": aiohttp.ClientTimeout(sock_read=seconds)}}
    if backend.protocol == "s3":
        return {"config_kwargs": {"read_timeout": seconds}}
    if backend.protocol == "gcs":
        return {"requests_timeout": seconds}
    return {"read_timeout": seconds}


def test_a_stall_is_cut_short_by_the_backend_time_out_the_user_gave(
    remote_backend,
    fault_proxy,
    tmp_path,
    transport,
):
    remote_backend.put(NAME, DATA)
    proxy, proxied = fault_proxy(remote_backend)
    options = {**proxied.storage_options, **_backend_timeout(proxied, 2.0)}
    fs = fsspec.filesystem(
        "wds",
        target_protocol=proxied.protocol,
        target_options=options,
        skip_instance_cache=True,
        cache_dir=str(tmp_path / "cache"),
        backoff=0.01,
        transport=served(remote_backend, transport),
    )
    assert (
        fs.policy.timeout == 2.0 < fsspec.filesystem("wds", target_protocol="file").policy.timeout
    )
    proxy.add(Stall(seconds=60, after_bytes=500_000), **_data_gets(remote_backend))
    started = time.monotonic()
    assert fs.cat_file(proxied.url(NAME)) == DATA
    assert time.monotonic() - started < 20
    assert fs.cache_stats()["retries"] >= 1


def test_a_copy_corrupt_at_rest_is_downloaded_twice_then_integrity_error_with_one_warning(
    http_backend,
    fault_proxy,
    tmp_path,
    caplog,
    transport,
):
    checksums = {NAME: "sha256:" + hashlib.sha256(b"the bytes it should hold").hexdigest()}
    fs, path, proxy, _ = _through_proxy(
        http_backend, fault_proxy, tmp_path, transport, checksums=checksums
    )
    with caplog.at_level("WARNING", logger="fsspec_shards"):
        with pytest.raises(IntegrityError, match="train-0000.tar"):
            fs.cat_file(path)
    gets = _data_exchanges(proxy, http_backend, transport)
    assert len(gets) == 2 and all(exchange.complete for exchange in gets)
    assert [record.levelname for record in caplog.records] == ["WARNING"]
    stats = fs.cache_stats()
    assert (stats["integrity_failures"], stats["bytes_downloaded"]) == (2, 2 * SIZE)


def test_a_ranged_read_over_a_persistently_corrupted_byte_raises_integrity_error(
    remote_backend,
    fault_proxy,
    tmp_path,
    transport,
):
    checksums = {NAME: "sha256:" + hashlib.sha256(DATA).hexdigest()}
    fs, path, proxy, _ = _through_proxy(
        remote_backend, fault_proxy, tmp_path, transport, checksums=checksums
    )
    proxy.add(Flip(offset=1_500_000), times=None, **_data_gets(remote_backend))
    with pytest.raises(IntegrityError, match="train-0000.tar"):
        fs.cat_file(path, 1_499_990, 1_500_010)
    assert isinstance(fs.cat_ranges([path], [1_400_000], [1_600_000])[0], IntegrityError)
    assert fs.cache_stats()["cached_files"] == 0


def test_a_flipped_byte_is_caught_by_the_manifest_and_fetched_again(
    remote_backend,
    fault_proxy,
    tmp_path,
    transport,
):
    checksums = {NAME: "sha256:" + hashlib.sha256(DATA).hexdigest()}
    fs, path, proxy, _ = _through_proxy(
        remote_backend, fault_proxy, tmp_path, transport, checksums=checksums
    )
    proxy.add(Flip(offset=123_457), **_data_gets(remote_backend))
    assert fs.cat_file(path) == DATA
    stats = fs.cache_stats()
    assert stats["integrity_failures"] == 1 and stats["cached_files"] == 1


@pytest.mark.parametrize("backend_name", ["s3", "gcs", "az"])
def test_a_flipped_byte_is_caught_by_the_backend_checksum(
    request,
    fault_proxy,
    tmp_path,
    backend_name,
    transport,
):
    backend = request.getfixturevalue(backend_fixture(request, backend_name))
    fs, path, proxy, url = _through_proxy(backend, fault_proxy, tmp_path, transport)
    info = backend.filesystem().info(url)
    assert backend_for(backend.protocol).checksums(info), "no checksum"
    proxy.add(Flip(offset=123_457), **_data_gets(backend))
    assert fs.cat_file(path) == DATA
    assert fs.cache_stats()["integrity_failures"] == 1


def test_a_byte_flipped_on_every_attempt_raises_integrity_error(
    remote_backend,
    fault_proxy,
    tmp_path,
    transport,
):
    checksums = {NAME: "sha256:" + hashlib.sha256(DATA).hexdigest()}
    fs, path, proxy, _ = _through_proxy(
        remote_backend, fault_proxy, tmp_path, transport, checksums=checksums, retries=2
    )
    proxy.add(Flip(offset=5), times=None, **_data_gets(remote_backend))
    with pytest.raises(IntegrityError, match="train-0000.tar") as raised:
        fs.cat_file(path)
    assert raised.value.expected == checksums[NAME]
    stats = fs.cache_stats()
    assert stats["integrity_failures"] == 2 and stats["cached_files"] == 0


@pytest.mark.parametrize(("code", "kind"), [(404, FileNotFoundError), (403, PermissionError)])
def test_a_permanent_error_surfaces_at_once_with_default_settings(
    remote_backend,
    fault_proxy,
    tmp_path,
    code,
    kind,
    transport,
):
    remote_backend.put(NAME, DATA)
    proxy, proxied = fault_proxy(remote_backend)
    fs, path = fsspec.core.url_to_fs(
        f"wds::{proxied.url(NAME)}",
        skip_instance_cache=True,
        wds={"cache_dir": str(tmp_path / "cache"), "transport": served(remote_backend, transport)},
        **{proxied.protocol: proxied.storage_options},
    )
    fs.info(path)  # the client is set up (s3's takes a second), then the server refuses
    proxy.add(Status(code), times=None)
    started = time.monotonic()
    with pytest.raises(kind, match="train-0000.tar"):
        fs.cat_file(path)
    assert time.monotonic() - started < 1.0
    assert fs.cache_stats()["retries"] == 0


@pytest.mark.slow
@pytest.mark.parametrize("ranges_in_flight", [1, "auto"])
def test_a_64mib_object_cut_every_4mib_arrives_whole_with_little_resent(
    http_backend,
    fault_proxy,
    tmp_path,
    transport,
    ranges_in_flight,
):
    """Every response is cut after 4 MiB: one stream is cut 15 times, each of auto's
    ranges (about 8 MiB) once; measured 1.01x sent (8 MiB cuts, one stream; 1.04x on S3)."""
    backend = http_backend
    data = random.Random(64).randbytes(64 * MiB)
    fs, path, proxy, _ = _through_proxy(
        backend, fault_proxy, tmp_path, transport, data=data, ranges_in_flight=ranges_in_flight
    )
    proxy.add(Cut(after_bytes=4 * MiB - 1000), times=None, **_data_gets(backend))
    with fs.open(path) as handle:
        assert hashlib.sha256(handle.read()).digest() == hashlib.sha256(data).digest()
    exchanges = _data_exchanges(proxy, backend, transport)
    assert sum(e.fault_applied for e in exchanges) >= 4
    assert proxy.bytes_sent(NAME) < 1.2 * len(data)


# -- several ranges in flight (ranges_in_flight) --------------------------------------


@functools.cache
def _large() -> bytes:
    """An object over the 32 MiB above which ranges may be in flight: its first MiB is read
    first, then the rest in 4 ranges at once (``range_starts``)."""
    return random.Random(40).randbytes(40 * MiB)


def _large_with_ranges_in_flight(backend, fault_proxy, tmp_path, transport):
    """The large object behind a proxy, read with 4 ranges in flight and its sha256 known."""
    data = _large()
    checksums = {NAME: "sha256:" + hashlib.sha256(data).hexdigest()}
    fs, path, proxy, _ = _through_proxy(
        backend,
        fault_proxy,
        tmp_path,
        transport,
        data=data,
        checksums=checksums,
        ranges_in_flight=4,
    )
    return fs, path, proxy, data


@pytest.mark.parametrize("backend_name", ["http", "s3"])
def test_a_range_in_flight_that_breaks_off_resumes_from_its_byte_and_the_object_is_whole(
    request, fault_proxy, tmp_path, transport, backend_name, no_splits
):
    backend = request.getfixturevalue(f"{backend_name}_backend")
    fs, path, proxy, data = _large_with_ranges_in_flight(backend, fault_proxy, tmp_path, transport)
    layout = range_starts(len(data), 4)
    cut = layout[2]
    proxy.add(Cut(after_bytes=2 * MiB), range=f"bytes={cut}-", **_data_gets(backend))
    assert hashlib.sha256(fs.cat_file(path)).digest() == hashlib.sha256(data).digest()
    exchanges = _data_exchanges(proxy, backend, transport)
    starts = sorted(_range_start(e) for e in exchanges)
    resumed = [start for start in starts if cut < start <= cut + 2 * MiB]
    assert len(resumed) == 1  # the cut range went on from its byte, nothing started over
    assert starts == sorted([*layout, *resumed])
    assert sum(e.body_bytes for e in exchanges) <= len(data) + _resend_allowance(1)
    assert fs.cache_stats()["integrity_failures"] == 0


@pytest.mark.parametrize("backend_name", ["http", "s3"])
def test_a_byte_flipped_in_a_range_in_flight_is_caught_and_fetched_again(
    request, fault_proxy, tmp_path, transport, backend_name
):
    backend = request.getfixturevalue(f"{backend_name}_backend")
    fs, path, proxy, data = _large_with_ranges_in_flight(backend, fault_proxy, tmp_path, transport)
    last = range_starts(len(data), 4)[-1]
    proxy.add(Flip(offset=12_345), range=f"bytes={last}-", **_data_gets(backend))
    assert hashlib.sha256(fs.cat_file(path)).digest() == hashlib.sha256(data).digest()
    stats = fs.cache_stats()
    assert (stats["integrity_failures"], stats["cached_files"]) == (1, 1)


def test_without_faults_a_cold_read_is_one_metadata_request_and_one_get_and_a_hit_none(
    remote_backend, fault_proxy, tmp_path, transport
):
    """What docs/scale.md counts on: two requests per cold object, none per cache hit."""
    fs, path, proxy, _ = _through_proxy(remote_backend, fault_proxy, tmp_path, transport)
    assert fs.cat_file(path) == DATA
    requests = proxy.requests()
    assert len(requests) == 2, [(e.method, e.path) for e in requests]
    assert len(_data_exchanges(proxy, remote_backend, transport)) == 1
    assert fs.cat_file(path) == DATA
    assert len(proxy.requests()) == 2
