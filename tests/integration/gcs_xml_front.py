"""A loopback front for gcp-storage-emulator that answers obstore's GCS reads.

obstore reads GCS through the XML API (``GET``/``HEAD /{bucket}/{object}``, with the path
percent-encoded, ``-`` included) and requires ``ETag`` and ``Last-Modified`` on every answer,
as real GCS sends them. gcp-storage-emulator matches only unencoded paths, answers no HEAD
and sends neither header, so obstore cannot read from it directly. This front decodes the
path, takes size, ETag, generation and update time from the emulator's JSON API, adds them
as the headers real GCS sends (``ETag``, ``Last-Modified``, ``x-goog-generation``), and
answers HEAD from the same metadata. Bodies and ranges come from the emulator unchanged.

Requests of the JSON API (``/storage/...``, ``/download/...``, ``/upload/...``: what gcsfs
sends for listing, ``info``, downloads and uploads) are relayed to the emulator unchanged,
so one endpoint serves both gcsfs and obstore, as real GCS does.

Like the emulator, the front ignores conditional headers (If-Match, ...): a version check
through it rests on comparing the headers of the answer.
"""

from __future__ import annotations

import email.utils
import http.server
import json
import threading
import urllib.error
import urllib.request
from datetime import datetime
from urllib.parse import quote, unquote, urlsplit

PIECE = 256 * 1024
_JSON_API = ("/storage/", "/download/", "/upload/", "/batch/")
_NOT_RELAYED = {"host", "connection", "keep-alive", "transfer-encoding", "content-length"}


class GcsXmlFront:
    """An HTTP server on a free loopback port in front of the emulator at ``emulator_url``."""

    def __init__(self, emulator_url: str, host: str = "127.0.0.1") -> None:
        self.emulator_url = emulator_url.rstrip("/")
        handler = type("Handler", (_Handler,), {"emulator_url": self.emulator_url})
        self._server = http.server.ThreadingHTTPServer((host, 0), handler)
        self._server.daemon_threads = True
        self.host, self.port = self._server.server_address[:2]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def address(self) -> tuple[str, int]:
        return self.host, self.port

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def __enter__(self) -> GcsXmlFront:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    emulator_url = ""

    def log_message(self, format: str, *args) -> None:
        """Quiet: tests read the fault proxy's log instead."""

    def _object(self) -> tuple[str, str, str]:
        parts = urlsplit(self.path)
        bucket, _, name = unquote(parts.path).lstrip("/").partition("/")
        return bucket, name, parts.query

    def _metadata(self, bucket: str, name: str) -> dict | None:
        url = f"{self.emulator_url}/storage/v1/b/{quote(bucket)}/o/{quote(name, safe='')}"
        try:
            with urllib.request.urlopen(url, timeout=60) as response:
                return json.load(response)
        except urllib.error.HTTPError as answer:
            if answer.code == 404:
                return None
            raise

    def _headers(self, meta: dict) -> None:
        updated = datetime.fromisoformat(meta["updated"].replace("Z", "+00:00"))
        self.send_header("ETag", f'"{meta["etag"]}"')
        self.send_header("Last-Modified", email.utils.format_datetime(updated, usegmt=True))
        self.send_header("x-goog-generation", str(meta["generation"]))

    def _not_found(self, bucket: str, name: str) -> None:
        body = f"<Error><Code>NoSuchKey</Code><Details>{bucket}/{name}</Details></Error>"
        self.send_response(404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body.encode())

    def _relay(self) -> None:
        """Pass a JSON-API request to the emulator and its answer back, unchanged."""
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        request = urllib.request.Request(
            self.emulator_url + self.path, data=body, method=self.command
        )
        for name, value in self.headers.items():
            if name.lower() not in _NOT_RELAYED:
                request.add_header(name, value)
        try:
            response = urllib.request.urlopen(request, timeout=60)
        except urllib.error.HTTPError as answer:
            response = answer
        with response:
            payload = response.read()
            self.send_response(response.status)
            for name, value in response.headers.items():
                if name.lower() not in _NOT_RELAYED:
                    self.send_header(name, value)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(payload)

    def _relayed(self) -> bool:
        if urlsplit(self.path).path.startswith(_JSON_API):
            self._relay()
            return True
        return False

    do_POST = do_PUT = do_PATCH = do_DELETE = _relay  # noqa: N815 (http.server's naming)

    def do_HEAD(self) -> None:  # noqa: N802 (http.server's naming)
        if self._relayed():
            return
        bucket, name, _ = self._object()
        meta = self._metadata(bucket, name)
        if meta is None:
            self._not_found(bucket, name)
            return
        self.send_response(200)
        self._headers(meta)
        self.send_header("Content-Length", str(meta["size"]))
        self.end_headers()

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        if self._relayed():
            return
        bucket, name, _ = self._object()
        meta = self._metadata(bucket, name)
        if meta is None:
            self._not_found(bucket, name)
            return
        request = urllib.request.Request(f"{self.emulator_url}/{bucket}/{quote(name)}")
        if self.headers.get("Range"):
            request.add_header("Range", self.headers["Range"])
        with urllib.request.urlopen(request, timeout=60) as response:
            self.send_response(response.status)
            self._headers(meta)
            if response.headers.get("Content-Range"):
                self.send_header("Content-Range", response.headers["Content-Range"])
            self.send_header("Content-Length", response.headers["Content-Length"])
            self.end_headers()
            while piece := response.read(PIECE):
                self.wfile.write(piece)
