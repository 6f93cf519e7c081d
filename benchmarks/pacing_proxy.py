"""A TCP proxy on loopback that makes a local server look like a far object store.

A real object store carries each connection at tens of MB/s (S3 and GCS: roughly
50-100 MB/s per stream) and every connection and request pays a round trip; loopback
carries GB/s at once. This proxy paces what flows from the server to the client on each
connection to ``rate`` bytes per second (a token bucket, so a burst is at most
``burst`` bytes), waits ``connect_latency`` seconds before it connects to the server
(the handshakes) and ``request_latency`` seconds before it forwards each request (the
first bytes the client sends after the server last answered: one request on a keep-alive
connection). ``total_rate`` caps all connections together (the link itself: a NIC, a
saturated path), where more streams cannot add rate.

It is bounded and stops by itself: at most ``max_connections`` connections at once
(more wait for the kernel's accept queue), one thread per direction of each, and as a
process (``python benchmarks/pacing_proxy.py`` or :func:`paced`) it exits when its parent
closes its stdin (or dies) or after ``--lifetime`` seconds.

Run it in a process of its own when the reader's CPU time is measured (:func:`paced`): in
the reader's process its threads would count as the reader's and share its GIL.

With ``log`` (``--log FILE``) it writes one JSON line per event, timed on
``time.perf_counter()`` (the system's monotonic clock, the same in every process on Linux):
``[t, connection, "accept"]``, ``[t, connection, "request", request line, Range header]``
when a request's first bytes arrive (before the request latency), ``[t, connection,
"answer", status line]`` at an answer's first bytes and ``[t, connection, "answered",
bytes]`` (headers included) when the next request begins or the server closes. A request
timeline of one read (``timeline_first_batch.py``) is these lines beside the reader's own
marks.

    python benchmarks/pacing_proxy.py --upstream 127.0.0.1:8080 --rate 25MB --latency 0.02
    # prints "listening 127.0.0.1:<port>" and proxies until stdin closes

    from pacing_proxy import paced
    with paced(("127.0.0.1", 8080), rate=25e6, latency=0.02) as proxy:
        url = f"http://{proxy.host}:{proxy.port}/object"
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import re
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

LOOPBACK = "127.0.0.1"
DEFAULT_RATE = 25e6  # bytes per second per connection
DEFAULT_LATENCY = 0.020  # seconds per connection and per request
_PIECE = 256 * 1024
_UNITS = {"": 1, "b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "kib": 1024, "mib": 1024**2}


def parse_rate(text: str | float) -> float:
    """Bytes per second from ``25MB``, ``100MiB``, ``2e7`` (per second implied)."""
    if isinstance(text, int | float):
        return float(text)
    match = re.fullmatch(r"\s*([0-9.e+]+)\s*([a-z]*?)(/s)?\s*", str(text).lower())
    if match is None or match.group(2) not in _UNITS:
        raise ValueError(f"not a rate: {text!r} (e.g. 25MB, 100MiB, 2.5e7)")
    return float(match.group(1)) * _UNITS[match.group(2)]


@dataclass(frozen=True)
class Pacing:
    """How one connection is slowed down (``rate`` None: not limited)."""

    rate: float | None = DEFAULT_RATE
    connect_latency: float = DEFAULT_LATENCY
    request_latency: float = DEFAULT_LATENCY
    burst: int = _PIECE
    total_rate: float | None = None  # all connections together (None: not limited)


class _Bucket:
    """Token bucket: :meth:`spend` waits until ``amount`` more bytes fit the rate."""

    def __init__(self, rate: float | None, burst: int) -> None:
        self.rate = rate
        self.burst = burst
        self.due = time.monotonic()  # when the bytes sent so far are paid for
        self._lock = threading.Lock()  # one bucket may be shared by every connection

    def spend(self, amount: int) -> None:
        if self.rate is None:
            return
        with self._lock:
            now = time.monotonic()
            # idle time earns at most one burst of credit
            self.due = max(self.due, now - self.burst / self.rate) + amount / self.rate
            wait = self.due - now
        if wait > 0:
            time.sleep(wait)


class PacingProxy:
    """Forwards connections on ``host:port`` to ``upstream``, paced by ``pacing``."""

    def __init__(
        self,
        upstream: tuple[str, int],
        pacing: Pacing = Pacing(),
        host: str = LOOPBACK,
        port: int = 0,
        max_connections: int = 64,
        log: str | None = None,
    ) -> None:
        self.upstream = upstream
        self.pacing = pacing
        self._link = _Bucket(pacing.total_rate, pacing.burst)
        self._listener = socket.create_server((host, port), backlog=128)
        self.host, self.port = self._listener.getsockname()[:2]
        self._slots = threading.BoundedSemaphore(max_connections)
        self._stopping = threading.Event()
        self._sockets: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._acceptor = threading.Thread(target=self._accept, name="pacing-accept", daemon=True)
        self.connections = 0  # accepted so far (benchmarks report it)
        self._log = open(log, "a", buffering=1) if log else None  # noqa: SIM115 - until stop()
        self._log_lock = threading.Lock()
        self._numbers = itertools.count()

    def _event(self, connection: int, *what: object) -> None:
        """One line of the request log (module docstring), if there is one (and it is not
        closed: a connection cut by :meth:`stop` may end after it)."""
        if self._log is None:
            return
        line = json.dumps([time.perf_counter(), connection, *what]) + "\n"
        with self._log_lock:
            if self._log is not None:
                self._log.write(line)

    def start(self) -> PacingProxy:
        self._acceptor.start()
        return self

    def stop(self) -> None:
        """Stop accepting and cut every open connection."""
        self._stopping.set()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept() (Linux)
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            for sock in list(self._sockets):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
        self._acceptor.join(timeout=5)
        with self._log_lock:
            if self._log is not None:
                self._log.close()
                self._log = None

    def __enter__(self) -> PacingProxy:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def _accept(self) -> None:
        while not self._stopping.is_set():
            self._slots.acquire()
            try:
                client, _ = self._listener.accept()
            except OSError:
                self._slots.release()
                return
            self.connections += 1
            threading.Thread(
                target=self._serve, args=(client,), name="pacing-conn", daemon=True
            ).start()

    def _track(self, sock: socket.socket, add: bool) -> None:
        with self._lock:
            (self._sockets.add if add else self._sockets.discard)(sock)

    def _serve(self, client: socket.socket) -> None:
        self._track(client, True)
        connection = next(self._numbers)
        self._event(connection, "accept")
        server = None
        try:
            time.sleep(self.pacing.connect_latency)
            server = socket.create_connection(self.upstream, timeout=30)
            server.settimeout(None)
            self._track(server, True)
            for sock in (client, server):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            answered = threading.Event()
            answered.set()  # the first bytes the client sends are a request
            tally = [0]  # bytes of the answer in flight (the log's "answered")
            upward = threading.Thread(
                target=self._requests,
                args=(client, server, answered, connection, tally),
                daemon=True,
            )
            upward.start()
            self._responses(server, client, answered, connection, tally)
            upward.join()
        except OSError:
            pass
        finally:
            for sock in (client, server):
                if sock is not None:
                    self._track(sock, False)
                    sock.close()
            self._slots.release()

    def _requests(
        self, client: socket.socket, server: socket.socket, answered, connection: int, tally
    ) -> None:
        """Client to server: each request (bytes after an answer) waits ``request_latency``."""
        buffer = bytearray(_PIECE)
        try:
            while True:
                size = client.recv_into(buffer)
                if not size:
                    break
                if answered.is_set():
                    answered.clear()
                    if self._log is not None:
                        if tally[0]:  # the answer before this request ended
                            self._event(connection, "answered", tally[0])
                            tally[0] = 0
                        self._event(connection, "request", *_request_of(buffer[:size]))
                    time.sleep(self.pacing.request_latency)
                server.sendall(memoryview(buffer)[:size])
        except OSError:
            pass
        with contextlib.suppress(OSError):
            server.shutdown(socket.SHUT_WR)

    def _responses(
        self, server: socket.socket, client: socket.socket, answered, connection: int, tally
    ) -> None:
        """Server to client, paced to ``rate``."""
        bucket = _Bucket(self.pacing.rate, self.pacing.burst)
        piece = self.pacing.burst
        buffer = bytearray(piece)
        try:
            while True:
                size = server.recv_into(buffer)
                if not size:
                    break
                if self._log is not None:
                    if not answered.is_set():  # a request came since: a new answer
                        self._event(connection, "answer", _status_of(buffer[:size]))
                    tally[0] += size
                answered.set()
                bucket.spend(size)
                self._link.spend(size)
                client.sendall(memoryview(buffer)[:size])
        except OSError:
            pass
        if tally[0]:
            self._event(connection, "answered", tally[0])
        with contextlib.suppress(OSError):
            client.shutdown(socket.SHUT_WR)


def _request_of(data: bytes | bytearray) -> tuple[str, str]:
    """The request line and Range header of a request's first bytes (for the log)."""
    lines = bytes(data).split(b"\r\n")
    ranges = [line for line in lines[1:] if line.lower().startswith(b"range:")]
    return lines[0].decode("latin-1"), ranges[0].decode("latin-1") if ranges else ""


def _status_of(data: bytes | bytearray) -> str:
    """An answer's status line (for the log)."""
    return bytes(data).split(b"\r\n", 1)[0].decode("latin-1")


@dataclass(frozen=True)
class Address:
    host: str
    port: int


@contextlib.contextmanager
def paced(
    upstream: tuple[str, int],
    rate: float | None = DEFAULT_RATE,
    latency: float = DEFAULT_LATENCY,
    request_latency: float | None = None,
    lifetime: float = 3600.0,
    total_rate: float | None = None,
    log: str | None = None,
) -> Iterator[Address]:
    """A :class:`PacingProxy` in a process of its own in front of ``upstream``; yields where
    it listens (``.host``, ``.port``: what ``servers.Backend.through`` takes); ``log``: a file
    for its request log (module docstring)."""
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--upstream",
        f"{upstream[0]}:{upstream[1]}",
        "--rate",
        "0" if rate is None else repr(float(rate)),
        "--latency",
        repr(latency),
        "--request-latency",
        repr(latency if request_latency is None else request_latency),
        "--lifetime",
        repr(lifetime),
        "--total-rate",
        "0" if total_rate is None else repr(float(total_rate)),
        *(["--log", log] if log else []),
    ]
    process = subprocess.Popen(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True
    )
    try:
        line = process.stdout.readline().decode().split()
        if len(line) != 2 or line[0] != "listening":
            raise RuntimeError(f"the pacing proxy did not start (exit {process.wait(10)})")
        host, port = line[1].rsplit(":", 1)
        yield Address(host, int(port))
    finally:
        process.stdin.close()  # the proxy's signal to stop
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream", required=True, help="host:port of the server")
    parser.add_argument("--port", type=int, default=0, help="where to listen (default: any)")
    parser.add_argument(
        "--rate", default="25MB", help="per connection, server to client (0: unlimited)"
    )
    parser.add_argument("--latency", type=float, default=DEFAULT_LATENCY, help="s per connection")
    parser.add_argument("--request-latency", type=float, default=None, help="s per request")
    parser.add_argument("--total-rate", default="0", help="all connections together (0: unlimited)")
    parser.add_argument("--max-connections", type=int, default=64)
    parser.add_argument("--log", default=None, help="write a request log here (JSON lines)")
    parser.add_argument("--lifetime", type=float, default=3600.0, help="exit after this many s")
    arguments = parser.parse_args(argv)
    host, port = arguments.upstream.rsplit(":", 1)
    rate = parse_rate(arguments.rate) or None
    request_latency = (
        arguments.latency if arguments.request_latency is None else arguments.request_latency
    )
    proxy = PacingProxy(
        (host, int(port)),
        Pacing(
            rate,
            arguments.latency,
            request_latency,
            total_rate=parse_rate(arguments.total_rate) or None,
        ),
        port=arguments.port,
        max_connections=arguments.max_connections,
        log=arguments.log,
    ).start()
    print(f"listening {proxy.host}:{proxy.port}", flush=True)
    deadline = time.monotonic() + arguments.lifetime
    try:
        while time.monotonic() < deadline:
            readable, _, _ = select.select([sys.stdin], [], [], 1.0)
            if readable and not sys.stdin.buffer.read1(4096):
                break  # stdin closed: the parent is done (or gone)
    except KeyboardInterrupt:
        pass
    finally:
        proxy.stop()


if __name__ == "__main__":
    main()
