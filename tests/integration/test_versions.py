"""One read is one version: an object replaced while it is read gives the exact old bytes,
the exact new bytes or an OSError, never a mix; a response for other bytes than asked is
never used.

Replacements land at a planned point: the fault proxy holds one GET (`Delay`) until the
test has replaced the object, or the test replaces it between two reads of an open file.
Servers that cannot be made to misbehave are replaced by `hostile_http.HostileServer`.
Every test runs through both download transports (the fsspec backend and obstore).
"""

from __future__ import annotations

import os
import random
import tempfile
import threading
import time
from pathlib import Path

import boto3
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fsspec_shards.storage.transfer import planner, range_plan
from tests.faults import Cut, Delay, Pass, Replace
from tests.integration import servers
from tests.integration.conftest import backend_fixture, served
from tests.integration.hostile_http import HostileServer, OtherVersion, ShortLabel, WrongStart
from tests.integration.range_layout import range_starts
from tests.wds_filesystem import QUICK_RETRIES, wds_filesystem

MiB = 1024 * 1024
SIZE = 6 * MiB  # two chunks of a download (4 MiB first), two parts of a multipart upload
OLD = random.Random(1).randbytes(SIZE)
NEW = random.Random(2).randbytes(SIZE)  # same size: only the identity tells them apart
NAME = "versions/train-0000.tar"
DELAY = 5.0  # seconds a GET is held while the test replaces the object


def _put_nginx(backend: servers.HttpBackend, data: bytes, mtime: float) -> str:
    """Store `data` with the given modification time: nginx's ETag is mtime and size, so a
    same-size replacement within one second would keep the ETag."""
    url = backend.put(NAME, data)
    os.utime(Path(backend.root, backend.prefix, NAME), (mtime, mtime))
    return url


def _s3_client(backend: servers.S3Backend):
    return boto3.client(
        "s3",
        endpoint_url=backend.endpoint_url,
        aws_access_key_id=backend.key,
        aws_secret_access_key=backend.secret,
        region_name="us-east-1",
    )


def _put_multipart(client, backend: servers.S3Backend, data: bytes) -> str:
    """Store `data` as a two-part multipart upload: its ETag ("...-2") is no MD5."""
    key = f"{backend.prefix}/{NAME}"
    upload = client.create_multipart_upload(Bucket=backend.bucket, Key=key)["UploadId"]
    parts = []
    for number, part in enumerate((data[: 5 * MiB], data[5 * MiB :]), start=1):
        etag = client.upload_part(
            Bucket=backend.bucket, Key=key, UploadId=upload, PartNumber=number, Body=part
        )["ETag"]
        parts.append({"ETag": etag, "PartNumber": number})
    client.complete_multipart_upload(
        Bucket=backend.bucket, Key=key, UploadId=upload, MultipartUpload={"Parts": parts}
    )
    assert client.head_object(Bucket=backend.bucket, Key=key)["ETag"].endswith('-2"')
    return backend.url(NAME)


def _replaced_while_held(proxy, read, replace, **match) -> dict:
    """Run `read()` while the GET that `match`es is held by the proxy; replace the object
    meanwhile. Returns {"data": ...} or {"error": ...}."""
    proxy.add(Delay(DELAY), **match)
    outcome: dict = {}

    def reader() -> None:
        try:
            outcome["data"] = read()
        except OSError as error:
            outcome["error"] = error

    thread = threading.Thread(target=reader)
    thread.start()
    deadline = time.monotonic() + 120
    while not any(entry.action.startswith("delay") for entry in proxy.log):
        assert time.monotonic() < deadline and thread.is_alive(), outcome
        time.sleep(0.01)
    started = time.monotonic()
    replace()
    assert time.monotonic() - started < DELAY, "the replacement must land while the GET is held"
    thread.join(180)
    assert not thread.is_alive()
    return outcome


# -- nginx (ETag and Last-Modified), S3 multipart (an ETag that is no MD5), GCS (whose
# emulator says nothing of versions in its responses: info() is asked instead), Azure ------


def _nginx(http_backend, fault_proxy, tmp_path, **wds):
    _put_nginx(http_backend, OLD, time.time() - 100)
    proxy, proxied = fault_proxy(http_backend)
    fs = wds_filesystem(
        "http", proxied.storage_options, cache_dir=tmp_path / "cache", **QUICK_RETRIES, **wds
    )
    return fs, proxy, proxied.url(NAME), lambda: _put_nginx(http_backend, NEW, time.time())


def _multipart(s3_backend, fault_proxy, tmp_path, **wds):
    client = _s3_client(s3_backend)  # made now: the replacement must be quick
    _put_multipart(client, s3_backend, OLD)
    proxy, proxied = fault_proxy(s3_backend)
    fs = wds_filesystem(
        "s3", proxied.storage_options, cache_dir=tmp_path / "cache", **QUICK_RETRIES, **wds
    )
    return fs, proxy, proxied.url(NAME), lambda: _put_multipart(client, s3_backend, NEW)


def _replaced_by_put(backend, fault_proxy, tmp_path, **wds):
    backend.put(NAME, OLD)
    proxy, proxied = fault_proxy(backend)
    fs = wds_filesystem(
        backend.protocol,
        proxied.storage_options,
        cache_dir=tmp_path / "cache",
        **QUICK_RETRIES,
        **wds,
    )
    return fs, proxy, proxied.url(NAME), lambda: backend.put(NAME, NEW)


SERVERS = {
    "nginx": ("http_backend", _nginx),
    "s3-multipart": ("s3_backend", _multipart),
    "gcs": ("gcs_backend", _replaced_by_put),
    "az": ("az_backend", _replaced_by_put),
}


@pytest.fixture(params=sorted(SERVERS))
def replaceable(request, fault_proxy, tmp_path, transport):
    """A factory: ``replaceable(**wds)`` -> (a wds filesystem reading through a fault proxy
    and ``transport``, the proxy, the object's URL, a function that replaces the object with
    ``NEW``)."""
    fixture, make = SERVERS[request.param]
    if fixture == "gcs_backend":  # obstore reads the emulator through its XML front
        fixture = backend_fixture(request, "gcs")
    backend = request.getfixturevalue(fixture)
    chosen = served(backend, transport)
    return lambda **wds: make(backend, fault_proxy, tmp_path, transport=chosen, **wds)


@pytest.mark.parametrize("cache", [True, False])
def test_an_object_replaced_between_two_ranged_gets_of_one_download_is_read_whole_again(
    replaceable, cache
):
    fs, proxy, url, replace = replaceable(cache=cache)
    proxy.add(Cut(after_bytes=4 * MiB), method="GET", has_range=True)  # breaks off
    outcome = _replaced_while_held(  # ... and the GET resuming it is held
        proxy, lambda: fs.cat_file(url), replace, method="GET", has_range=True
    )
    resumed = [e.range for e in proxy.requests(method="GET") if e.range][1]
    assert not resumed.startswith("bytes=0-")
    assert outcome.get("data") == NEW  # started over on the new version, not spliced
    assert fs.cat_file(url) == NEW


@pytest.mark.parametrize("cache", [True, False])
def test_an_object_replaced_between_info_and_the_get_is_read_as_the_new_version(replaceable, cache):
    fs, proxy, url, replace = replaceable(cache=cache)
    outcome = _replaced_while_held(
        proxy, lambda: fs.cat_file(url), replace, method="GET", range="bytes=0-"
    )
    assert outcome.get("data") == NEW


def test_an_open_uncached_file_whose_object_is_replaced_raises_instead_of_mixing(
    replaceable, request
):
    fs, _, url, replace = replaceable(cache=False, block_size=MiB)
    with fs.open(url) as handle:
        head = handle.read(MiB)
        assert head == OLD[:MiB]
        replace()
        params = request.node.callspec.params
        if (params["replaceable"], params["transport"]) == ("gcs", "fsspec"):
            # the emulator's answers carry no identity (its XML front, for obstore, does):
            # the first read read it whole
            assert handle.read() == OLD[MiB:]
            return
        with pytest.raises(OSError, match="changed while it was read"):
            handle.read()


def test_a_direct_ranged_read_of_a_replaced_object_reads_one_version(replaceable, request):
    fs, proxy, url, replace = replaceable(ranged_reads="direct")
    params = request.node.callspec.params
    if (params["replaceable"], params["transport"]) == ("gcs", "fsspec"):
        # the emulator's answers carry no identity: the object is read whole (one answer),
        # the ranges cut from it; no GET asks for the second range
        got = fs.cat_ranges([url, url], [0, 5 * MiB], [10, 5 * MiB + 10], on_error="raise")
        assert got == [OLD[:10], OLD[5 * MiB : 5 * MiB + 10]]
        return
    outcome = _replaced_while_held(
        proxy,
        lambda: fs.cat_ranges([url, url], [0, 5 * MiB], [10, 5 * MiB + 10], on_error="raise"),
        replace,
        method="GET",
        range=f"bytes={5 * MiB}-",
    )
    assert outcome.get("data") in (
        [OLD[:10], OLD[5 * MiB : 5 * MiB + 10]],
        [NEW[:10], NEW[5 * MiB : 5 * MiB + 10]],
    )
    assert fs.cache_stats()["cached_files"] == 0


# -- a server that gives no identity at all ------------------------------------------


@pytest.fixture
def bare():
    """A server that sends neither ETag nor Last-Modified."""
    with HostileServer(identity=False) as server:
        yield server


def test_without_identity_a_download_without_faults_is_one_get_of_the_whole_object(
    bare, tmp_path, transport
):
    url = bare.put("bare.bin", OLD)
    fs = wds_filesystem(
        "http", {}, cache_dir=tmp_path / "cache", **QUICK_RETRIES, transport=transport
    )
    assert fs.cat_file(url) == OLD
    gets = bare.gets("bare.bin")
    assert [(entry.range, entry.status) for entry in gets] == [(f"bytes=0-{SIZE - 1}", 206)]


@pytest.mark.parametrize("cache", [True, False])
def test_without_identity_a_resumed_download_of_a_resized_object_starts_over(
    bare, tmp_path, cache, transport
):
    longer = NEW + b"tail"
    url = bare.put("bare.bin", OLD, plan=[Cut(MiB), Replace(longer)])
    fs = wds_filesystem(
        "http", {}, cache_dir=tmp_path / "cache", **QUICK_RETRIES, transport=transport, cache=cache
    )
    assert fs.cat_file(url) == longer
    first, resumed, again = (entry.range for entry in bare.gets("bare.bin"))
    assert first == f"bytes=0-{SIZE - 1}" and again == f"bytes=0-{len(longer) - 1}"
    resumed_at = int(resumed.split("=")[1].split("-")[0])
    assert 0 < resumed_at <= MiB  # resumed, and refused: the total size changed


@pytest.mark.parametrize("cache", [True, False])
def test_without_identity_a_resized_object_between_info_and_get_is_read_as_the_new(
    bare,
    tmp_path,
    cache,
    transport,
):
    shorter = NEW[:-100]
    url = bare.put("bare.bin", OLD, plan=[Replace(shorter)])
    fs = wds_filesystem(
        "http", {}, cache_dir=tmp_path / "cache", **QUICK_RETRIES, transport=transport, cache=cache
    )
    assert fs.cat_file(url) == shorter


def test_without_identity_an_open_uncached_file_of_a_resized_object_raises(
    bare, tmp_path, transport
):
    url = bare.put("bare.bin", OLD)
    fs = wds_filesystem(
        "http",
        {},
        cache_dir=tmp_path / "cache",
        **QUICK_RETRIES,
        transport=transport,
        cache=False,
        block_size=MiB,
    )
    with fs.open(url) as handle:
        assert handle.read(MiB) == OLD[:MiB]
        bare.put("bare.bin", NEW + b"tail")
        with pytest.raises(OSError, match="changed while it was read"):
            handle.read()


# -- Content-Range -------------------------------------------------------------------


@pytest.mark.parametrize("identity", [True, False])
def test_a_response_for_other_bytes_than_asked_is_retried_not_used(tmp_path, identity, transport):
    with HostileServer(identity=identity) as server:
        url = server.put("shifted.bin", OLD, plan=[WrongStart(100)])
        fs = wds_filesystem(
            "http", {}, cache_dir=tmp_path / "cache", **QUICK_RETRIES, transport=transport
        )
        assert fs.cat_file(url) == OLD
        assert fs.cache_stats()["retries"] == 1
        server.put("ranged.bin", OLD, plan=[WrongStart(7)])
        direct = wds_filesystem(
            "http",
            {},
            cache_dir=tmp_path / "cache",
            **QUICK_RETRIES,
            transport=transport,
            ranged_reads="direct",
        )
        assert direct.cat_file(server.url("ranged.bin"), 1000, 2000) == OLD[1000:2000]


def test_bytes_past_what_a_content_range_labels_are_never_used(tmp_path, transport):
    # a 206 labelled "bytes 0-999/..." with a longer body: what follows the label is no
    # byte the server vouched for (here zeros), so the read asks again from byte 1000
    with HostileServer() as server:
        url = server.put("labelled.bin", OLD, plan=[ShortLabel(1000)])
        fs = wds_filesystem(
            "http", {}, cache_dir=tmp_path / "cache", **QUICK_RETRIES, transport=transport
        )
        assert fs.cat_file(url) == OLD
        server.put("direct.bin", OLD, plan=[ShortLabel(10)])
        direct = wds_filesystem(
            "http",
            {},
            cache_dir=tmp_path / "cache",
            **QUICK_RETRIES,
            transport=transport,
            ranged_reads="direct",
        )
        assert direct.cat_file(server.url("direct.bin"), 1000, 2000) == OLD[1000:2000]


def test_a_server_that_keeps_answering_other_bytes_gives_an_error_never_the_bytes(
    tmp_path, transport
):
    with HostileServer() as server:
        url = server.put("shifted.bin", OLD, plan=[WrongStart(100)] * 10)
        fs = wds_filesystem(
            "http",
            {},
            cache_dir=tmp_path / "cache",
            **QUICK_RETRIES,
            transport=transport,
            retries=3,
        )
        with pytest.raises(OSError, match="Content-Range starts at byte 100, asked for 0"):
            fs.cat_file(url)
        assert fs.cache_stats()["cached_files"] == 0


# -- several ranges in flight ----------------------------------------------------------


def test_an_object_replaced_while_its_ranges_are_in_flight_is_read_whole_again(
    s3_backend, fault_proxy, tmp_path, transport, no_splits
):
    """The last range is held until the object is replaced: its response is of the new
    version, so the whole download starts over on it, never splicing the two."""
    old = random.Random(3).randbytes(40 * MiB)
    new = random.Random(4).randbytes(40 * MiB)
    s3_backend.put(NAME, old)
    proxy, proxied = fault_proxy(s3_backend)
    fs = wds_filesystem(
        "s3",
        proxied.storage_options,
        cache_dir=tmp_path / "cache",
        **QUICK_RETRIES,
        transport=transport,
        ranges_in_flight=4,
    )
    outcome = _replaced_while_held(
        proxy,
        lambda: fs.cat_file(proxied.url(NAME)),
        lambda: s3_backend.put(NAME, new),
        method="GET",
        range=f"bytes={range_starts(len(old), 4)[-1]}-",
    )
    assert outcome.get("data") == new


# -- answers that leave the identity out (a stale replica that ignores If-Match) -----------


def _one_version_or_an_error(fs, url) -> bytes | None:
    try:
        return fs.cat_file(url)
    except OSError:
        return None


@pytest.fixture
def small_objects_in_ranges(monkeypatch):
    """Objects over 1 MiB are filled by ranges in flight (not only those over 32 MiB), and
    no store is known yet."""
    monkeypatch.setattr(planner, "AUTO_ABOVE", MiB)
    monkeypatch.setattr(range_plan, "_learned", {})


@pytest.mark.parametrize("ranges_in_flight", [1, 8, "auto"])
@pytest.mark.parametrize("carries", ["nothing", "its Last-Modified"])
def test_answers_of_another_version_without_its_etag_are_never_spliced(
    tmp_path, transport, ranges_in_flight, carries, small_objects_in_ranges
):
    # HEAD names v1; some GETs answer with v2's bytes (same size), no ETag, If-Match
    # ignored; with one stream the first GET is cut, so the resume meets them
    stale = OtherVersion(NEW, modified=carries != "nothing")
    first = Cut(MiB) if ranges_in_flight == 1 else Pass()
    with HostileServer() as server:
        url = server.put("stale.bin", OLD, plan=[first, stale, stale])
        fs = wds_filesystem(
            "http",
            {},
            cache_dir=tmp_path / "cache",
            **QUICK_RETRIES,
            transport=transport,
            ranges_in_flight=ranges_in_flight,
        )
        got = _one_version_or_an_error(fs, url)
        assert got is None or got in (OLD, NEW), "two versions spliced"
        if ranges_in_flight == 1 and got is not None:
            resumed = server.gets("stale.bin")[1]
            assert not resumed.range.startswith("bytes=0-")  # the resume met v2: refused
        assert fs.cat_file(url) in (OLD, NEW)


def test_a_download_whose_every_answer_proves_nothing_and_is_cut_fails_clearly(tmp_path, transport):
    # every GET carries no identity and is cut: one request from byte 0 is the one shape
    # such answers are used in, and it never completes, so the download fails naming why
    cut = OtherVersion(OLD, cut=MiB)
    with HostileServer() as server:
        url = server.put("cut.bin", OLD, plan=[cut] * 40)
        fs = wds_filesystem(
            "http",
            {},
            cache_dir=tmp_path / "cache",
            **QUICK_RETRIES,
            transport=transport,
            retries=3,
        )
        with pytest.raises(OSError, match="no ETag, version or Last-Modified"):
            fs.cat_file(url)
        assert fs.cache_stats()["cached_files"] == 0


def test_an_uncached_file_whose_answers_prove_nothing_is_read_whole_once(tmp_path, transport):
    # HEAD names the version, GETs do not: the first read reads the object whole (one
    # answer), every later read is served from that copy, whatever the server does next
    with HostileServer(identity_on_get=False) as server:
        url = server.put("u.bin", OLD)
        fs = wds_filesystem(
            "http",
            {},
            cache_dir=tmp_path / "cache",
            **QUICK_RETRIES,
            transport=transport,
            cache=False,
            block_size=MiB,
        )
        with fs.open(url) as handle:
            assert handle.read(MiB) == OLD[:MiB]
            server.put("u.bin", NEW)
            assert handle.read() == OLD[MiB:]
        ranges = [entry.range for entry in server.gets("u.bin")]
        assert ranges[-1] == "bytes=0-" or ranges[-1].startswith("bytes=0-"), ranges
        assert len(ranges) == 2  # the refused ranged read, then the whole object once


def test_direct_ranges_whose_answers_prove_nothing_are_cut_from_one_whole_read(tmp_path, transport):
    # ranged_reads="direct": a range whose answer proves no version is not used; the object
    # is read whole once (on disk, not in memory) and the ranges are cut from that one answer
    with HostileServer(identity_on_get=False) as server:
        url = server.put("d.bin", OLD)
        fs = wds_filesystem(
            "http",
            {},
            cache_dir=tmp_path / "cache",
            **QUICK_RETRIES,
            transport=transport,
            ranged_reads="direct",
        )
        assert fs.cat_file(url, start=MiB, end=2 * MiB) == OLD[MiB : 2 * MiB]
        ranges = [entry.range for entry in server.gets("d.bin")]
        assert ranges[-1].startswith("bytes=0-") or not ranges[-1], ranges
        assert fs.cache_stats()["cached_files"] == 0


# -- the property: one version or an error, whatever the schedule --------------------------

SMALL = 3 * MiB
SMALL_OLD, SMALL_NEW = OLD[:SMALL], NEW[:SMALL]
_cuts = st.integers(0, SMALL // (256 * 1024) - 1).map(lambda n: n * 256 * 1024 + 17)
_answers = st.one_of(
    st.just(Pass()),
    _cuts.map(Cut),
    st.builds(Replace, st.sampled_from([SMALL_OLD, SMALL_NEW])),  # a real flip (HEAD too)
    st.builds(  # a stale replica: If-Match ignored, identity headers or not, maybe cut
        OtherVersion,
        st.sampled_from([SMALL_OLD, SMALL_NEW]),
        etag=st.booleans(),
        modified=st.booleans(),
        cut=st.none() | _cuts,
    ),
)


@settings(
    max_examples=12,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    plan=st.lists(_answers, max_size=6),
    ranges_in_flight=st.sampled_from([1, 8, "auto"]),
)
def test_any_schedule_of_flips_cuts_and_answers_ignoring_if_match_gives_one_version(
    tmp_path, transport, small_objects_in_ranges, plan, ranges_in_flight
):
    with HostileServer() as server:
        url = server.put("p.bin", SMALL_OLD, plan=plan)
        fs = wds_filesystem(
            "http",
            {},
            cache_dir=Path(tempfile.mkdtemp(dir=tmp_path)) / "cache",
            **QUICK_RETRIES,
            transport=transport,
            ranges_in_flight=ranges_in_flight,
            retries=3,
        )
        got = _one_version_or_an_error(fs, url)
        assert got is None or got in (SMALL_OLD, SMALL_NEW), [e.range for e in server.log]
