"""The fast download transport: ranged streaming GETs through obstore (Rust ``object_store``).

``obstore_options.py`` maps the user's fsspec backend options to a store configuration;
:func:`choose_transport` applies the user's ``transport="auto" | "obstore" | "fsspec"`` to
that answer. :class:`ObstoreTransport` then serves what the download layer needs:
:meth:`~ObstoreTransport.stream` (a ranged GET whose body is handed to a sink as it
arrives) and :meth:`~ObstoreTransport.info` (the backend's ``info()`` of an object from one
HEAD, where that carries every field the layer reads of it).

Invariants:

- An option that cannot be carried over exactly is refused, never dropped: ``auto`` then
  uses the fsspec backend, ``obstore`` raises a ``ValueError`` naming the option.
- Retries are ours: stores are built with obstore's retries off, so that every failure
  reaches the retry layer (``retry.py``) once, classified: 404 -> ``FileNotFoundError``,
  401/403 -> ``PermissionError``, 412 or a response of another version ->
  ``versions.VersionMismatch``, 5xx/408/429 -> an ``OSError`` carrying ``.status``, cuts and
  resets -> ``ConnectionError``, no progress within the time-out -> ``TimeoutError``.
- One set of types with the fsspec transports (``streams.py``): ``expect`` is a
  ``versions.Version``, the answer ``versions.Facts``, and every response passes
  ``versions.check_response`` before a byte of it reaches the sink.
- Bytes reach the sink as they arrive (the GIL is released while Rust waits for them); a
  transfer that breaks off has handed over every byte received before the break, all of
  them correct data from ``start`` on. The time-out bounds each wait for the server (the
  connection, the headers, every read of the body), not the whole transfer.
- No message or exception chain shows a secret: errors are rebuilt from redacted text
  (``fsspec_shards.redact``) with the configured keys and tokens masked, and raised without
  a chain.
- obstore's runtime does not survive ``fork()``: a process forked after this module made its
  first request cannot use obstore at all (every call would hang). Such a child gets
  :class:`TransportUnavailable` at once (``auto`` falls back to fsspec there); stores are
  cached per process and the cache is emptied in a forked child. A response never outlives
  the call that asked for it, failed or not (no traceback keeps it): dropped in a forked
  child, it could wait forever for the parent's runtime threads.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta, timezone
from typing import Any
from urllib.parse import unquote, urlsplit

from fsspec_shards.redact import REDACTED, redact_text, redact_url
from fsspec_shards.storage.backends import backend_for
from fsspec_shards.storage.backends.obstore_options import StoreSpec, Unmappable, map_options
from fsspec_shards.storage.backends.versions import Facts, Version, VersionMismatch, check_response
from fsspec_shards.storage.core.options import TRANSPORTS
from fsspec_shards.storage.core.retry import TransientError
from fsspec_shards.storage.deps.obstore import KIND_RE as _KIND_RE
from fsspec_shards.storage.deps.obstore import OTHER_RANGE_RE as _OTHER_RANGE_RE
from fsspec_shards.storage.deps.obstore import STATUS_RE as _STATUS_RE
from fsspec_shards.storage.transfer.s3_region import bucket_region

logger = logging.getLogger("fsspec_shards.storage.transfer.obstore_transport")

Sink = Callable[[bytes], None]

_NO_OVERALL_LIMIT = timedelta(days=7)
"""obstore's whole-request time-out (30 s by default) would cut a long download that is
moving; only the no-progress time-out applies, so the whole request gets a week."""


# --------------------------------------------------------------------------- availability


_runtime_pid: int | None = None
"""The process whose requests started obstore's runtime (it cannot be used after fork)."""


def unavailable_reason() -> str | None:
    """Why obstore cannot be used in this process, or None when it can."""
    try:
        import obstore  # noqa: F401
    except ImportError:
        return "obstore is not installed (pip install 'fsspec-shards[fast]')"
    if _runtime_pid is not None and _runtime_pid != os.getpid():
        return (
            "this process was forked from one that had used obstore, whose runtime does not "
            "survive fork() (start worker processes with 'spawn' or 'forkserver')"
        )
    return None


def choose_transport(
    protocol: str, options: Mapping[str, Any] | None, transport: str
) -> ObstoreTransport | None:
    """The obstore transport for a backend, or None where the fsspec backend should serve.

    ``transport="obstore"`` raises ``ValueError`` naming the option (or the reason) when
    obstore cannot serve the backend; ``"auto"`` answers None then and logs why at DEBUG;
    ``"fsspec"`` always answers None.
    """
    if transport not in TRANSPORTS:
        raise ValueError(f"transport must be one of {', '.join(TRANSPORTS)}, not {transport!r}")
    if transport == "fsspec":
        return None
    reason: str | None = unavailable_reason()
    spec = None
    if reason is None:
        mapped = map_options(protocol, options)
        if isinstance(mapped, Unmappable):
            reason = str(mapped)
        else:
            spec = mapped
    if spec is None:
        if transport == "obstore":
            raise ValueError(f"transport='obstore' cannot serve {protocol!r}: {reason}")
        logger.debug("transport 'auto' uses the fsspec backend for %r: %s", protocol, reason)
        return None
    return ObstoreTransport(protocol, spec)


class DownloadTransport:
    """The transport of one filesystem's downloads: obstore where it serves, else the fsspec
    backend's transport (``fallback``, any ``streams.Transport``).

    With ``required`` (``transport="obstore"``) whatever obstore cannot serve raises
    :class:`TransportUnavailable` naming why. Otherwise a path obstore cannot address goes
    to ``fallback``, and a server obstore cannot read (:class:`ServerUnsupported`, raised
    before any byte is passed) sends this and every later download to ``fallback``: the
    switch is logged once at DEBUG.
    """

    def __init__(self, fast: ObstoreTransport, fallback: Any, required: bool = False) -> None:
        self.fast = fast
        self.fallback = fallback
        self.required = required
        self.unserved: str | None = None  # why obstore stopped serving this backend

    def __repr__(self) -> str:
        using = "obstore" if self.unserved is None else "fsspec"
        return f"DownloadTransport({self.fast.spec.shown}, using {using})"

    @property
    def streaming(self) -> bool:
        """Whether bytes reach the sink as they arrive (see ``streams.Transport``)."""
        return self.unserved is None or getattr(self.fallback, "streaming", False)

    def stream(
        self,
        path: str,
        start: int,
        end: int | None,
        sink: Sink,
        timeout: float | None,
        rest_of_body: bool = False,
        expect: Version | None = None,
    ) -> Facts:
        """As ``streams.Transport.stream``, through obstore where it serves."""
        reason = self.unserved or self.fast.unserved_reason(path)
        if reason is None:
            try:
                return self.fast.stream(path, start, end, sink, timeout, rest_of_body, expect)
            except TransportUnavailable as exc:
                if self.required:
                    raise
                reason = str(exc)
                self.unserved = reason
            logger.debug("transport 'auto' uses the fsspec backend from now on: %s", reason)
        elif self.required:
            raise TransportUnavailable(
                errno.ENOTSUP, f"transport='obstore' cannot read {redact_url(path)}: {reason}"
            )
        return self.fallback.stream(path, start, end, sink, timeout, rest_of_body, expect)

    def info(self, path: str, timeout: float | None) -> dict[str, Any] | None:
        """:meth:`ObstoreTransport.info`; None once obstore stopped serving this backend."""
        return None if self.unserved else self.fast.info(path, timeout)


def download_transport(
    protocol: str, options: Mapping[str, Any] | None, transport: str, fallback: Any
) -> Any:
    """The transport downloads of a backend use: a :class:`DownloadTransport` when obstore
    can serve it (:func:`choose_transport`), else ``fallback`` itself."""
    fast = choose_transport(protocol, options, transport)
    if fast is None:
        return fallback
    return DownloadTransport(fast, fallback, required=transport == "obstore")


# --------------------------------------------------------------------------- errors


class TransportUnavailable(OSError):
    """obstore cannot run in this process (see :func:`unavailable_reason`): use fsspec."""


class ServerUnsupported(TransportUnavailable):
    """The server cannot be read through obstore, though fsspec may read it: it answers
    obstore's requests with 501 Not Implemented, or without a header obstore requires
    (gcp-storage-emulator: no Last-Modified, no decoding of encoded paths). Use fsspec for
    this backend."""


class HttpStatusError(OSError):
    """The server answered with an error status (``.status``) that has no OSError subclass
    of its own; the retry layer reads the status (5xx, 408, 429 are transient)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(errno.EIO if status >= 500 else errno.EINVAL, message)
        self.status = status

    def __reduce__(self):
        return type(self), (self.status, self.strerror)


class RangeNotSupported(OSError):
    """The server ignores Range requests (obstore refuses such answers)."""


# object_store's HttpErrorKind values of failures worth retrying (Timeout is handled apart;
# Unknown covers a request that could not even be built: not worth retrying).
_TRANSIENT_KINDS = {"Connect", "Request", "Interrupted", "Decode"}


# --------------------------------------------------------------------------- the transport


def _seconds(moment: datetime | None) -> float | None:
    """A Last-Modified as whole seconds since the epoch (HTTP dates carry no more); None
    for the epoch itself, which obstore's HTTP store reports when the header is missing."""
    seconds = None if moment is None else float(int(moment.timestamp()))
    return seconds or None


_stores: dict[tuple, Any] = {}
_stores_lock = threading.Lock()
_builds: dict[tuple, threading.Lock] = {}  # per store key, held while it is built
_regions: dict[str, str] = {}
_parents_stores: list[dict[tuple, Any]] = []
"""In a forked child: the stores of the parent, kept referenced forever. Dropping one runs
its Rust destructor, which reaches for the parent's runtime and hangs (seen in DataLoader
workers); they are never used either."""


def _forget_stores_after_fork() -> None:
    global _stores, _stores_lock, _builds
    _stores_lock = threading.Lock()
    _builds = {}
    _parents_stores.append(_stores)
    _stores = {}


os.register_at_fork(after_in_child=_forget_stores_after_fork)


PIECES_AS_RECEIVED = 0
"""obstore's ``min_chunk_size``: every piece is handed to Python as it arrives. Gathering
pieces (64 KiB were tried) would blind the stall rule (``transfer.py``: ``min_rate`` is
checked as bytes pass): at 100 B/s a 64 KiB piece takes 11 minutes to gather, and
obstore's own time-out sees the bytes move. Nothing is lost for speed: on loopback the
pieces are ~280 KiB anyway (1.7-1.8 GB/s either way, 256 MiB read), and on a slow link
the calls per byte do not matter. A cut loses nothing: what arrived was passed on."""


class ObstoreTransport:
    """Ranged GETs of one backend configuration through obstore.

    Paths are the fsspec backend's: ``bucket/key`` (s3, optionally ``?versionId=``),
    ``bucket/key`` (gcs), ``container/blob`` (az), full URLs (http).
    """

    streaming = True  # bytes reach the sink as they arrive

    def __init__(self, protocol: str, spec: StoreSpec) -> None:
        self.protocol = protocol
        self.spec = spec
        self._ignoring_range: set[str] = set()
        """Origins that answered a range with the whole object: asked for it at once since
        (a ranged GET there is a whole answer abandoned at its headers)."""

    def __repr__(self) -> str:
        return f"ObstoreTransport({self.spec.shown})"

    # ---- paths and stores

    def unserved_reason(self, path: str) -> str | None:
        """Why this transport cannot fetch ``path`` (the fsspec backend must), or None."""
        try:
            self._locate(path)
        except ValueError as exc:
            return str(exc)
        return None

    def _locate(self, path: str) -> tuple[str, str, str | None]:
        """(store name: bucket, container or origin; object key; version in the path)."""
        version = None
        if self.spec.kind == "http":
            parts = urlsplit(path)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError(f"not an http(s) URL: {redact_url(path)}")
            if parts.query or parts.fragment or "@" in parts.netloc:
                raise ValueError("URLs with a query, fragment or credentials are left to fsspec")
            origin = f"{parts.scheme}://{parts.netloc}"
            key = unquote(parts.path.lstrip("/"))
        else:
            text = path.split("://", 1)[1] if "://" in path else path
            if self.spec.kind == "s3" and "?versionId=" in text:
                text, version = text.split("?versionId=", 1)
            if "?" in text or "#" in text:
                raise ValueError("paths with a query or fragment are left to fsspec")
            origin, _, key = text.lstrip("/").partition("/")
        segments = key.split("/")
        if not origin or not key or any(s in ("", ".", "..") for s in segments):
            raise ValueError(f"obstore cannot address {redact_url(path)!r} as an object key")
        return origin, key, version

    def _store(self, origin: str, timeout: float | None) -> Any:
        """The store of ``origin`` in this process, built once even where threads ask at once
        (a worker's first HEAD beside its manifest's GETs: a build holds the GIL ~5 ms)."""
        key = (self.spec.key, origin, timeout)
        store = _stores.get(key)  # (every request asks: no lock once it is built)
        if store is not None:
            return store
        with _stores_lock:
            building = _builds.setdefault(key, threading.Lock())
        with building:
            store = _stores.get(key)
            if store is not None:
                return store
            try:
                store = _stores[key] = self._build(origin, timeout)
                return store
            except (ValueError, TypeError) as exc:  # obstore refused the configuration
                problem = str(exc).split("\n", 1)[0]
                for secret in self.spec.secrets:
                    problem = problem.replace(secret, REDACTED)
                failure = ValueError(f"obstore rejects {self.spec.shown}: {redact_text(problem)}")
        raise failure

    def _build(self, origin: str, timeout: float | None) -> Any:
        from obstore.store import AzureStore, GCSStore, HTTPStore, S3Store

        spec = self.spec
        client = dict(spec.client)
        client["timeout"] = _NO_OVERALL_LIMIT
        if timeout:
            client["connect_timeout"] = timedelta(seconds=timeout)
            client["read_timeout"] = timedelta(seconds=timeout)
        common = {"client_options": client, "retry_config": {"max_retries": 0}}
        if spec.credentials is not None:
            common["credential_provider"] = spec.credentials
        if spec.kind == "http":
            if origin.startswith("http://"):
                client["allow_http"] = True
            return HTTPStore.from_url(origin, **common)
        config = dict(spec.config)
        if spec.kind == "s3":
            if spec.bucket_region:
                region = _regions.get(origin) or bucket_region(origin, timeout=timeout or 30.0)
                _regions[origin] = region
                config.update(region=region, endpoint=f"https://s3.{region}.amazonaws.com")
            return S3Store(origin, config=config, **common)
        if spec.kind == "gcs":
            return GCSStore(origin, config=config, **common)
        return AzureStore(origin, config=config, **common)

    # ---- errors

    def _url(self, origin: str, key: str) -> str:
        if self.spec.kind == "http":
            return f"{origin}/{key}"
        return f"{self.protocol}://{origin}/{key}"

    def _error(self, exc: BaseException, url: str, action: str) -> BaseException:
        """``exc`` from obstore as the OSError the retry layer classifies, with a
        secret-free message and no chain."""
        import obstore.exceptions as oe

        if not isinstance(exc, oe.BaseError | OSError):
            return exc  # a bug or a sink's own error: not ours to translate
        text = str(exc)
        summary = text.split("\n\nDebug source:", 1)[0].strip()
        for secret in self.spec.secrets:
            summary = summary.replace(secret, REDACTED)
        detail = " ".join(redact_text(summary, url).split())
        if len(detail) > 300:
            detail = detail[:297] + "..."
        shown = redact_url(url)
        status_match = _STATUS_RE.search(text)
        status = int(status_match.group(1)) if status_match else None
        message = f"{action} {shown}: {detail}"
        error: OSError
        if isinstance(exc, FileNotFoundError) or status in (404, 410):
            error = FileNotFoundError(errno.ENOENT, f"not found: {shown} ({detail})")
        elif isinstance(exc, oe.PermissionDeniedError | oe.UnauthenticatedError) or status in (
            401,
            403,
        ):
            error = PermissionError(errno.EACCES, f"permission denied: {shown} ({detail})")
        elif isinstance(exc, oe.PreconditionError) or status == 412:
            error = VersionMismatch(errno.ESTALE, f"{shown} changed: {detail}")
        elif isinstance(exc, oe.NotSupportedError) and "Range" in text:
            error = RangeNotSupported(errno.EINVAL, f"no range requests: {message}")
        elif (other := _OTHER_RANGE_RE.search(text)) is not None:  # checked by obstore
            error = TransientError(
                errno.EIO,
                f"Content-Range starts at byte {other.group(3)}, asked for {other.group(1)}: "
                f"{message}",
            )
        elif status == 501 or "source: Header" in text:
            error = ServerUnsupported(errno.ENOTSUP, f"the server cannot serve obstore: {message}")
        elif status is not None:
            error = HttpStatusError(status, message)
        else:
            kind_match = _KIND_RE.search(text)
            kind = kind_match.group(1) if kind_match else None
            if kind == "Timeout":
                error = TimeoutError(errno.ETIMEDOUT, f"no progress: {message}")
            elif kind == "Connect":
                error = ConnectionError(errno.ECONNREFUSED, f"cannot connect: {message}")
            elif kind in _TRANSIENT_KINDS:
                error = ConnectionResetError(errno.ECONNRESET, f"connection failed: {message}")
            else:
                error = OSError(errno.EIO, message)
        error.__suppress_context__ = True
        return error

    def _open(self, path: str, timeout: float | None) -> tuple[Any, str, str, str | None, str]:
        """(origin, store, key, version named in the path, URL for messages) for ``path``."""
        origin, key, version = self._locate(path)
        url = self._url(origin, key)
        reason = unavailable_reason()
        if reason is not None:
            raise TransportUnavailable(errno.ENOTSUP, f"{redact_url(url)}: {reason}")
        return origin, self._store(origin, timeout), key, version, url

    def _call(self, url: str, action: str, function: Callable[[], Any]) -> Any:
        """``function()`` (one obstore request), its failure translated by :meth:`_error`."""
        global _runtime_pid
        _runtime_pid = os.getpid()
        try:
            return function()
        except Exception as exc:
            error = self._error(exc, url, action)
        raise error

    # ---- the operations

    def stream(
        self,
        path: str,
        start: int,
        end: int | None,
        sink: Sink,
        timeout: float | None,
        rest_of_body: bool = False,
        expect: Version | None = None,
    ) -> Facts:
        """Pass bytes ``[start, end)`` of ``path`` to ``sink`` in order, as they arrive, and
        return what the server said about them. ``end=None`` reads to the object's end.

        With ``expect``, the request is conditional on that version (If-Match on its strong
        ETag, else If-Unmodified-Since; its version id / generation is asked for), and an
        answer of any other version raises ``VersionMismatch`` before a byte is passed
        (``versions.check_response``, which also fills in what ``expect`` lacks). May pass
        fewer bytes than asked (the object is shorter) or raise after passing some (a cut,
        a stall): everything passed is correct data from ``start`` on. A server that ignores
        Range sends the whole object: bytes ``[start, end)`` of it are passed, or with
        ``rest_of_body`` everything from ``start`` on.
        """
        import obstore

        if start < 0 or (end is not None and end <= start):
            raise ValueError(f"empty or negative range [{start}, {end})")
        origin, store, key, path_version, url = self._open(path, timeout)
        options = _conditions(expect, path_version)
        action = f"GET bytes {start}-{'' if end is None else end - 1} of"
        asked = {"offset": start} if end is None else (start, end)
        ranged = {**options, "range": asked}
        result = None
        if origin not in self._ignoring_range:
            try:
                result = self._call(url, action, lambda: obstore.get(store, key, options=ranged))
            except RangeNotSupported:
                self._ignoring_range.add(origin)
        wanted = None if end is None else end - start
        if result is None:  # the server ignores Range: take the body from its start
            result = self._call(url, "GET", lambda: obstore.get(store, key, options=options))
            status, skip, stop = 200, start, None if rest_of_body else wanted
        else:
            status, skip, stop = 206, 0, wanted
        try:
            facts = _checked_facts(result.meta, result.range, status, start, end, expect, url)
            self._pump(
                result.stream(min_chunk_size=PIECES_AS_RECEIVED), sink, skip, stop, url, action
            )
        finally:
            del result  # not kept by the traceback of a failure: see _pump
        return facts

    def info(self, path: str, timeout: float | None) -> dict[str, Any] | None:
        """The backend's ``info()`` of ``path`` from one HEAD where that carries all of it
        (``Backend.info_from_head``): a worker then never builds the backend's client for
        its stat (an aiobotocore client: 100-250 ms). None where the backend must answer: a
        version in the path, no key obstore can address, nothing there (or a directory), no
        connection."""
        import obstore

        backend = backend_for(self.protocol)
        if not backend.head_gives_info:
            return None
        try:
            origin, store, key, version, url = self._open(path, timeout)
            if version is not None:
                return None
            meta = self._call(url, "HEAD", lambda: obstore.head(store, key))
        except (ValueError, FileNotFoundError, TransportUnavailable, ConnectionError):
            # a failed connection: the backend's stat fails the same way and says why (a
            # name that does not resolve, a plain-HTTP server at https://), which obstore's
            # error leaves to its debug text
            return None
        return backend.info_from_head(meta, f"{origin}/{key}")

    def _pump(self, body: Any, sink: Sink, skip: int, stop: int | None, url: str, action: str):
        """Hand the body to ``sink``: ``skip`` bytes dropped first, at most ``stop`` passed.

        The body is released on the way out, also when this raises: a traceback keeping it
        would leave an open response for a garbage collection, possibly in a forked child
        (a DataLoader worker), where dropping it waits for runtime threads that exist only
        in the parent, forever if one was handing it bytes at the fork.
        """
        failure = None
        try:
            while stop is None or stop > 0:
                try:
                    piece = next(body)
                except StopIteration:
                    break
                except Exception as exc:
                    failure = self._error(exc, url, action)
                    break
                if skip:
                    dropped = min(skip, len(piece))
                    piece, skip = piece[dropped:], skip - dropped
                if stop is not None:
                    piece = piece[:stop]
                    stop -= len(piece)
                if piece:
                    sink(piece)
        finally:
            del body
        if failure is not None:
            raise failure


def _checked_facts(
    meta: dict[str, Any],
    answered: tuple[int, int],
    status: int,
    start: int,
    end: int | None,
    expect: Version | None,
    url: str,
) -> Facts:
    """What an answer (its ``meta`` and byte range) says of itself, checked against
    ``expect`` (``versions.check_response``) and, for a 206, against the range asked,
    before a byte of it is used. (Given the answer's parts, not the answer: a traceback of
    a failure here keeps no response open, see ``_pump``.)"""
    first, last = answered
    facts = Facts(
        status=status,
        start=first if status == 206 else None,
        stop=last if status == 206 else None,
        total=meta["size"],
        etag=meta["e_tag"],
        version=meta["version"],
        modified=_seconds(meta["last_modified"]),
    )
    check_response(facts, start, expect)
    expected_range = (start, meta["size"] if end is None else min(end, meta["size"]))
    if status == 206 and (first, last) != expected_range:
        raise TransientError(
            f"{redact_url(url)}: asked for bytes {start}-{expected_range[1] - 1}, "
            f"got {first}-{last - 1}"
        )
    return facts


def _conditions(expect: Version | None, path_version: str | None) -> dict[str, Any]:
    """obstore's GET options pinning the request to ``expect``: its version id / generation
    (or the one the path names), If-Match on a strong ETag, else If-Unmodified-Since."""
    options: dict[str, Any] = {}
    version = path_version or (expect.version if expect else None)
    if version:
        options["version"] = str(version)
    if expect is None:
        return options
    if expect.strong_etag:  # If-Match compares strong ETags only
        options["if_match"] = expect.strong_etag
    elif expect.modified is not None:
        options["if_unmodified_since"] = datetime.fromtimestamp(expect.modified, timezone.utc)
    return options
