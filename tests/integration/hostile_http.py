"""A small HTTP server that misbehaves by plan, where no real server can be made to.

It serves objects from memory with Range support (an object stored as `get?key=a` is named
by its query too; others ignore the query, as signed URLs need), and, per object, follows
a plan: an
ordered list of actions, one taken by each GET of that object (HEAD requests take their
own plan, `head_plan`: `Hold`, `Refuse` and `OtherVersion` there). Actions:
`Hold(seconds, then)` (the answer is held that long, then `then` is taken), `Refuse(status)`
(an empty answer with that status), `Pass()`, `Replace(data)` (the object is replaced,
then this GET is served),
`WrongStart(shift)` (a 206 for bytes `shift` further on than asked, with an honest
Content-Range), `OtherVersion(data, ...)` (this GET is answered from other bytes, as a
stale replica would, ignoring `If-Match`: with no ETag or Last-Modified, or with the other
version's), `ShortLabel(labelled)` (a 206 whose Content-Range labels fewer bytes than
its body, the rest zeros), `Cut(after_bytes)` (the connection closes mid-body), `WholeBody()` (a 200
with the whole object to a range request), `Trickle(piece, every, pieces)` (a few bytes at a
time, then a stall until the client gives up).

`identity=False` makes it a server that says nothing about versions: no ETag, no
Last-Modified. With `identity=True` each version has an ETag and a Last-Modified, and
`If-Match` is honoured (412 for another version). `identity_on_get=False`: only HEAD
answers say which version (GETs carry no ETag or Last-Modified and ignore `If-Match`).
Every request is logged, with when it arrived.
"""

from __future__ import annotations

import dataclasses
import email.utils
import http.server
import re
import socket
import threading
import time

from tests.faults import Cut, Pass, Replace, WholeBody
from tests.integration.servers import _quiet_about_vanished_clients

_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")


@dataclasses.dataclass(frozen=True)
class Hold:
    """Hold the answer `seconds`, then take action `then` (by default: serve as asked)."""

    seconds: float
    then: object = dataclasses.field(default_factory=Pass)


@dataclasses.dataclass(frozen=True)
class Refuse:
    """Answer with `status` and no body (404: not there; 403: forbidden); with `ranged`
    False, a request with a Range header is served as asked (only a stat is refused)."""

    status: int
    ranged: bool = True


@dataclasses.dataclass(frozen=True)
class WrongStart:
    """Answer a range request with the bytes `shift` further on, labelled as such."""

    shift: int


@dataclasses.dataclass(frozen=True)
class OtherVersion:
    """Answer this GET from `data` (another version, the object unchanged), ignoring
    `If-Match`; the answer carries that version's ETag only with `etag`, its Last-Modified
    only with `modified`; with `cut`, the connection closes after that many body bytes."""

    data: bytes = dataclasses.field(repr=False)
    etag: bool = False
    modified: bool = False
    cut: int | None = None


@dataclasses.dataclass(frozen=True)
class ShortLabel:
    """Answer a range request with a 206 whose Content-Range labels only its first
    `labelled` bytes; the rest of the body (as long as asked) is zeros."""

    labelled: int


@dataclasses.dataclass(frozen=True)
class Trickle:
    """Send `piece` bytes every `every` seconds, `pieces` times, then nothing for `stall`
    seconds (the client gives up first), then close."""

    piece: int
    every: float
    pieces: int
    stall: float = 30.0


@dataclasses.dataclass(frozen=True)
class Logged:
    method: str
    path: str
    range: str | None
    if_match: str | None
    status: int
    action: object = None
    """What the plan had this request do (None: served as asked); requests that arrive
    together reach the log in either order, so a test finds its fault by this."""
    arrived: float = 0.0
    """When the request arrived (``time.monotonic``)."""


@dataclasses.dataclass
class _Object:
    data: bytes
    version: int


class HostileServer:
    """`HostileServer(identity=...)` listening on a free loopback port until `close()`."""

    def __init__(self, identity: bool = True, identity_on_get: bool = True) -> None:
        self.identity = identity
        self.identity_on_get = identity_on_get
        self.objects: dict[str, _Object] = {}
        self.plans: dict[str, list] = {}
        self.head_plans: dict[str, list] = {}
        self.log: list[Logged] = []
        self.lock = threading.Lock()
        server = self

        class Handler(_Handler):
            hostile = server

        self._httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._httpd.handle_error = _quiet_about_vanished_clients(self._httpd.handle_error)
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()

    @property
    def address(self) -> tuple[str, int]:
        """(host, port) it listens on (e.g. for a FaultProxy in front)."""
        host, port = self._httpd.server_address[:2]
        return host, port

    def url(self, path: str) -> str:
        host, port = self.address
        return f"http://{host}:{port}/{path.lstrip('/')}"

    def put(
        self, path: str, data: bytes, plan: list | None = None, head_plan: list | None = None
    ) -> str:
        """Store `data` at `path` (a new version) with the plan for its next GETs (and
        `head_plan` for its next HEADs)."""
        with self.lock:
            previous = self.objects.get("/" + path.lstrip("/"))
            version = previous.version + 1 if previous else 1
            self.objects["/" + path.lstrip("/")] = _Object(data, version)
            self.plans["/" + path.lstrip("/")] = list(plan or [])
            self.head_plans["/" + path.lstrip("/")] = list(head_plan or [])
        return self.url(path)

    def heads(self, path: str) -> list[Logged]:
        return [entry for entry in self.log if entry.method == "HEAD" and entry.path.endswith(path)]

    def gets(self, path: str) -> list[Logged]:
        return [entry for entry in self.log if entry.method == "GET" and entry.path.endswith(path)]

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self) -> HostileServer:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _take(self, target: str, method: str):
        """The object a request target names (path and query, else the path alone: a query
        may select content, or only sign the request), and the action the request takes."""
        with self.lock:
            path = target if target in self.objects else target.split("?", 1)[0]
            action = Pass()
            plans = self.plans if method == "GET" else self.head_plans
            if plans.get(path):
                action = plans[path].pop(0)
            if isinstance(action, Replace):
                previous = self.objects[path]
                self.objects[path] = _Object(action.data, previous.version + 1)
            return self.objects.get(path), action


class _Handler(http.server.BaseHTTPRequestHandler):
    hostile: HostileServer
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def do_HEAD(self) -> None:
        self._answer("HEAD")

    def do_GET(self) -> None:
        self._answer("GET")

    def _log(self, method: str, status: int, action: object = None) -> None:
        self.hostile.log.append(
            Logged(
                method,
                self.path,
                self.headers.get("Range"),
                self.headers.get("If-Match"),
                status,
                None if isinstance(action, Pass) else action,
                self._arrived,
            )
        )

    def _answer(self, method: str) -> None:
        self._arrived = time.monotonic()
        obj, action = self.hostile._take(self.path, method)
        if isinstance(action, Hold):
            time.sleep(action.seconds)
            action = action.then
        refused = isinstance(action, Refuse) and (action.ranged or not self.headers.get("Range"))
        status = action.status if refused else 404 if obj is None else None
        if status is not None:
            self._log(method, status, action)
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        etag = f'"v{obj.version}-{len(obj.data)}"'
        if_match = self.headers.get("If-Match")
        identity = self.hostile.identity and (method == "HEAD" or self.hostile.identity_on_get)
        other = isinstance(action, OtherVersion)
        if other:  # a replica of another version: its own identity, or none
            obj = _Object(action.data, 1000 + obj.version)
            etag = f'"v{obj.version}-{len(obj.data)}"'
        if identity and not other and if_match and if_match.strip() not in (etag, "*"):
            self._log(method, 412, action)
            self.send_response(412)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        data, status, first = obj.data, 200, 0
        match = _RANGE.match(self.headers.get("Range") or "")
        if match is not None and not isinstance(action, WholeBody):
            first = int(match.group(1))
            last = int(match.group(2)) if match.group(2) else len(data) - 1
            if isinstance(action, WrongStart):
                first, last = first + action.shift, last + action.shift
            last = min(last, len(data) - 1)
            status = 206
            body = data[first : last + 1]
        else:
            body = data
        self._log(method, status, action)
        self.send_response(status)
        label = len(body)
        if status == 206 and isinstance(action, ShortLabel):
            label = min(action.labelled, len(body))
            body = body[:label] + bytes(len(body) - label)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Accept-Ranges", "bytes")
        if status == 206:
            self.send_header("Content-Range", f"bytes {first}-{first + label - 1}/{len(data)}")
        if identity and (not other or action.etag):
            self.send_header("ETag", etag)
        if identity and (not other or action.modified):
            modified = 1_700_000_000 + obj.version  # one second per version
            self.send_header("Last-Modified", email.utils.formatdate(modified, usegmt=True))
        self.end_headers()
        if method == "HEAD":
            return
        if isinstance(action, Trickle):
            self._trickle(body, action)
            return
        cut = action.after_bytes if isinstance(action, Cut) else getattr(action, "cut", None)
        if cut is not None:
            self.wfile.write(body[:cut])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(2)
            return
        self.wfile.write(body)

    def _trickle(self, body: bytes, action: Trickle) -> None:
        try:
            for number in range(action.pieces):
                self.wfile.write(body[number * action.piece : (number + 1) * action.piece])
                self.wfile.flush()
                time.sleep(action.every)
            deadline = time.monotonic() + action.stall
            while time.monotonic() < deadline:  # until the client hangs up, or the stall ends
                self.connection.settimeout(0.1)
                try:
                    if self.connection.recv(1, socket.MSG_PEEK) == b"":
                        break
                except TimeoutError:
                    continue
        except OSError:
            pass  # the client gave up: what a trickle ends with
        self.close_connection = True
