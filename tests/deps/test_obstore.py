"""obstore's error text we read (``storage/deps/obstore.py``): real obstore errors against a
real HTTP server (a 503, a 206 of another range, a refused connection); these fail when
obstore words them otherwise."""

from __future__ import annotations

import http.server
import socket
import threading
from collections.abc import Iterator

import pytest

from fsspec_shards.storage.deps import obstore as deps

obstore = pytest.importorskip("obstore")


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path.endswith("/other-range"):
            self.send_response(206)
            self.send_header("Content-Range", "bytes 5-9/100")
            self.send_header("Content-Length", "5")
            self.end_headers()
            self.wfile.write(b"x" * 5)
            return
        self.send_response(503)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    served = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=served.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{served.server_port}/"
    served.shutdown()
    served.server_close()


def _store(url: str):
    from obstore.store import HTTPStore

    options = {"allow_http": True}
    return HTTPStore.from_url(url, client_options=options, retry_config={"max_retries": 0})


def _error_text(call) -> str:
    with pytest.raises(obstore.exceptions.BaseError) as raised:
        call()
    return str(raised.value)


def test_a_status_code_is_in_the_text(server):
    text = _error_text(lambda: obstore.get(_store(server), "x").bytes())
    assert int(deps.STATUS_RE.search(text).group(1)) == 503


def test_a_response_of_another_range_is_in_the_text(server):
    text = _error_text(lambda: obstore.get_range(_store(server), "other-range", start=0, end=5))
    assert deps.OTHER_RANGE_RE.search(text).groups() == ("0", "5", "5", "10")


def test_a_refused_connection_is_of_kind_connect():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    text = _error_text(lambda: obstore.get(_store(f"http://127.0.0.1:{port}/"), "x").bytes())
    assert deps.KIND_RE.search(text).group(1) == "Connect"
    assert deps.STATUS_RE.search(text) is None
