"""The obstore transport against real servers (moto S3, Azurite, nginx, gcp-storage-emulator
behind a GCS XML front) and through the fault proxy.

Each test checks the bytes handed to the sink, the facts returned, and how the retry layer
classifies what was raised (``is_transient`` / ``permanent_error``).
"""

from __future__ import annotations

import dataclasses
import email.utils
import errno
import gc
import http.server
import multiprocessing
import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import pytest

from fsspec_shards.storage.backends.versions import Version, VersionMismatch
from fsspec_shards.storage.core.retry import http_status, is_transient, permanent_error
from fsspec_shards.storage.transfer import obstore_transport
from fsspec_shards.storage.transfer.obstore_transport import (
    ObstoreTransport,
    ServerUnsupported,
    TransportUnavailable,
    choose_transport,
)
from tests.faults import Cut, Reset, Stall, Status
from tests.integration import servers

pytest.importorskip("obstore")

SIZE = 3_000_000
DATA = random.Random(12).randbytes(SIZE)
OTHER = random.Random(13).randbytes(SIZE + 1000)
NAME = "shards/obj-0000.bin"
TIMEOUT = 30.0  # seconds without progress: room for a loaded machine
STALL_TIMEOUT = 2.0
OBJECT_IN_PATH = "obj"  # in every request path for NAME (GCS's encodes the rest: obj%2D0000%2Ebin)


@dataclasses.dataclass(frozen=True)
class Target:
    """One backend as the transport sees it: fsspec protocol and options, and the backend
    (for uploads, paths and the address a proxy goes before)."""

    backend: servers.Backend
    protocol: str
    options: dict
    server: tuple[str, int]

    def address(self) -> tuple[str, int]:
        """Where a proxy goes before (what the fault_proxy fixture asks)."""
        return self.server

    def transport(self) -> ObstoreTransport:
        return choose_transport(self.protocol, self.options, "obstore")

    def path(self, name: str = NAME) -> str:
        url = self.backend.url(name)
        return url if self.protocol.startswith("http") else url.split("://", 1)[1]

    def put(self, data: bytes, name: str = NAME) -> str:
        self.backend.put(name, data)
        return self.path(name)

    def through(self, proxy) -> Target:
        if self.protocol == "gcs":
            options = {**self.options, "endpoint_url": proxy.url}
            return dataclasses.replace(self, options=options, server=proxy.address)
        backend = self.backend.through(proxy)
        return dataclasses.replace(
            self, backend=backend, options=backend.storage_options, server=proxy.address
        )


def _target(request, name: str) -> Target:
    if name == "gcs":
        front = request.getfixturevalue("gcs_front")
        backend = request.getfixturevalue("gcs_backend")
        return Target(backend, "gcs", {"endpoint_url": front.url, "token": "anon"}, front.address)
    backend = request.getfixturevalue(f"{name}_backend")
    return Target(backend, backend.protocol, backend.storage_options, backend.address())


@pytest.fixture(params=["http", "s3", "gcs", "az"])
def target(request) -> Target:
    """Each backend obstore serves, with a fresh prefix."""
    return _target(request, request.param)


def _read(transport, path, start, end, **kwargs) -> tuple[bytes, object]:
    parts: list[bytes] = []
    facts = transport.stream(path, start, end, parts.append, TIMEOUT, **kwargs)
    return b"".join(parts), facts


def _version(transport, path) -> Version:
    """The version a response for ``path`` carries (its first byte read)."""
    _, facts = _read(transport, path, 0, 1)
    return Version(facts.total, facts.etag, facts.version, facts.modified)


def _failure(
    transport, path, start=0, end=SIZE, timeout=TIMEOUT, sink=None, **kwargs
) -> tuple[bytes, BaseException, float]:
    """(bytes handed over, the exception, seconds taken) of a stream that must fail;
    ``sink`` replaces the one that keeps the bytes."""
    parts: list[bytes] = []
    started = time.monotonic()
    with pytest.raises(OSError) as caught:
        transport.stream(path, start, end, sink or parts.append, timeout, **kwargs)
    return b"".join(parts), caught.value, time.monotonic() - started


# --------------------------------------------------------------------------- bytes and facts


@pytest.mark.parametrize(
    ("start", "end"),
    [(0, SIZE), (0, 1), (SIZE - 1, SIZE), (123_456, 2_345_678), (2_999_000, SIZE + 500)],
)
def test_a_range_arrives_exactly_with_its_facts(target, start, end):
    path = target.put(DATA)
    data, facts = _read(target.transport(), path, start, end)
    assert data == DATA[start:end]
    assert (facts.status, facts.start, facts.total) == (206, start, SIZE)
    assert facts.etag and facts.modified is not None


def test_no_end_reads_to_the_end_of_the_object(target):
    path = target.put(DATA)
    data, facts = _read(target.transport(), path, 1_000_000, None)
    assert data == DATA[1_000_000:]
    assert (facts.start, facts.total) == (1_000_000, SIZE)


def test_a_gcs_response_carries_the_generation(request):
    target = _target(request, "gcs")
    path = target.put(DATA)
    assert _version(target.transport(), path).version.isdigit()


def test_a_missing_object_is_file_not_found_at_once(target):
    transport = target.transport()
    path = target.path("missing.bin")
    _, error, _ = _failure(transport, path, 0, 10)
    assert isinstance(error, FileNotFoundError)
    assert not is_transient(error)
    assert isinstance(permanent_error(error, target.backend.url("missing.bin")), FileNotFoundError)
    assert "missing.bin" in str(error)


def test_a_version_that_changed_is_refused_before_a_byte_is_passed(target):
    path = target.put(DATA)
    transport = target.transport()
    first = _version(transport, path)
    time.sleep(1.1)  # a new Last-Modified second, for servers whose ETag derives from it
    target.put(OTHER)
    data, error, _ = _failure(transport, path, 0, SIZE, expect=first)
    assert isinstance(error, VersionMismatch)
    assert data == b""
    assert not is_transient(error)


def test_the_version_asked_for_is_served(target):
    path = target.put(DATA)
    transport = target.transport()
    data, facts = _read(transport, path, 10, 20, expect=_version(transport, path))
    assert data == DATA[10:20]


# --------------------------------------------------------------------------- faults


def test_a_cut_mid_body_keeps_the_bytes_received_and_the_rest_follows(target, fault_proxy):
    target.put(DATA)
    proxy, through = fault_proxy(target)
    proxy.add(Cut(after_bytes=1_000_000), method="GET", path=OBJECT_IN_PATH)
    transport = through.transport()
    data, error, _ = _failure(transport, through.path())
    assert is_transient(error)
    assert len(data) == 1_000_000  # all that arrived: pieces are passed on as received
    assert data == DATA[: len(data)]
    rest, facts = _read(transport, through.path(), len(data), SIZE)
    assert data + rest == DATA
    assert facts.start == len(data)


def test_a_stall_raises_within_the_time_out(target, fault_proxy):
    target.put(DATA)
    proxy, through = fault_proxy(target)
    proxy.add(Stall(seconds=30, after_bytes=500_000), method="GET", path=OBJECT_IN_PATH)
    data, error, seconds = _failure(through.transport(), through.path(), timeout=STALL_TIMEOUT)
    assert isinstance(error, TimeoutError)
    assert is_transient(error)
    assert seconds < STALL_TIMEOUT + 15  # room for a loaded machine; the stall lasts 30 s
    assert data == DATA[: len(data)]


def test_a_reset_before_the_answer_is_transient(target, fault_proxy):
    target.put(DATA)
    proxy, through = fault_proxy(target)
    proxy.add(Reset(), method="GET", path=OBJECT_IN_PATH)
    data, error, _ = _failure(through.transport(), through.path())
    assert isinstance(error, ConnectionError) and is_transient(error)
    assert data == b""


@pytest.mark.parametrize(
    ("status", "kind", "transient"),
    [
        (503, OSError, True),
        (500, OSError, True),
        (429, OSError, True),
        (403, PermissionError, False),
        (404, FileNotFoundError, False),
        (400, OSError, False),
    ],
)
def test_error_statuses_are_classified(target, fault_proxy, status, kind, transient):
    target.put(DATA)
    proxy, through = fault_proxy(target)
    proxy.add(Status(status), method="GET", path=OBJECT_IN_PATH)
    _, error, _ = _failure(through.transport(), through.path())
    assert isinstance(error, kind)
    assert http_status(error) in (status, None)
    assert is_transient(error) is transient
    if not transient:
        assert isinstance(permanent_error(error, through.backend.url(NAME)), kind)
    assert error.__cause__ is None and error.__context__ is None


# --------------------------------------------------------------------------- secrets


def test_no_secret_shows_in_a_failure_through_an_azure_sas(az_backend):
    from azure.storage.blob import ContainerSasPermissions, generate_container_sas

    sas = generate_container_sas(
        servers.AZURITE_ACCOUNT,
        az_backend.container,
        account_key=servers.AZURITE_KEY,
        permission=ContainerSasPermissions(read=True),
        expiry=datetime.now(timezone.utc) + timedelta(hours=1),
    )
    az_backend.put(NAME, DATA)
    connection_string = f"BlobEndpoint={az_backend.blob_endpoint()};SharedAccessSignature={sas}"
    transport = choose_transport("az", {"connection_string": connection_string}, "obstore")
    path = az_backend.url(NAME).split("://", 1)[1]
    data, _ = _read(transport, path, 0, 100)
    assert data == DATA[:100]
    signature = dict(part.split("=", 1) for part in sas.split("&"))["sig"]
    _, error, _ = _failure(transport, path.replace("obj-0000", "missing"), 0, 10)
    assert isinstance(error, FileNotFoundError)
    assert signature not in str(error) and signature not in repr(error)
    assert error.__cause__ is None and error.__context__ is None


def test_no_secret_shows_when_access_is_denied(s3_backend, fault_proxy):
    secret = "very-secret-value-0123"
    s3_backend.put(NAME, DATA)
    proxy, proxied = fault_proxy(s3_backend)
    options = {**proxied.storage_options, "key": "AKIDSHOWN", "secret": secret}
    transport = choose_transport("s3", options, "obstore")
    proxy.add(Status(403, body=f"<Error>denied for {secret}</Error>".encode()), method="GET")
    _, error, _ = _failure(transport, s3_backend.url(NAME).split("://", 1)[1])
    assert isinstance(error, PermissionError)
    assert secret not in str(error) and secret not in repr(error)
    signed = proxy.requests("GET")[-1].headers["authorization"]
    assert signed.startswith("AWS4-HMAC-SHA256 Credential=AKIDSHOWN/")


# --------------------------------------------------------------------------- servers that misbehave


MODIFIED = 1_767_225_600.0  # 2026-01-01, the Last-Modified of the misbehaving server


class _Misbehaving(http.server.BaseHTTPRequestHandler):
    """Serves ``body`` at any path with ETag ``etag`` and Last-Modified ``modified`` (None:
    without the header); ignores If-Match and If-Unmodified-Since and, unless ``ranges``,
    Range too (a server that sends the whole object)."""

    protocol_version = "HTTP/1.1"
    body = b""
    etag = '"v2"'
    modified: float | None = MODIFIED
    ranges = True

    def log_message(self, format, *args) -> None:
        """Quiet."""

    def _send(self, head_only: bool) -> None:
        start, end, status = 0, len(self.body), 200
        asked = self.headers.get("Range")
        if asked and self.ranges:
            first, last = asked.split("=", 1)[1].split("-")
            start, end, status = int(first), min(int(last) + 1, len(self.body)), 206
        self.send_response(status)
        if self.etag is not None:
            self.send_header("ETag", self.etag)
        if self.modified is not None:
            modified = datetime.fromtimestamp(self.modified, timezone.utc)
            self.send_header("Last-Modified", email.utils.format_datetime(modified, usegmt=True))
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(self.body)}")
        self.send_header("Content-Length", str(end - start))
        self.end_headers()
        if not head_only:
            self.wfile.write(self.body[start:end])

    def do_GET(self) -> None:  # noqa: N802
        self._send(False)

    def do_HEAD(self) -> None:  # noqa: N802
        self._send(True)


@pytest.fixture
def misbehaving() -> Iterator[type[_Misbehaving]]:
    handler = type("Handler", (_Misbehaving,), {"body": DATA[:100_000]})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    handler.url = f"http://127.0.0.1:{server.server_address[1]}/obj.bin"
    yield handler
    server.shutdown()
    server.server_close()
    thread.join(timeout=10)


def test_a_server_ignoring_if_match_is_caught_by_the_answers_etag(misbehaving):
    transport = choose_transport("http", {}, "obstore")
    expect = Version(100_000, '"v1"', None, None)
    data, error, _ = _failure(transport, misbehaving.url, 0, 100_000, expect=expect)
    assert isinstance(error, VersionMismatch)
    assert data == b""
    assert "v1" in str(error) and "v2" in str(error)


def test_etags_compare_by_their_opaque_part(misbehaving):
    transport = choose_transport("http", {}, "obstore")
    for etag in ("v2", '"v2"', 'W/"v2"'):
        data, _ = _read(transport, misbehaving.url, 0, 10, expect=Version(None, etag))
        assert data == DATA[:10]


def test_without_an_etag_the_modification_time_tells_versions_apart(misbehaving):
    misbehaving.etag = None
    transport = choose_transport("http", {}, "obstore")
    same = Version(100_000, None, None, MODIFIED)
    data, facts = _read(transport, misbehaving.url, 0, 10, expect=same)
    assert data == DATA[:10] and facts.modified == MODIFIED and facts.etag is None
    older = Version(100_000, None, None, MODIFIED - 60)
    data, error, _ = _failure(transport, misbehaving.url, 0, 10, expect=older)
    assert isinstance(error, VersionMismatch) and data == b""


def test_an_answer_without_last_modified_has_no_modification_time(misbehaving):
    misbehaving.modified = None
    _, facts = _read(choose_transport("http", {}, "obstore"), misbehaving.url, 0, 10)
    assert facts.modified is None


def test_a_gcs_server_without_the_headers_obstore_needs_is_unsupported(misbehaving):
    """Where obstore cannot read a server that fsspec can, the error says so (use fsspec)."""
    misbehaving.modified = None
    base = misbehaving.url.rsplit("/", 1)[0]
    transport = choose_transport("gcs", {"endpoint_url": base, "token": "anon"}, "obstore")
    _, error, _ = _failure(transport, "bucket/obj.bin", 0, 10)
    assert isinstance(error, ServerUnsupported) and not is_transient(error)
    assert "Last-Modified" in str(error)


def test_the_gcs_emulator_itself_is_unsupported(gcs_backend):
    """gcp-storage-emulator without the XML front: obstore's encoded paths get 501."""
    path = gcs_backend.put(NAME, DATA).split("://", 1)[1]
    options = {"endpoint_url": gcs_backend.endpoint_url, "token": "anon"}
    _, error, _ = _failure(choose_transport("gcs", options, "obstore"), path, 0, 10)
    assert isinstance(error, ServerUnsupported) and not is_transient(error)


def test_a_server_ignoring_range_gives_the_range_from_the_whole_body(misbehaving):
    misbehaving.ranges = False
    transport = choose_transport("http", {}, "obstore")
    data, facts = _read(transport, misbehaving.url, 1000, 2000)
    assert data == DATA[1000:2000]
    assert facts.status == 200
    rest, _ = _read(transport, misbehaving.url, 1000, 2000, rest_of_body=True)
    assert rest == DATA[1000:100_000]


# --------------------------------------------------------------------------- processes


def _stream_in_child(transport: ObstoreTransport, target: Target, queue) -> None:
    try:
        data, _ = _read(transport, target.path(), 0, 1000)
        queue.put(("ok", data))
    except TransportUnavailable as exc:
        queue.put(("unavailable", str(exc)))
    queue.put(("auto", choose_transport(target.protocol, target.options, "auto")))
    try:
        queue.put(("obstore", repr(choose_transport(target.protocol, target.options, "obstore"))))
    except ValueError as exc:
        queue.put(("obstore refused", str(exc)))


def _in_forked_child(transport: ObstoreTransport, target: Target) -> list:
    """What a forked child gets from ``transport`` (built in this process) and from
    choosing a transport anew."""
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_stream_in_child, args=(transport, target, queue))
    child.start()
    try:
        answers = [queue.get(timeout=60) for _ in range(3)]
    finally:
        child.join(timeout=60)
    assert child.exitcode == 0
    return answers


def test_a_child_forked_after_obstore_ran_falls_back_instead_of_hanging(s3_backend):
    target = Target(s3_backend, "s3", s3_backend.storage_options, s3_backend.address())
    target.put(DATA)
    transport = target.transport()
    _read(transport, target.path(), 0, 10)  # obstore's runtime now runs here
    (outcome, detail), (_, auto), (choice, reason) = _in_forked_child(transport, target)
    assert outcome == "unavailable" and "fork" in detail
    assert auto is None
    assert choice == "obstore refused" and "fork" in reason


def test_a_child_forked_before_any_request_streams_through_obstore(s3_backend, tmp_path):
    """Only a runtime started before the fork is lost: a parent that has not made a request
    yet (here: a fresh interpreter) leaves its children free to use obstore."""
    script = tmp_path / "child.py"
    script.write_text(
        "import multiprocessing, sys\n"
        "from tests.integration import test_obstore_transport as t\n"
        "from tests.integration import servers\n"
        f"backend = servers.S3Backend('s3', {s3_backend.prefix!r}, 'moto', "
        f"endpoint_url={s3_backend.endpoint_url!r})\n"
        "target = t.Target(backend, 's3', backend.storage_options, backend.address())\n"
        "transport = target.transport()\n"
        "transport._store('test-bucket', t.TIMEOUT)\n"
        "answers = t._in_forked_child(transport, target)\n"
        "sys.exit(0 if answers[0] == ('ok', t.DATA[:1000]) and answers[1][1] else 1)\n"
    )
    Target(s3_backend, "s3", {}, s3_backend.address()).put(DATA)
    environment = {**os.environ, "PYTHONPATH": str(servers.REPO_ROOT)}
    finished = subprocess.run(
        [sys.executable, str(script)], env=environment, timeout=120, capture_output=True
    )
    assert finished.returncode == 0, finished.stderr.decode()[-2000:]


def test_the_store_cache_is_emptied_in_a_forked_child(s3_backend):
    target = Target(s3_backend, "s3", s3_backend.storage_options, s3_backend.address())
    target.transport()._store(s3_backend.bucket, TIMEOUT)
    assert obstore_transport._stores
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.write(write, str(len(obstore_transport._stores)).encode())
        os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(read, 10) == b"0"


def _response_types() -> tuple[type, ...]:
    """The types of obstore's answer to a GET and of its body stream."""
    import obstore
    from obstore.store import MemoryStore

    store = MemoryStore()
    obstore.put(store, "probe", b"probe")
    answer = obstore.get(store, "probe")
    return type(answer), type(answer.stream())


def _responses_alive(kinds: tuple[type, ...]) -> int:
    return sum(isinstance(thing, kinds) for thing in gc.get_objects())


def _sink_that_fails(piece: bytes) -> None:
    raise OSError(errno.ENOSPC, "no space left for the piece (planned)")


def test_a_failed_stream_leaves_no_obstore_response_for_a_forked_child_to_drop(target, misbehaving):
    """A response kept by a failure's traceback (the retry layer and callers keep errors)
    would reach a DataLoader worker forked later, whose garbage collection drops it: a
    body dropped there waits for obstore's runtime threads, which do not exist in the
    child, and can wait forever. A failed stream therefore releases its response at once,
    here while the exceptions that ended it are still held: a sink that fails mid-body,
    and an answer of another version (a server ignoring If-Match)."""
    kinds = _response_types()
    path = target.put(DATA)
    gc.collect()
    assert _responses_alive(kinds) == 0
    _, sink_failure, _ = _failure(target.transport(), path, 0, SIZE, sink=_sink_that_fails)
    assert sink_failure.errno == errno.ENOSPC
    assert _responses_alive(kinds) == 0
    transport = choose_transport("http", {}, "obstore")
    expect = Version(100_000, '"v1"', None, None)
    _, mismatch, _ = _failure(transport, misbehaving.url, 0, 100_000, expect=expect)
    assert isinstance(mismatch, VersionMismatch)
    assert _responses_alive(kinds) == 0


def test_an_s3_version_id_selects_that_version(s3_backend):
    """A version named in the path (s3fs's ``?versionId=``) or required by ``expect`` is
    the one served, also after the object was overwritten."""
    fs = s3_backend.filesystem()
    bucket = f"versioned-{servers.unique_prefix()}"
    fs.mkdir(bucket)
    fs.call_s3(
        "put_bucket_versioning", Bucket=bucket, VersioningConfiguration={"Status": "Enabled"}
    )
    fs.pipe_file(f"{bucket}/{NAME}", DATA)
    transport = choose_transport("s3", s3_backend.storage_options, "obstore")
    first = _version(transport, f"{bucket}/{NAME}")
    assert first.version
    fs.pipe_file(f"{bucket}/{NAME}", OTHER)
    data, facts = _read(transport, f"{bucket}/{NAME}?versionId={first.version}", 0, SIZE)
    assert data == DATA and facts.version == first.version
    again = _version(transport, f"{bucket}/{NAME}?versionId={first.version}")
    assert repr(again) == repr(first)
    data, _ = _read(transport, f"{bucket}/{NAME}", 5, 50, expect=first)
    assert data == DATA[5:50]
    assert _version(transport, f"{bucket}/{NAME}").size == len(OTHER)


def test_a_stream_waiting_for_the_server_lets_other_threads_run(s3_backend, fault_proxy):
    """obstore waits in Rust with the GIL released: Python threads keep working meanwhile."""
    target = Target(s3_backend, "s3", s3_backend.storage_options, s3_backend.address())
    target.put(DATA)
    proxy, through = fault_proxy(target)
    proxy.add(Stall(seconds=3, after_bytes=0), method="GET", path=OBJECT_IN_PATH)
    transport = through.transport()
    waiting = threading.Thread(target=_read, args=(transport, through.path(), 0, SIZE))
    waiting.start()
    time.sleep(0.5)  # the request is out and stalled
    counted, deadline = 0, time.monotonic() + 1.0
    while time.monotonic() < deadline:
        counted += 1
    waiting.join(timeout=60)
    assert proxy.requests("GET")[-1].fault_applied
    assert counted > 100_000  # a wait holding the GIL would stop this loop until the stall ends


# --------------------------------------------------------------------------- info (the stat)


def _what_the_rules_read(protocol: str, info: dict) -> tuple:
    """What the version rule, the checksum rule and the cache key take from an ``info()``."""
    from fsspec_shards.storage.backends import backend_for
    from fsspec_shards.storage.backends.versions import expected_version

    backend = backend_for(protocol)
    return (
        info["size"],
        info["type"],
        repr(expected_version(backend.version_fields, info)),
        backend.checksums(info),
        backend.identity(info),
    )


def test_an_s3_info_through_obstore_gives_what_s3fs_info_gives(s3_backend):
    """The stat a download starts with comes from obstore's HEAD on S3: every field the
    version rule, the checksum rule and the cache key read is s3fs's, in a versioned bucket
    (the version id) and an unversioned one (no version id, the MD5 ETag a checksum)."""
    fs = s3_backend.filesystem()
    transport = choose_transport("s3", s3_backend.storage_options, "obstore")
    versioned = f"versioned-{servers.unique_prefix()}"
    fs.mkdir(versioned)
    fs.call_s3(
        "put_bucket_versioning", Bucket=versioned, VersioningConfiguration={"Status": "Enabled"}
    )
    plain = Target(s3_backend, "s3", s3_backend.storage_options, s3_backend.address()).put(DATA)
    for path in (plain, f"{versioned}/{NAME}"):
        fs.pipe_file(path, DATA)
        fs.pipe_file(path, OTHER)  # the version id then names the second version
        ours, theirs = transport.info(path, TIMEOUT), fs.info(path)
        assert _what_the_rules_read("s3", ours) == _what_the_rules_read("s3", theirs)
        assert ours["name"] == theirs["name"]
    assert _what_the_rules_read("s3", ours)[3], "the MD5 ETag is a checksum"
    assert transport.info(f"{versioned}/{NAME}", TIMEOUT)["VersionId"]
    assert transport.info(plain, TIMEOUT)["VersionId"] is None


def test_info_through_obstore_leaves_to_the_backend_what_a_head_cannot_say(request, s3_backend):
    """A missing object or a prefix (the backend tells a directory from nothing), a path
    naming a version, and backends whose ``info()`` carries checksums obstore's answer
    lacks (GCS's md5Hash and crc32c, Azure's content MD5) are the backend's to answer."""
    target = Target(s3_backend, "s3", s3_backend.storage_options, s3_backend.address())
    path = target.put(DATA)
    transport = target.transport()
    assert transport.info(path.rsplit("/", 1)[0], TIMEOUT) is None  # a prefix
    assert transport.info(path + "-missing", TIMEOUT) is None
    assert transport.info(path + "?versionId=null", TIMEOUT) is None
    for name in ("gcs", "az", "http"):
        other = _target(request, name)
        assert other.transport().info(other.put(DATA), TIMEOUT) is None
