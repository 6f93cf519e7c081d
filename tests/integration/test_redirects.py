"""A redirect to another origin carries no credential and no custom header (issue 22):
through the fsspec http backend (aiohttp) and obstore, against a real redirecting HTTP
server (two origins: two ports of loopback)."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator

import pytest

from tests.wds_filesystem import wds_filesystem

BODY = b"the bytes behind the redirect " * 100
SECRETS = {"X-Api-Key": "k-123", "x-amz-security-token": "t-456", "Authorization": "Bearer b-7"}


class _Origin:
    """One origin: records every request's headers; ``/to-other/...`` redirects (307, or
    302 under ``/to-other-302/``) to the other origin, ``/to-self/...`` to its own
    ``/data/...``; anything else is the body."""

    def __init__(self) -> None:
        self.seen: list[dict[str, str]] = []
        self.other: _Origin | None = None
        origin = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                origin.seen.append({k.lower(): v for k, v in self.headers.items()})
                name = self.path.split("/", 2)[-1]
                if self.path.startswith("/to-other"):
                    status = 302 if self.path.startswith("/to-other-302/") else 307
                    self._redirect(status, f"{origin.other.url}/data/{name}")
                elif self.path.startswith("/to-self/"):
                    self._redirect(307, f"/data/{name}")
                else:
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(BODY)))
                    self.send_header("ETag", '"v1"')
                    self.end_headers()
                    if self.command == "GET":
                        self.wfile.write(BODY)

            do_HEAD = do_GET

            def _redirect(self, status: int, location: str) -> None:
                self.send_response(status)
                self.send_header("Location", location)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def secrets_seen(self) -> set[str]:
        return {name for headers in self.seen for name in SECRETS if name.lower() in headers}


@pytest.fixture
def origins() -> Iterator[tuple[_Origin, _Origin]]:
    first, second = _Origin(), _Origin()
    first.other, second.other = second, first
    yield first, second
    for origin in (first, second):
        origin.server.shutdown()
        origin.server.server_close()


@pytest.mark.parametrize("path", ["to-other/x.bin", "to-other-302/x.bin"])
def test_the_fsspec_backend_sends_no_secret_header_to_another_origin(origins, tmp_path, path):
    asked, other = origins
    fs = wds_filesystem(
        "http", {"headers": SECRETS}, cache_dir=tmp_path / "cache", transport="fsspec", retries=2
    )
    assert fs.cat_file(f"{asked.url}/{path}") == BODY
    assert asked.secrets_seen() == set(SECRETS)  # the origin asked gets them
    assert other.seen and other.secrets_seen() == set()
    assert all(headers.get("range", "bytes=0-").startswith("bytes=") for headers in other.seen)


def test_a_redirect_within_the_origin_keeps_the_headers(origins, tmp_path):
    asked, other = origins
    fs = wds_filesystem(
        "http",
        {"headers": {"X-Api-Key": "k-123"}},
        cache_dir=tmp_path / "cache",
        transport="fsspec",
        retries=2,
    )
    assert fs.cat_file(f"{asked.url}/to-self/x.bin") == BODY
    data_requests = [h for h in asked.seen if h.get("x-api-key") == "k-123"]
    assert len(data_requests) == len(asked.seen) >= 2 and not other.seen


def test_obstore_is_not_given_a_header_it_would_carry_to_another_origin(origins, tmp_path):
    pytest.importorskip("obstore")
    asked, other = origins
    with pytest.raises(ValueError, match="headers.X-Api-Key"):
        wds_filesystem(
            "http",
            {"headers": SECRETS},
            cache_dir=tmp_path / "cache",
            transport="obstore",
            retries=2,
        ).cat_file(f"{asked.url}/to-other/x.bin")
    fs = wds_filesystem(
        "http", {"headers": SECRETS}, cache_dir=tmp_path / "cache", transport="auto", retries=2
    )  # served by the fsspec backend instead
    assert fs.cat_file(f"{asked.url}/to-other/x.bin") == BODY
    assert other.seen and other.secrets_seen() == set()


def test_obstore_drops_authorization_at_another_origin(origins, tmp_path):
    pytest.importorskip("obstore")
    asked, other = origins
    fs = wds_filesystem(
        "http",
        {"headers": {"Authorization": SECRETS["Authorization"]}},
        cache_dir=tmp_path / "cache",
        transport="obstore",
        retries=2,
    )
    assert fs.cat_file(f"{asked.url}/to-other/x.bin") == BODY
    assert "authorization" in asked.seen[-1]
    assert other.seen and other.secrets_seen() == set()
