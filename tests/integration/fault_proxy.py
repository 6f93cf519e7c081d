"""A fault-injecting HTTP/1.1 proxy on loopback, for testing retries, resumes and checks.

`FaultProxy(("127.0.0.1", server_port))` listens on a free loopback port and relays each
client connection to the server over a connection of its own, request by request. It reads
enough HTTP to act per request (request line, headers, Content-Length or chunked bodies,
keep-alive, `Expect: 100-continue`, HEAD, bodies that end at close), and follows a plan:
an ordered list of `Rule(match, action, times)`. The first rule that matches a request and
has uses left decides what happens to it; unmatched requests pass untouched. Faults happen
only by plan, never by chance, so tests are deterministic.

Actions: `Pass()`, `Cut(after_bytes)`, `Reset(after_bytes=None)`, `Stall(seconds,
after_bytes=0)`, `Delay(seconds)`, `Flip(offset)`, `Status(code, retry_after=None)`.
Offsets count bytes of the response body (the payload, not chunk framing).

Every request is logged as an `Exchange` (method, path, Range, status, body bytes sent to
the client, the action and whether the fault took effect). A bandwidth limit and an added
latency make the proxy a slow link for benchmarks.
"""

from __future__ import annotations

import dataclasses
import logging
import socket
import struct
import threading
import time
from collections.abc import Iterable
from http import HTTPStatus
from typing import BinaryIO

from tests.faults import Cut, Delay, Flip, Pass, Reset, Stall, Status

log = logging.getLogger("fsspec_shards.tests.fault_proxy")

MAX_HEAD_BYTES = 256 * 1024
PIECE = 64 * 1024


class ProtocolError(Exception):
    """The peer sent something this proxy cannot parse as HTTP/1.x."""


# --------------------------------------------------------------------------- the plan


Action = Pass | Cut | Reset | Stall | Delay | Flip | Status


@dataclasses.dataclass(frozen=True)
class Match:
    """Which requests a rule applies to; None means "any"."""

    method: str | None = None
    path: str | None = None  # a substring of the request target (path and query)
    has_range: bool | None = None  # the request asks for a range (Range or x-ms-range)
    range: str | None = None  # a substring of that range header, e.g. "bytes=1048576-"

    def matches(self, request: Request) -> bool:
        if self.method is not None and request.method != self.method.upper():
            return False
        if self.path is not None and self.path not in request.target:
            return False
        requested = request.range()
        if self.has_range is not None and self.has_range != (requested is not None):
            return False
        return self.range is None or (requested is not None and self.range in requested)


@dataclasses.dataclass
class Rule:
    """Apply `action` to the next `times` requests that `match` (None: to all of them)."""

    match: Match
    action: Action
    times: int | None = 1

    def __post_init__(self) -> None:
        if self.times is not None and self.times < 1:
            raise ValueError(
                f"a rule applies at least once (times >= 1) or always (None), not {self.times}"
            )


@dataclasses.dataclass
class Exchange:
    """One request through the proxy, as the client experienced it."""

    connection: int
    method: str
    path: str
    range: str | None  # the Range (or x-ms-range) header of the request
    headers: dict[str, str]
    action: str = "pass"
    status: int | None = None
    body_bytes: int = 0  # response body bytes the proxy sent to the client
    fault_applied: bool = False  # the planned fault took effect (e.g. the body reached the offset)
    complete: bool = False  # the whole response reached the client


# --------------------------------------------------------------------------- HTTP parsing


@dataclasses.dataclass
class Request:
    method: str
    target: str
    version: str
    headers: list[tuple[str, str]]

    def header(self, name: str) -> str | None:
        return _header(self.headers, name)

    def range(self) -> str | None:
        """The byte range asked for: the Range header, or Azure's x-ms-range."""
        return self.header("range") or self.header("x-ms-range")


@dataclasses.dataclass
class Response:
    version: str
    status: int
    reason: str
    headers: list[tuple[str, str]]
    raw_head: bytes

    def header(self, name: str) -> str | None:
        return _header(self.headers, name)


def _header(headers: list[tuple[str, str]], name: str) -> str | None:
    name = name.lower()
    for key, value in headers:
        if key.lower() == name:
            return value
    return None


def _tokens(value: str | None) -> set[str]:
    return {token.strip().lower() for token in (value or "").split(",") if token.strip()}


def _keep_alive(version: str, connection_header: str | None) -> bool:
    tokens = _tokens(connection_header)
    if version == "HTTP/1.0":
        return "keep-alive" in tokens
    return "close" not in tokens


def _read_head(reader: BinaryIO) -> list[bytes] | None:
    """The lines of a message head, without line ends; None on a clean EOF before it."""
    lines: list[bytes] = []
    total = 0
    while True:
        line = reader.readline(MAX_HEAD_BYTES)
        if not line:
            if lines:
                raise ProtocolError("connection closed inside a message head")
            return None
        total += len(line)
        if total > MAX_HEAD_BYTES:
            raise ProtocolError("message head too large")
        stripped = line.rstrip(b"\r\n")
        if not stripped:
            if lines:
                return lines
            continue  # tolerate blank lines between messages
        lines.append(stripped)


def _parse_headers(lines: list[bytes]) -> list[tuple[str, str]]:
    headers = []
    for line in lines:
        name, sep, value = line.decode("latin-1").partition(":")
        if not sep:
            raise ProtocolError(f"bad header line {line[:80]!r}")
        headers.append((name.strip(), value.strip()))
    return headers


def read_request(reader: BinaryIO) -> Request | None:
    """The next request's line and headers (not its body); None when the client hung up."""
    lines = _read_head(reader)
    if lines is None:
        return None
    parts = lines[0].decode("latin-1").split()
    if len(parts) != 3:
        raise ProtocolError(f"bad request line {lines[0][:80]!r}")
    method, target, version = parts
    return Request(method.upper(), target, version, _parse_headers(lines[1:]))


def read_response(reader: BinaryIO) -> Response | None:
    """The next response's status line and headers (not its body); None if the server hung up."""
    lines = _read_head(reader)
    if lines is None:
        return None
    version, _, rest = lines[0].decode("latin-1").partition(" ")
    code, _, reason = rest.partition(" ")
    if not code.isdigit():
        raise ProtocolError(f"bad status line {lines[0][:80]!r}")
    raw = b"\r\n".join(lines) + b"\r\n\r\n"
    return Response(version, int(code), reason, _parse_headers(lines[1:]), raw)


def _request_head(request: Request) -> bytes:
    lines = [f"{request.method} {request.target} {request.version}"]
    lines += [f"{name}: {value}" for name, value in request.headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _content_length(headers: list[tuple[str, str]]) -> int | None:
    value = _header(headers, "content-length")
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise ProtocolError(f"bad Content-Length {value!r}") from None


def _is_chunked(headers: list[tuple[str, str]]) -> bool:
    return "chunked" in _tokens(_header(headers, "transfer-encoding"))


def _has_body(request: Request, response: Response) -> bool:
    return request.method != "HEAD" and response.status not in (204, 304)


def _relay_request_body(reader: BinaryIO, headers: list[tuple[str, str]], send) -> None:
    """Copy a request body verbatim from `reader` to `send` (None: read and drop it)."""
    sink = send or (lambda data: None)
    if _is_chunked(headers):
        while True:
            size_line = reader.readline(MAX_HEAD_BYTES)
            if not size_line:
                raise ProtocolError("connection closed inside a chunked request body")
            sink(size_line)
            size = int(size_line.split(b";")[0].strip() or b"0", 16)
            if size == 0:
                break
            _copy_exact(reader, size + 2, sink)
        while True:  # trailers, up to the blank line
            line = reader.readline(MAX_HEAD_BYTES)
            if not line:
                raise ProtocolError("connection closed inside chunked trailers")
            sink(line)
            if line in (b"\r\n", b"\n"):
                return
    _copy_exact(reader, _content_length(headers) or 0, sink)


def _copy_exact(reader: BinaryIO, count: int, sink) -> None:
    while count > 0:
        data = reader.read1(min(count, PIECE))
        if not data:
            raise ProtocolError(f"connection closed with {count} body bytes still to come")
        sink(data)
        count -= len(data)


# --------------------------------------------------------------------------- the proxy


class _Throttle:
    """A token bucket shared by all connections of one proxy: `rate` bytes per second.

    Time lost to oversleeping is made up within `BURST` seconds, so the average rate holds.
    """

    BURST = 0.05

    def __init__(self, rate: float, stopped: threading.Event):
        self.rate = rate
        self.piece = int(min(PIECE, max(1024, rate / 100)))  # about 10 ms of transfer
        self._stopped = stopped
        self._lock = threading.Lock()
        self._next_free = time.monotonic()

    def wait(self, count: int) -> None:
        with self._lock:
            now = time.monotonic()
            start = max(self._next_free, now - self.BURST)
            self._next_free = start + count / self.rate
            pause = self._next_free - now
        if pause > 0:
            self._stopped.wait(pause)


class FaultProxy:
    """A loopback HTTP proxy in front of `upstream` that injects faults by plan.

    `bandwidth` (bytes/s, shared by all connections) slows response bodies; `latency`
    (seconds) is added before each request is forwarded. Use as a context manager or call
    `close()`.
    """

    def __init__(
        self,
        upstream: tuple[str, int],
        *,
        bandwidth: float | None = None,
        latency: float = 0.0,
        upstream_timeout: float = 120.0,
        host: str = "127.0.0.1",
    ):
        self.upstream = upstream
        self.latency = latency
        self.upstream_timeout = upstream_timeout
        self._stopped = threading.Event()
        self._throttle = _Throttle(bandwidth, self._stopped) if bandwidth else None
        self._lock = threading.Lock()
        self._rules: list[Rule] = []
        self._log: list[Exchange] = []
        self._sockets: set[socket.socket] = set()
        self._threads: set[threading.Thread] = set()
        self._connection_ids = 0
        self._listener = socket.create_server((host, 0))
        self._listener.settimeout(0.2)
        self.host, self.port = self._listener.getsockname()[:2]
        self._acceptor = threading.Thread(
            target=self._accept_loop, name=f"fault-proxy-{self.port}", daemon=True
        )
        self._acceptor.start()
        log.debug("fault proxy %s -> %s:%d", self.url, *upstream)

    # ---- public surface

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def address(self) -> tuple[str, int]:
        return self.host, self.port

    def add(
        self,
        action: Action,
        *,
        method: str | None = None,
        path: str | None = None,
        has_range: bool | None = None,
        range: str | None = None,
        times: int | None = 1,
    ) -> Rule:
        """Append a rule to the plan and return it (the arguments are those of `Match`)."""
        rule = Rule(Match(method, path, has_range, range), action, times)
        with self._lock:
            self._rules.append(rule)
        return rule

    def set_plan(self, rules: Iterable[Rule]) -> None:
        """Replace the whole plan."""
        with self._lock:
            self._rules = list(rules)

    @property
    def plan(self) -> list[Rule]:
        """The rules that still have uses left."""
        with self._lock:
            return list(self._rules)

    @property
    def log(self) -> list[Exchange]:
        """Every request so far, in the order they arrived."""
        with self._lock:
            return list(self._log)

    def requests(self, method: str | None = None, path: str | None = None) -> list[Exchange]:
        """Logged requests with this method and/or containing `path` in their target."""
        return [
            entry
            for entry in self.log
            if (method is None or entry.method == method.upper())
            and (path is None or path in entry.path)
        ]

    def bytes_sent(self, path: str | None = None) -> int:
        """Response body bytes sent to clients, for requests whose target contains `path`."""
        return sum(entry.body_bytes for entry in self.requests(path=path))

    def clear_log(self) -> None:
        with self._lock:
            self._log.clear()

    def close(self) -> None:
        """Stop accepting, drop every open connection and wait for the worker threads."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        self._acceptor.join(timeout=5)
        self._listener.close()
        with self._lock:
            sockets = list(self._sockets)
            threads = list(self._threads)
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for thread in threads:
            thread.join(timeout=5)

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    # ---- internals used by connections

    def _take_action(self, request: Request) -> Action:
        with self._lock:
            for rule in self._rules:
                if rule.match.matches(request):
                    if rule.times is not None:
                        rule.times -= 1
                        if rule.times <= 0:
                            self._rules.remove(rule)
                    return rule.action
        return Pass()

    def _record(self, entry: Exchange) -> None:
        with self._lock:
            self._log.append(entry)

    def _track(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.add(sock)

    def _untrack(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.discard(sock)

    def _send(self, sock: socket.socket, data: bytes, throttled: bool = False) -> None:
        view = memoryview(data)
        while view:
            piece = view[: PIECE if self._throttle is None else self._throttle.piece]
            if throttled and self._throttle is not None:
                self._throttle.wait(len(piece))
            if self._stopped.is_set():
                raise ConnectionAbortedError("fault proxy closed")
            sock.sendall(piece)
            view = view[len(piece) :]

    def _pause(self, seconds: float) -> None:
        """Sleep, unless the proxy closes meanwhile: then end the connection at once."""
        if self._stopped.wait(seconds):
            raise ConnectionAbortedError("fault proxy closed")

    def _accept_loop(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            client.settimeout(None)
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._connection_ids += 1
                connection = _Connection(self, client, self._connection_ids)
                thread = threading.Thread(
                    target=connection.run, name=f"fault-proxy-conn-{self._connection_ids}"
                )
                thread.daemon = True
                self._threads.add(thread)
                self._sockets.add(client)
            thread.start()


class _Connection:
    """One client connection and its paired upstream connection, request by request.

    The pair lives and dies together: when the server closes its side, the client's is
    closed too, so the client sees what it would have seen talking to the server.
    """

    def __init__(self, proxy: FaultProxy, client: socket.socket, number: int):
        self.proxy = proxy
        self.number = number
        self.client = client
        self.client_reader = client.makefile("rb")
        self.upstream: socket.socket | None = None
        self.upstream_reader: BinaryIO | None = None

    def run(self) -> None:
        try:
            while not self.proxy._stopped.is_set():
                request = read_request(self.client_reader)
                if request is None or not self.exchange(request):
                    break
        except (OSError, ProtocolError, ValueError) as error:
            log.debug("fault proxy connection %d ended: %r", self.number, error)
        finally:
            self.close_upstream()
            self.close_client()
            with self.proxy._lock:
                self.proxy._threads.discard(threading.current_thread())

    # ---- one request

    def exchange(self, request: Request) -> bool:
        """Handle one request; return whether the connection stays open for another."""
        action = self.proxy._take_action(request)
        entry = Exchange(
            connection=self.number,
            method=request.method,
            path=request.target,
            range=request.range(),
            headers={name.lower(): value for name, value in request.headers},
            action=str(action),
        )
        self.proxy._record(entry)
        client_keep_alive = _keep_alive(request.version, request.header("connection"))

        if isinstance(action, Reset) and action.after_bytes is None:
            entry.fault_applied = True
            self.reset_client()
            return False
        if "100-continue" in _tokens(request.header("expect")):
            request.headers = [(k, v) for k, v in request.headers if k.lower() != "expect"]
            self.client.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
        if self.proxy.latency:
            self.proxy._pause(self.proxy.latency)
        if isinstance(action, Status):
            _relay_request_body(self.client_reader, request.headers, None)
            return self.answer(request, action, entry) and client_keep_alive

        if isinstance(action, Delay):
            entry.fault_applied = True
            self.proxy._pause(action.seconds)

        upstream = self.connect_upstream()
        upstream.sendall(_request_head(request))
        _relay_request_body(self.client_reader, request.headers, upstream.sendall)

        response = read_response(self.upstream_reader)
        while response is not None and 100 <= response.status < 200:
            response = read_response(self.upstream_reader)  # our own 100 was sent already
        if response is None:
            log.debug("server closed connection %d without answering", self.number)
            return False
        entry.status = response.status
        # The log is updated before the bytes go out, so that a client that has read a whole
        # response always finds it logged as complete.
        entry.complete = not _has_body(request, response)
        recorded = None
        if isinstance(action, Stall):
            recorded = _Recorder()
            _, reusable = self.relay_response_body(request, response, recorded)
        self.client.sendall(response.raw_head)

        body = _BodyWriter(self, action, entry)
        if not body.start():
            return False
        if recorded is not None:
            completed = recorded.replay(body)
        else:
            completed, reusable = self.relay_response_body(request, response, body)
        server_keep_alive = _keep_alive(response.version, response.header("connection"))
        return completed and reusable and server_keep_alive and client_keep_alive

    def answer(self, request: Request, action: Status, entry: Exchange) -> bool:
        """Send the injected status response; the server never hears of the request."""
        body = b"" if request.method == "HEAD" else action.response_body()
        try:
            reason = HTTPStatus(action.code).phrase
        except ValueError:
            reason = "Injected"
        lines = [
            f"HTTP/1.1 {action.code} {reason}",
            "Content-Type: text/plain",
            f"Content-Length: {len(body)}",
        ]
        if action.retry_after is not None:
            seconds = action.retry_after
            lines.append(f"Retry-After: {int(seconds) if float(seconds).is_integer() else seconds}")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        self.client.sendall(head + body)
        entry.status = action.code
        entry.body_bytes = len(body)
        entry.fault_applied = True
        entry.complete = True
        return True

    def relay_response_body(
        self, request: Request, response: Response, body: _BodyWriter | _Recorder
    ) -> tuple[bool, bool]:
        """Send the response body to the client through `body`.

        Returns (the body reached the client whole, the connection can carry another request).
        """
        reader = self.upstream_reader
        if not _has_body(request, response):
            return True, True
        if _is_chunked(response.headers):
            while True:
                size_line = reader.readline(MAX_HEAD_BYTES)
                if not size_line:
                    raise ProtocolError("server closed inside a chunked response")
                size = int(size_line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    break
                body.framing(size_line)
                if not self.relay_exact(size, body, ends_body=False):
                    return False, False
                body.framing(self.read_exact(2))
            ending = [size_line]
            while ending[-1] not in (b"\r\n", b"\n"):  # trailers, up to the blank line
                line = reader.readline(MAX_HEAD_BYTES)
                if not line:
                    raise ProtocolError("server closed inside chunked trailers")
                ending.append(line)
            body.framing(b"".join(ending), ends_body=True)
            return True, True
        length = _content_length(response.headers)
        if length is None:  # the body runs until the server closes
            while data := reader.read1(PIECE):
                if not body.payload(data):
                    return False, False
            body.framing(b"", ends_body=True)
            return True, False
        completed = self.relay_exact(length, body, ends_body=True)
        return completed, completed

    def relay_exact(self, count: int, body: _BodyWriter | _Recorder, ends_body: bool) -> bool:
        while count > 0:
            data = self.upstream_reader.read1(min(count, PIECE))
            if not data:
                raise ProtocolError(f"server closed with {count} body bytes still to come")
            count -= len(data)
            if not body.payload(data, ends_body=ends_body and count == 0):
                return False
        return True

    def read_exact(self, count: int) -> bytes:
        data = self.upstream_reader.read(count)
        if len(data) != count:
            raise ProtocolError("server closed inside a chunk")
        return data

    # ---- sockets

    def connect_upstream(self) -> socket.socket:
        if self.upstream is None:
            self.upstream = socket.create_connection(
                self.proxy.upstream, timeout=self.proxy.upstream_timeout
            )
            self.upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.upstream_reader = self.upstream.makefile("rb")
            self.proxy._track(self.upstream)
        return self.upstream

    def close_upstream(self) -> None:
        if self.upstream is not None:
            self.proxy._untrack(self.upstream)
            self.upstream_reader.close()
            self.upstream.close()
            self.upstream = None
            self.upstream_reader = None

    def close_client(self) -> None:
        if self.client_reader is not None:
            self.client_reader.close()
            self.client_reader = None
            try:
                self.client.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self.client.close()
            self.proxy._untrack(self.client)

    def reset_client(self) -> None:
        """Close the client connection with an RST instead of a FIN."""
        self.client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.client_reader.close()
        self.client_reader = None
        self.client.close()
        self.proxy._untrack(self.client)


class _Recorder:
    """Takes a response body from the server whole, to be replayed to the client later.

    A stalled response is read this way, so that the stall holds up the client only, never
    the server (gcp-storage-emulator, for one, serves a single request at a time).
    """

    def __init__(self):
        self.parts: list[tuple[bool, bytes, bool]] = []  # (is payload, bytes, ends the body)

    def framing(self, raw: bytes, ends_body: bool = False) -> None:
        self.parts.append((False, raw, ends_body))

    def payload(self, data: bytes, ends_body: bool = False) -> bool:
        self.parts.append((True, data, ends_body))
        return True

    def replay(self, body: _BodyWriter) -> bool:
        """Send what was recorded through `body`; False if its fault ended the connection."""
        for is_payload, data, ends_body in self.parts:
            if not is_payload:
                body.framing(data, ends_body)
            elif not body.payload(data, ends_body):
                return False
        return True


class _BodyWriter:
    """Sends a response body to the client, applying the planned fault at its body offset."""

    def __init__(self, connection: _Connection, action: Action, entry: Exchange):
        self.connection = connection
        self.proxy = connection.proxy
        self.action = action
        self.entry = entry
        self.sent = 0
        self.stalled = False

    def _stop_offset(self) -> int | None:
        if isinstance(self.action, Cut):
            return self.action.after_bytes
        if isinstance(self.action, Reset):
            return self.action.after_bytes
        return None

    def start(self) -> bool:
        """Called after the headers went out: faults at body offset 0 happen here."""
        return self._at_boundary()

    def framing(self, raw: bytes, ends_body: bool = False) -> None:
        """Chunk sizes and trailers: sent as they are, not counted as body."""
        if ends_body:
            self.entry.complete = True
        self.proxy._send(self.connection.client, raw, throttled=True)

    def payload(self, data: bytes, ends_body: bool = False) -> bool:
        """Send body bytes (the last ones if `ends_body`); False if a fault ended the connection."""
        action = self.action
        if isinstance(action, Flip) and self.sent <= action.offset < self.sent + len(data):
            index = action.offset - self.sent
            data = data[:index] + bytes([data[index] ^ 0xFF]) + data[index + 1 :]
            self.entry.fault_applied = True
        while data:
            limit = self._next_boundary()
            if limit is None or self.sent + len(data) <= limit:
                self.entry.complete = ends_body
                self._deliver(data)
                return True
            head, data = data[: limit - self.sent], data[limit - self.sent :]
            self._deliver(head)
            if not self._at_boundary():
                return False
        return True

    def _next_boundary(self) -> int | None:
        stop = self._stop_offset()
        if stop is not None:
            return stop
        if isinstance(self.action, Stall) and not self.stalled:
            return self.action.after_bytes
        return None

    def _at_boundary(self) -> bool:
        """Apply the fault planned at the current offset, if any; False ends the connection."""
        stop = self._stop_offset()
        if stop is not None and self.sent >= stop:
            self.entry.fault_applied = True
            if isinstance(self.action, Reset):
                self.connection.reset_client()
            else:
                self.connection.close_client()
            return False
        stall = self.action if isinstance(self.action, Stall) else None
        if stall is not None and not self.stalled and self.sent >= stall.after_bytes:
            self.stalled = True
            self.entry.fault_applied = True
            self.proxy._pause(stall.seconds)
        return True

    def _deliver(self, data: bytes) -> None:
        self.sent += len(data)
        self.entry.body_bytes = self.sent
        self.proxy._send(self.connection.client, data, throttled=True)
