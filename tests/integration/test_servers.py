"""The test servers behave like the storage they stand for, directly and through the proxy.

These tests pin down what the storage engineers' integration tests rely on: every backend
round-trips data through its plain fsspec filesystem, ranged reads are byte-exact, and the
fault proxy with an empty plan is invisible to s3fs, gcsfs, adlfs and fsspec's HTTP client.
They also record the servers' known quirks, so a change in an emulator shows up here first.
"""

from __future__ import annotations

import random

import aiohttp
import pytest
from azure.core.exceptions import HttpResponseError
from botocore.exceptions import FlexibleChecksumError

from tests.faults import Cut, Flip, Reset, Status
from tests.integration import servers

DATA = random.Random(20261202).randbytes(300_000)

INNER_RANGES = [(0, 1), (10, 20), (0, len(DATA)), (123_456, 234_567), (len(DATA) - 7, len(DATA))]


def test_backend_round_trips_put_cat_ls_info(backend: servers.Backend):
    url = backend.put("dir/shard-0.tar", DATA)
    backend.put("dir/shard-1.tar", b"second")
    fs = backend.filesystem()

    assert fs.cat_file(url) == DATA
    assert fs.info(url)["size"] == len(DATA)
    listed = sorted(
        name.rstrip("/").rsplit("/", 1)[-1] for name in fs.ls(backend.url("dir"), detail=False)
    )
    assert listed == ["shard-0.tar", "shard-1.tar"]
    assert fs.exists(url)
    assert not fs.exists(backend.url("dir/absent.tar"))


def test_missing_file_raises_file_not_found(backend: servers.Backend):
    backend.put("present", b"x")
    with pytest.raises(FileNotFoundError):
        backend.filesystem().cat_file(backend.url("absent"))


def test_ranged_cat_file_within_the_file_is_byte_exact(backend: servers.Backend):
    url = backend.put("ranged.bin", DATA)
    fs = backend.filesystem()
    for start, end in INNER_RANGES:
        assert fs.cat_file(url, start=start, end=end) == DATA[start:end], (start, end)


# How each emulated server answers reads that are not a plain range inside the file.
# Values: the bytes fsspec returns, or the exception type it raises.
QUIRKS = {
    "suffix (start=-10)": {
        "file": DATA[-10:],
        "http": DATA[-10:],
        "s3": DATA[-10:],
        "gcs": DATA,  # gcp-storage-emulator ignores suffix ranges: the whole object comes back
        "az": ValueError,  # Azurite answers HTTP 500; adlfs then misses Content-Range
    },
    "start past the end": {
        "file": b"",
        "http": aiohttp.ClientResponseError,  # nginx: 416; fsspec's HTTP client lets it through
        "s3": OSError,  # moto: 416, s3fs raises OSError(EINVAL)
        "gcs": b"",  # the emulator: 206 with an empty body
        "az": HttpResponseError,  # Azurite: 416 InvalidRange, raised by azure-core as it is
    },
    "empty range (start == end)": {
        "file": b"",
        "http": b"",
        "s3": DATA,  # s3fs sends "bytes=5-4", which S3 ignores: the whole object
        "gcs": b"",
        "az": ValueError,
    },
}
QUIRK_RANGES = {
    "suffix (start=-10)": (-10, None),
    "start past the end": (len(DATA) + 10, len(DATA) + 20),
    "empty range (start == end)": (5, 5),
}


@pytest.mark.parametrize("case", list(QUIRKS))
def test_server_quirks_for_unusual_ranges_are_as_recorded(backend: servers.Backend, case):
    if backend.server == "external":
        pytest.skip("the recorded quirks are those of the bundled emulators")
    url = backend.put("quirk.bin", DATA)
    start, end = QUIRK_RANGES[case]
    expected = QUIRKS[case][backend.protocol]
    fs = backend.filesystem()
    if isinstance(expected, type):
        with pytest.raises(expected):
            fs.cat_file(url, start=start, end=end)
    else:
        assert fs.cat_file(url, start=start, end=end) == expected


def test_each_test_gets_its_own_prefix(s3_service):
    first = s3_service.backend(servers.unique_prefix())
    second = s3_service.backend(servers.unique_prefix())
    first.put("only-here", b"1")
    fs = second.filesystem()
    assert first.url("") != second.url("")
    assert not fs.exists(second.url("only-here"))


def test_remote_backend_works_through_a_passing_proxy(remote_backend, fault_proxy):
    proxy, proxied = fault_proxy(remote_backend)
    proxied.put("through/large.bin", DATA * 4)  # s3fs sends large bodies after 100-continue
    url = proxied.put("through/data.bin", DATA)  # http: written to nginx's directory directly
    fs = proxied.filesystem()

    assert fs.cat_file(url) == DATA
    assert fs.cat_file(url, start=1000, end=2000) == DATA[1000:2000]
    assert fs.info(url)["size"] == len(DATA)
    assert fs.ls(proxied.url("through"), detail=False)
    with fs.open(url, "rb", block_size=64 * 1024) as f:
        f.seek(200_000)
        assert f.read(50_000) == DATA[200_000:250_000]

    exchanges = proxy.log
    assert exchanges, "the client did not go through the proxy"
    if remote_backend.protocol != "http":
        assert {"PUT", "POST"} & {entry.method for entry in exchanges}, "the upload went around"
    # Every request passed untouched (gcsfs may abandon a redundant lookup mid-answer).
    assert all(entry.action == "pass" and not entry.fault_applied for entry in exchanges)
    assert proxy.bytes_sent() >= len(DATA) + 1000 + 50_000
    plain = remote_backend.filesystem()
    assert plain.cat_file(remote_backend.url("through/data.bin")) == DATA
    assert plain.cat_file(remote_backend.url("through/large.bin")) == DATA * 4
    if remote_backend.protocol == "s3":
        assert any(entry.headers.get("expect") == "100-continue" for entry in exchanges)


# What each client library does on its own when the proxy breaks a GET of the whole file.
# "retried": the library retried by itself and returned the right bytes after two GETs;
# "corrupt": it returned the bytes as received, one of them flipped; else the exception.
CLIENT_REACTIONS = {
    "cut": {
        "http": aiohttp.ClientPayloadError,
        "s3": "retried",
        "gcs": "retried",
        "az": "retried",
    },
    "reset mid-body": {
        "http": aiohttp.ClientPayloadError,
        "s3": "retried",
        "gcs": "retried",
        "az": "retried",
    },
    "flip": {
        "http": "corrupt",
        "s3": FlexibleChecksumError,  # botocore checks the CRC moto sends with the object
        "gcs": "corrupt",  # gcsfs does not check the crc32c on download
        "az": "corrupt",
    },
    "503": {
        "http": aiohttp.ClientResponseError,
        "s3": "retried",
        "gcs": "retried",
        # az: azure-storage-blob also retries, but only after ~18 s (initial_backoff=15 s)
    },
}
FAULTS = {
    "cut": Cut(after_bytes=1000),
    "reset mid-body": Reset(after_bytes=1000),
    "flip": Flip(offset=10),
    "503": Status(503, retry_after=0),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_client_library_reaction_to_a_fault_is_as_recorded(remote_backend, fault_proxy, fault):
    if remote_backend.server == "external":
        pytest.skip("the recorded reactions are those against the bundled emulators")
    if remote_backend.protocol not in CLIENT_REACTIONS[fault]:
        pytest.skip("too slow to check here; see the table")
    remote_backend.put("victim.bin", DATA)
    proxy, proxied = fault_proxy(remote_backend)
    proxy.add(FAULTS[fault], method="GET", path="victim.bin")
    fs = proxied.filesystem()
    expected = CLIENT_REACTIONS[fault][remote_backend.protocol]
    if isinstance(expected, type):
        with pytest.raises(expected):
            fs.cat_file(proxied.url("victim.bin"), start=0, end=len(DATA))
        return
    body = fs.cat_file(proxied.url("victim.bin"), start=0, end=len(DATA))
    gets = proxy.requests(method="GET", path="victim.bin")
    if expected == "retried":
        assert body == DATA
        assert len(gets) == 2 and gets[0].fault_applied
    else:
        assert len(body) == len(DATA) and body[10] == DATA[10] ^ 0xFF
        assert body[:10] + body[11:] == DATA[:10] + DATA[11:]


def test_a_file_backend_cannot_be_proxied(file_backend, fault_proxy):
    with pytest.raises(ValueError, match="no server"):
        fault_proxy(file_backend)
