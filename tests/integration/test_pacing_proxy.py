"""benchmarks/pacing_proxy.py's request log: what timeline_first_batch.py reads."""

from __future__ import annotations

import http.client
import http.server
import importlib.util
import json
import sys
import threading
import time
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "pacing_proxy", Path(__file__).resolve().parents[2] / "benchmarks" / "pacing_proxy.py"
)
pacing_proxy = sys.modules.setdefault("pacing_proxy", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(pacing_proxy)

BODY = bytes(range(256)) * 64


class _Handler(http.server.BaseHTTPRequestHandler):
    """Answers every GET with BODY, or the byte range asked for (keep-alive)."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802 - the http.server name
        asked = self.headers.get("Range")
        body, status = BODY, 200
        if asked:
            first, last = asked.split("=", 1)[1].split("-")
            body, status = BODY[int(first) : int(last) + 1], 206
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd.server_address
    httpd.shutdown()
    httpd.server_close()


def test_the_log_has_each_connection_request_and_answer_in_order(server, tmp_path):
    log = tmp_path / "requests.jsonl"
    pacing = pacing_proxy.Pacing(rate=None, connect_latency=0.0, request_latency=0.0)
    proxy = pacing_proxy.PacingProxy(server, pacing, log=str(log)).start()
    try:
        connection = http.client.HTTPConnection(proxy.host, proxy.port, timeout=30)
        connection.request("GET", "/whole")
        assert connection.getresponse().read() == BODY
        connection.request("GET", "/part", headers={"Range": "bytes=10-19"})
        assert connection.getresponse().read() == BODY[10:20]
        connection.close()  # the last answer is logged once the server closes too
        deadline = time.monotonic() + 30
        while log.read_text().count("answered") < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        proxy.stop()
    events = [json.loads(line) for line in log.read_text().splitlines()]
    assert [event[1:] for event in events] == [
        [0, "accept"],
        [0, "request", "GET /whole HTTP/1.1", ""],
        [0, "answer", "HTTP/1.1 200 OK"],
        [0, "answered", events[3][3]],
        [0, "request", "GET /part HTTP/1.1", "Range: bytes=10-19"],
        [0, "answer", "HTTP/1.1 206 Partial Content"],
        [0, "answered", events[6][3]],
    ]
    assert events[3][3] > len(BODY) > events[6][3] > 10  # the headers' bytes, and the body's
    times = [event[0] for event in events]
    assert times == sorted(times)


def test_without_a_log_nothing_is_written(server, tmp_path):
    pacing = pacing_proxy.Pacing(rate=None, connect_latency=0.0, request_latency=0.0)
    proxy = pacing_proxy.PacingProxy(server, pacing).start()
    try:
        connection = http.client.HTTPConnection(proxy.host, proxy.port, timeout=30)
        connection.request("GET", "/whole")
        assert connection.getresponse().read() == BODY
        connection.close()
    finally:
        proxy.stop()
    assert list(tmp_path.iterdir()) == []
