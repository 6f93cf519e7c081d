"""The fault proxy does exactly what its plan says, and nothing else.

The server behind the proxy is nginx (range-capable, keep-alive, chunked listings); the
clients are `http.client`, `requests` and raw sockets, so every fault is seen as the bytes a
client actually receives.
"""

from __future__ import annotations

import http.client
import http.server
import random
import socket
import threading
import time
from urllib.parse import quote, urlsplit

import pytest
import requests

from tests.faults import Cut, Delay, Flip, Reset, Stall, Status
from tests.integration import servers
from tests.integration.fault_proxy import FaultProxy, Match, Rule

DATA = random.Random(7).randbytes(200_000)
TIMEOUT = 30


@pytest.fixture
def served(http_backend, fault_proxy):
    """(proxy, path of DATA on the server, path of a second file) behind nginx."""
    http_backend.put("blob.bin", DATA)
    http_backend.put("other.bin", b"other file")
    proxy, proxied = fault_proxy(http_backend)
    return proxy, urlsplit(proxied.url("blob.bin")).path, urlsplit(proxied.url("other.bin")).path


def connect(proxy: FaultProxy, timeout: float = TIMEOUT) -> http.client.HTTPConnection:
    return http.client.HTTPConnection(proxy.host, proxy.port, timeout=timeout)


def get(conn: http.client.HTTPConnection, path: str, headers=None) -> tuple[int, bytes]:
    conn.request("GET", path, headers=headers or {})
    response = conn.getresponse()
    return response.status, response.read()


def test_pass_is_byte_exact_and_keeps_the_connection_alive(served):
    proxy, blob, other = served
    conn = connect(proxy)
    assert get(conn, blob) == (200, DATA)
    assert get(conn, other) == (200, b"other file")
    assert get(conn, blob) == (200, DATA)
    conn.close()

    log = proxy.log
    assert [entry.connection for entry in log] == [1, 1, 1]
    assert all(entry.complete and entry.action == "pass" for entry in log)
    assert proxy.bytes_sent(blob) == 2 * len(DATA)
    assert proxy.bytes_sent(other) == len(b"other file")


def test_ranged_requests_pass_through_and_are_logged(served):
    proxy, blob, _ = served
    conn = connect(proxy)
    assert get(conn, blob, {"Range": "bytes=1000-1999"}) == (206, DATA[1000:2000])
    assert get(conn, blob, {"Range": "bytes=-10"}) == (206, DATA[-10:])
    assert [entry.range for entry in proxy.log] == ["bytes=1000-1999", "bytes=-10"]


def test_head_gets_no_body_and_the_connection_stays_usable(served):
    proxy, blob, _ = served
    conn = connect(proxy)
    conn.request("HEAD", blob)
    response = conn.getresponse()
    assert response.status == 200
    assert int(response.headers["Content-Length"]) == len(DATA)
    assert response.read() == b""
    assert get(conn, blob) == (200, DATA)
    assert [entry.body_bytes for entry in proxy.log] == [0, len(DATA)]


def test_cut_gives_a_short_body_and_the_log_says_so(served):
    proxy, blob, _ = served
    proxy.add(Cut(after_bytes=1000), method="GET", path="blob")
    conn = connect(proxy)
    conn.request("GET", blob)
    response = conn.getresponse()
    with pytest.raises(http.client.IncompleteRead) as raised:
        response.read()
    assert raised.value.partial == DATA[:1000]

    (cut,) = proxy.log
    assert (cut.action, cut.status, cut.body_bytes) == ("cut(1000)", 200, 1000)
    assert cut.fault_applied and not cut.complete
    assert get(connect(proxy), blob) == (200, DATA), "the rule was for one request only"


def test_cut_at_zero_sends_only_the_headers(served):
    proxy, blob, _ = served
    proxy.add(Cut(after_bytes=0))
    with pytest.raises(requests.exceptions.ChunkedEncodingError):
        requests.get(f"{proxy.url}{blob}", timeout=TIMEOUT)
    assert proxy.log[0].body_bytes == 0


def test_cut_beyond_the_end_of_the_body_changes_nothing(served):
    proxy, _, other = served
    proxy.add(Cut(after_bytes=10_000))
    assert get(connect(proxy), other) == (200, b"other file")
    assert not proxy.log[0].fault_applied


def test_reset_on_request_gives_connection_reset(served):
    proxy, blob, _ = served
    proxy.add(Reset())
    conn = connect(proxy)
    with pytest.raises(ConnectionResetError):
        get(conn, blob)
    assert proxy.log[0].status is None
    assert proxy.log[0].fault_applied


def test_reset_mid_body_gives_connection_reset(served):
    proxy, blob, _ = served
    proxy.add(Reset(after_bytes=50_000))
    conn = connect(proxy)
    conn.request("GET", blob)
    response = conn.getresponse()
    with pytest.raises((ConnectionResetError, http.client.IncompleteRead)):
        response.read()
    assert proxy.log[0].body_bytes == 50_000


@pytest.mark.parametrize(("code", "retry_after"), [(503, 2), (429, 0.5), (500, None)])
def test_status_is_answered_by_the_proxy_with_retry_after(served, code, retry_after):
    proxy, _, _ = served
    proxy.add(Status(code, retry_after=retry_after))
    conn = connect(proxy)
    conn.request("GET", "/no/such/file")  # the server would say 404
    response = conn.getresponse()
    assert response.status == code
    assert response.headers.get("Retry-After") == (
        None if retry_after is None else str(retry_after)
    )
    response.read()
    assert get(conn, "/no/such/file")[0] == 404, "the connection stays usable afterwards"
    assert [entry.status for entry in proxy.log] == [code, 404]


def test_status_to_an_upload_drops_its_body_and_keeps_the_connection(served):
    proxy, blob, _ = served
    proxy.add(Status(503), method="PUT")
    conn = connect(proxy)
    conn.request("PUT", "/upload.bin", body=b"u" * 100_000)
    response = conn.getresponse()
    assert response.status == 503
    response.read()
    assert get(conn, blob) == (200, DATA)


def test_stall_exceeds_a_short_client_timeout(served):
    proxy, blob, _ = served
    proxy.add(Stall(seconds=5, after_bytes=100))
    started = time.monotonic()
    conn = connect(proxy, timeout=0.5)
    conn.request("GET", blob)
    response = conn.getresponse()
    with pytest.raises(TimeoutError):
        response.read()
    assert time.monotonic() - started < 4
    assert proxy.log[0].body_bytes == 100


def test_stall_then_sends_the_rest_to_a_patient_client(served):
    proxy, blob, _ = served
    proxy.add(Stall(seconds=0.5))
    started = time.monotonic()
    assert get(connect(proxy), blob) == (200, DATA)
    assert time.monotonic() - started >= 0.5
    assert proxy.log[0].fault_applied and proxy.log[0].complete


def test_a_stall_holds_up_the_client_only_not_a_single_threaded_server(gcs_backend, fault_proxy):
    big = random.Random(3).randbytes(8 * 1024 * 1024)  # more than the socket buffers hold
    gcs_backend.put("big.bin", big)
    gcs_backend.put("small.bin", b"small")
    proxy, proxied = fault_proxy(gcs_backend)
    proxy.add(Stall(seconds=60, after_bytes=1000), path="big.bin")
    stalled = connect(proxy)
    object_name = quote(f"{gcs_backend.prefix}/big.bin", safe="")
    stalled.request("GET", f"/download/storage/v1/b/{servers.BUCKET}/o/{object_name}?alt=media")
    assert stalled.getresponse().status == 200

    started = time.monotonic()
    assert proxied.filesystem().cat_file(proxied.url("small.bin")) == b"small"
    assert time.monotonic() - started < 20  # not the 60 s of the stall
    assert proxy.requests(path="big.bin")[0].body_bytes == 1000


def test_delay_holds_the_request_then_forwards_it(served):
    proxy, blob, _ = served
    proxy.add(Delay(0.5))
    started = time.monotonic()
    assert get(connect(proxy), blob) == (200, DATA)
    assert time.monotonic() - started >= 0.5


def test_flip_changes_exactly_one_byte(served):
    proxy, blob, _ = served
    proxy.add(Flip(offset=123_457))
    status, body = get(connect(proxy), blob)
    assert status == 200 and len(body) == len(DATA)
    differing = [i for i, (a, b) in enumerate(zip(body, DATA, strict=True)) if a != b]
    assert differing == [123_457]
    assert body[123_457] == DATA[123_457] ^ 0xFF


def test_flip_offset_counts_from_the_start_of_a_ranged_body(served):
    proxy, blob, _ = served
    proxy.add(Flip(offset=0), has_range=True)
    status, body = get(connect(proxy), blob, {"Range": "bytes=10-19"})
    assert status == 206
    assert body == bytes([DATA[10] ^ 0xFF]) + DATA[11:20]


def test_rules_match_on_method_path_and_range_and_expire_after_their_times(served):
    proxy, blob, other = served
    proxy.set_plan(
        [
            Rule(Match(method="GET", path="other", has_range=False), Status(503), times=2),
            Rule(Match(has_range=True), Status(429), times=None),
        ]
    )
    conn = connect(proxy)
    statuses = [
        get(conn, other)[0],
        get(conn, blob)[0],
        get(conn, other, {"Range": "bytes=0-1"})[0],
        get(conn, other)[0],
        get(conn, other)[0],
        get(conn, blob, {"Range": "bytes=0-1"})[0],
    ]
    assert statuses == [503, 200, 429, 503, 200, 429]
    assert [rule.action for rule in proxy.plan] == [Status(429)]
    assert len(proxy.requests(method="GET", path="other")) == 4


def test_rules_match_on_the_range_asked_for_also_in_azure_s_header(served):
    proxy, blob, _ = served
    proxy.add(Status(503), range="bytes=100-", times=None)
    conn = connect(proxy)
    statuses = [
        get(conn, blob, {"Range": "bytes=0-99"})[0],
        get(conn, blob, {"Range": "bytes=100-199"})[0],
        get(conn, blob, {"x-ms-range": "bytes=100-199"})[0],
        get(conn, blob, {"x-ms-range": "bytes=200-299"})[0],
    ]
    assert statuses == [206, 503, 503, 200]  # nginx itself ignores x-ms-range
    assert [entry.range for entry in proxy.log][2:] == ["bytes=100-199", "bytes=200-299"]


def test_a_rule_applies_at_least_once_or_always():
    with pytest.raises(ValueError, match="times"):
        Rule(Match(), Status(503), times=0)


def test_chunked_response_faults_count_payload_bytes(http_backend, fault_proxy):
    for index in range(50):
        http_backend.put(f"listing/file-{index:03d}.bin", b"x")
    proxy, proxied = fault_proxy(http_backend)
    listing = urlsplit(proxied.url("listing/")).path
    plain = requests.get(f"{proxy.url}{listing}", timeout=TIMEOUT)
    assert plain.headers["Transfer-Encoding"] == "chunked"

    proxy.add(Flip(offset=5))
    flipped = requests.get(f"{proxy.url}{listing}", timeout=TIMEOUT).content
    assert len(flipped) == len(plain.content)
    assert [i for i in range(len(flipped)) if flipped[i] != plain.content[i]] == [5]

    proxy.add(Cut(after_bytes=100))
    with pytest.raises(requests.exceptions.ChunkedEncodingError):
        requests.get(f"{proxy.url}{listing}", timeout=TIMEOUT)
    assert proxy.log[-1].body_bytes == 100
    assert proxy.log[0].body_bytes == len(plain.content)


def test_chunked_request_body_is_relayed_whole(served):
    proxy, blob, _ = served
    conn = connect(proxy)
    conn.request("POST", blob, body=iter([b"a" * 1000, b"b" * 10]), encode_chunked=True)
    response = conn.getresponse()
    response.read()
    assert response.status == 405  # nginx refuses POST to a static file, after reading the body
    assert get(conn, blob) == (200, DATA), "the body's framing was relayed exactly"


def test_expect_100_continue_gets_continue_before_the_body_is_sent(served):
    proxy, _, _ = served
    with socket.create_connection(proxy.address, timeout=TIMEOUT) as sock:
        sock.sendall(
            b"PUT /upload.bin HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
            b"Expect: 100-continue\r\n\r\n"
        )
        assert sock.recv(1024).startswith(b"HTTP/1.1 100 Continue")
        sock.sendall(b"hello")
        final = sock.recv(4096)
    assert final.startswith(b"HTTP/1.1 405")
    assert "expect" in proxy.log[0].headers


class _UnframedHandler(http.server.BaseHTTPRequestHandler):
    """Answers HTTP/1.0-style: no Content-Length, the body ends when the connection does."""

    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(DATA)

    def log_message(self, *args):
        pass


@pytest.fixture
def unframed_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _UnframedHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[:2]
    server.shutdown()
    server.server_close()


def test_response_without_length_is_read_to_close(unframed_server):
    with FaultProxy(unframed_server) as proxy:
        assert get(connect(proxy), "/anything") == (200, DATA)
        proxy.add(Flip(offset=len(DATA) - 1))
        body = get(connect(proxy), "/anything")[1]
        assert body == DATA[:-1] + bytes([DATA[-1] ^ 0xFF])
        assert [entry.complete for entry in proxy.log] == [True, True]


def test_bandwidth_limit_slows_bodies_down(http_backend, fault_proxy):
    http_backend.put("big.bin", DATA)
    proxy, proxied = fault_proxy(http_backend, bandwidth=400_000)
    started = time.monotonic()
    assert requests.get(proxied.url("big.bin"), timeout=TIMEOUT).content == DATA
    assert time.monotonic() - started >= 0.4  # 200 kB at 400 kB/s


def test_latency_is_added_to_every_request(http_backend, fault_proxy):
    http_backend.put("small.bin", b"small")
    proxy, proxied = fault_proxy(http_backend, latency=0.2)
    with requests.Session() as session:
        started = time.monotonic()
        for _ in range(3):
            assert session.get(proxied.url("small.bin"), timeout=TIMEOUT).content == b"small"
    assert time.monotonic() - started >= 0.6


def test_close_drops_open_connections(http_backend):
    http_backend.put("blob.bin", DATA)
    proxy = FaultProxy(http_backend.address())
    proxy.add(Stall(seconds=60))
    conn = connect(proxy)
    conn.request("GET", urlsplit(http_backend.url("blob.bin")).path)
    response = conn.getresponse()
    started = time.monotonic()
    proxy.close()
    assert time.monotonic() - started < 10
    with pytest.raises((http.client.IncompleteRead, ConnectionError)):
        response.read()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(proxy.address, timeout=TIMEOUT)
