"""One download's subject (:class:`Target`) and the one loop that moves a byte range of it.

:func:`resume` fetches bytes ``[start, end)`` of one version of an object through the
backend's transport and hands them to a sink in order; when a request breaks off, it asks
again from the byte reached, never from the range's start. One-stream fills
(``one_stream.py``), each range of a parallel fill (``ranges.py``) and each span of a block
fill (``blocks.py``) all go through it, so the retry and stall rules live here once.
:meth:`Target.expect` is where a fill reads an object's ``info()``: the version every
answer must be of and the checksums its bytes must have.

The stall rule: a request that waits ``timeout`` seconds for the server fails (the
transport raises ``TimeoutError``); a request that moves, but slower than ``min_rate``
bytes per second over a window of ``rate_window`` seconds, is ended too (curl's
``--speed-limit``/``--speed-time``). Only a request that moved at ``min_rate`` or better
starts a new failure chain: a server that sends a few bytes per request and stalls spends
the chain's attempts like one that sends nothing, so every download ends.

The floor is a fill's, not a stream's (:class:`FillRate`): while other streams of the fill
run, a stream's window passes when the fill as a whole moved ``min_rate`` over it, or the
stream its share (``min_rate`` / the streams running when its window began); a stream that
was alone for its whole window must move ``min_rate`` itself. So streams that split a slow
link are not taken for stalls, and a trickling range cannot outlive the others by more
than two windows: it is then ended and resumed from its byte (the other streams take the
second half of its rest while they run, ``range_plan.split_point``).
"""

from __future__ import annotations

import dataclasses
import errno
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import fsspec

from fsspec_shards.checksums import BlockList
from fsspec_shards.storage.backends import ObjectId, backend_for
from fsspec_shards.storage.backends.base import Backend, protocol_of
from fsspec_shards.storage.backends.versions import (
    Facts,
    Unproven,
    Version,
    VersionMismatch,
    expected_version,
)
from fsspec_shards.storage.core.options import default_of
from fsspec_shards.storage.core.retry import Attempts, RetryPolicy, TransientError, http_status
from fsspec_shards.storage.core.verification import Expectation, Known, expected
from fsspec_shards.storage.transfer.range_plan import endpoint_of, link_of
from fsspec_shards.storage.transfer.streams import Transport, transport_for
from fsspec_shards.units import MiB

Counter = Callable[[str, int], None]
Sink = Callable[[bytes], None]
INTEGRITY_PASSES = 2
"""Downloads of one object whose bytes fail verification before ``IntegrityError``: a copy
corrupted in transit is fetched once more; one corrupt at rest costs two downloads, not more."""


@dataclass
class ChunkSizer:
    """Chunk size for ranged reads through a transport that does not stream: doubles after a
    success up to a ceiling; after a failure that delivered nothing it halves and lowers the
    ceiling to the new size, so a link that keeps failing long requests settles on chunks
    that complete. (A streamed read that is cut keeps what arrived: no chunks then.)"""

    size: int = 4 * MiB
    minimum: int = 256 * 1024
    maximum: int = 32 * MiB

    def __post_init__(self) -> None:
        self.ceiling = self.maximum

    def succeeded(self) -> None:
        self.size = min(self.ceiling, self.size * 2)

    def failed(self) -> None:
        self.size = max(self.minimum, self.size // 2)
        self.ceiling = self.size


@dataclass
class Target:
    """What one download is about and how hard it tries."""

    fs: fsspec.AbstractFileSystem
    path: str
    obj: ObjectId
    policy: RetryPolicy
    verify: str | bool = default_of("verify")
    manifest: tuple[Known, ...] = ()
    """Every checksum the manifests give the object (``Manifest.known``)."""
    count: Counter | None = None
    transport: Transport | None = None
    ranges_in_flight: int | str = default_of("ranges_in_flight")
    """Ranged GETs at once when a large object with a version identity fills a file:
    ``"auto"`` (as many as the link rewards: ``range_plan.py``) or a fixed number."""
    min_rate: float = default_of("min_rate")
    """Bytes per second below which a moving request counts as stalled."""
    rate_window: float = default_of("min_rate_window")
    """The seconds over which ``min_rate`` is measured."""
    plan_dir: str | None = None
    """The cache directory that keeps what each store's ranges settled on (``range_plan``)."""
    fill: FillRate | None = None
    """The fill this download is one stream of (None: it is the whole download)."""

    def __post_init__(self) -> None:
        if self.transport is None:
            self.transport = transport_for(self.fs)

    @property
    def shown(self) -> str:
        """The object's name for messages and logs (redacted)."""
        return self.obj.shown

    @property
    def backend(self) -> Backend:
        """What the wds layer knows of the object's backend."""
        return backend_for(protocol_of(self.fs))

    @property
    def link(self) -> str:
        """The store the object lives on, as ``range_plan`` keys what it learned."""
        return link_of(protocol_of(self.fs), self.path, endpoint_of(self.fs))

    def in_fill(self, fill: FillRate) -> Target:
        """This download as one stream of ``fill``: ``min_rate`` is the fill's."""
        return dataclasses.replace(self, fill=fill)

    def incr(self, name: str, amount: int = 1) -> None:
        if self.count is not None and amount:
            self.count(name, amount)

    def attempts(self, action: str) -> Attempts:
        return self.policy.attempts_for(
            self.shown, action, lambda: self.incr("retries"), hide=(self.path,)
        )

    def stat(self) -> dict[str, Any]:
        """The backend's ``info()`` of the object, fresh (never from a listing cache) and
        retried. A directory (object stores show a prefix as one of size 0) raises
        ``IsADirectoryError``: its bytes are no file's."""
        self.fs.invalidate_cache(self.path)
        info = self.policy.call(
            self._fresh_info,
            self.shown,
            "info",
            lambda: self.incr("retries"),
            hide=(self.path,),
        )
        if info.get("type") == "directory":
            raise IsADirectoryError(errno.EISDIR, f"is a directory: {self.shown}")
        return info

    def stat_beside(
        self, manifest: Callable[[], tuple[Known, ...]] | None
    ) -> tuple[Target, dict[str, Any]]:
        """:meth:`stat`, and this target with ``manifest()``'s checksums where given: run in
        another thread beside the stat (a manifest still to load: its GETs), so that a
        process's first file waits for the longer of the two, not for both. A failure of
        ``manifest`` is raised first, as when it loaded before the stat."""
        if manifest is None:
            return self, self.stat()
        with ThreadPoolExecutor(1, thread_name_prefix="wds-manifest") as beside:
            loading = beside.submit(manifest)
            try:
                info = self.stat()
            except Exception:
                loading.result()
                raise
            return dataclasses.replace(self, manifest=loading.result()), info

    def stat_on_a_thread(self) -> Future[dict[str, Any]]:
        """:meth:`stat` on a thread of its own, started now: a block fill starts beside it
        (the block manifest gives the size), so that a cold file waits for one round trip,
        not two (``blocks.fill_blocks``)."""
        future: Future[dict[str, Any]] = Future()

        def run() -> None:
            try:
                future.set_result(self.stat())
            except BaseException as exc:  # the opener and the fill raise it
                future.set_exception(exc)

        threading.Thread(target=run, name="fsspec-shards-stat", daemon=True).start()
        return future

    def _fresh_info(self) -> dict[str, Any]:
        """The object's ``info()``: through the download transport where it gives every field
        the backend's ``info()`` gives (obstore's HEAD on S3: a DataLoader worker then never
        builds the backend's client), else the backend's own."""
        through_transport = getattr(self.transport, "info", None)
        if through_transport is not None:
            info = through_transport(self.path, self.policy.timeout)
            if info is not None:
                return info
        return self.backend.file_info(self.fs, self.path, self.policy.timeout)

    def expect(self, info: dict[str, Any], blocks: BlockList | None = None) -> Expected:
        """What a pass over the version ``info`` describes must deliver: the one place a
        fill reads ``info`` (the version rule, ``versions.py``; the verification rule,
        ``verification.py``; the identity the cache records). With ``blocks`` (a block
        manifest entry) every block is checked on its own, so answers need not prove their
        version, and the block manifest's whole-file SHA-256 is expected too."""
        backend = self.backend
        version = expected_version(backend.version_fields, info)
        checksums = expected(self.manifest, backend.checksums(info), self.verify)
        if blocks is not None:
            version.blocks_checked = True
            if blocks.checksum not in checksums.checksums:
                checksums = Expectation(
                    (*checksums.known, Known(blocks.checksum, "the block manifest"))
                )
        return Expected(version, checksums, backend.identity(info))

    def changed_since(self, version: Version) -> bool:
        """Whether the object's ``info()`` now describes another version than ``version``:
        the check for backends whose responses do not say which version they carry."""
        return not version.matches(self.expect(self.stat()).version)


@dataclass
class Expected:
    """What one pass over one version of an object must deliver (:meth:`Target.expect`)."""

    version: Version
    """What every response must be of."""
    checksums: Expectation
    """Every checksum the bytes must have."""
    identity: str
    """The version's identity, recorded with the cached copy."""

    def metadata(self, size: int) -> dict[str, Any]:
        """What a verified fill of ``size`` bytes returns (``size``, ``identity``,
        ``checksum``: the strongest verified, or None)."""
        strongest = self.checksums.strongest()
        return {
            "size": size,
            "identity": self.identity,
            "checksum": str(strongest) if strongest is not None else None,
        }


class TooSlow(TransientError):
    """A request moved slower than ``min_rate`` over ``rate_window``: ended as stalled."""


class FillRate:
    """The requests running for one fill and the bytes they moved: what the floor of each
    stream's window is measured against (module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.streams = 0
        self.moved = 0
        self.alone_since: float | None = None
        """When the running requests last dropped to one (None: more run, or none)."""

    def started(self) -> None:
        with self._lock:
            self.streams += 1
            self.alone_since = time.monotonic() if self.streams == 1 else None

    def ended(self) -> None:
        with self._lock:
            self.streams -= 1
            self.alone_since = time.monotonic() if self.streams == 1 else None

    def passed(self, amount: int) -> None:
        with self._lock:
            self.moved += amount


class _RateGuard:
    """Ends a request (raising :class:`TooSlow` from its sink) that moves slower than its
    floor over a window, and tells whether a finished request moved fast enough to count
    as progress. Measured from the first byte on: the wait for it is ``timeout``'s."""

    def __init__(self, min_rate: float, window: float, fill: FillRate | None = None) -> None:
        self.min_rate = min_rate
        self.window = window
        self.fill = fill
        self.share = min_rate / max(1, fill.streams) if fill is not None else min_rate
        self.started: float | None = None
        self.window_start = 0.0
        self.moved = self.window_moved = 0
        self.fill_moved_before = 0

    def passed(self, amount: int) -> None:
        now = time.monotonic()
        if self.started is None:
            self.started = now
            self._new_window(now)
        self.moved += amount
        self.window_moved += amount
        if self.fill is not None:
            self.fill.passed(amount)
        if now - self.window_start >= self.window:
            floor = self._floor(now)
            if self.window_moved < floor * (now - self.window_start):
                raise TooSlow(
                    f"below the minimum rate: {self.window_moved} bytes in "
                    f"{now - self.window_start:.0f}s (min_rate {self.min_rate:g} B/s"
                    + (f", this stream's floor {floor:g} B/s)" if floor != self.min_rate else ")")
                )
            self._new_window(now)

    def _new_window(self, now: float) -> None:
        self.window_start, self.window_moved = now, 0
        if self.fill is not None:
            self.fill_moved_before = self.fill.moved
            self.share = self.min_rate / max(1, self.fill.streams)

    def _floor(self, now: float) -> float:
        """What this request must have moved per second over the window now ending."""
        fill = self.fill
        if fill is None:
            return self.min_rate
        alone = fill.alone_since
        if alone is not None and alone <= self.window_start:
            return self.min_rate  # alone for the whole window
        if fill.moved - self.fill_moved_before >= self.min_rate * (now - self.window_start):
            return 0.0  # the fill as a whole carries the floor
        return self.share

    def counts_as_progress(self) -> bool:
        """Whether the request moved at its share of ``min_rate`` or better (or a window's
        worth)."""
        if self.started is None:
            return False
        seconds = time.monotonic() - self.started
        return self.moved >= self.share * min(seconds, self.window)


@dataclass
class Moved:
    """What :func:`resume` did: the position reached, the facts of the last response, and
    the requests it took."""

    position: int
    facts: Facts | None
    requests: int


def resume(
    target: Target,
    start: int,
    end: int | None,
    sink: Sink,
    expect: Version,
    *,
    rest_of_body: bool = False,
    chunks: ChunkSizer | None = None,
    after_fault: Callable[[], None] | None = None,
    passthrough: tuple[type[BaseException], ...] = (),
    action: str = "download",
) -> Moved:
    """Hand bytes ``[start, end)`` of the version ``expect`` to ``sink``, retried; returns
    what moved (:class:`Moved`).

    ``end=None``, or an ``expect`` of unknown size: a body that ends is the object's end.
    With ``chunks`` and a transport that does not stream, each request asks for at most
    ``chunks.size`` bytes (a failure loses the whole request); without, one request to
    ``end``. ``rest_of_body``: a 200 answer (Range ignored) is
    passed on to its end, past ``end``. ``after_fault`` runs after each failed request
    (e.g. to ask ``info()`` whether the object changed). ``VersionMismatch``,
    ``versions.Unproven`` and the ``passthrough`` exceptions (a sink's own) are raised as
    they come; other failures go to the failure chain (``retry.Attempts``): a permanent
    one, or a spent chain, is raised.
    """
    attempts = target.attempts(action)
    if target.transport.streaming:
        chunks = None
    run = _Resumption(target, start, end, sink, expect, chunks)
    while end is None or run.position < end:
        error = run.ask(rest_of_body, passthrough)
        if run.position > run.before and run.guard.counts_as_progress():
            attempts.progressed()
        judged = run.judge(error)
        if judged is True:
            break
        if judged is False:
            continue
        if run.position == run.before and chunks is not None:
            chunks.failed()  # nothing arrived: ask for less next time
        attempts.failed(judged)
        if after_fault is not None:
            after_fault()
    return Moved(run.position, run.facts, run.requests)


class _Resumption:
    """The requests of one :func:`resume`: the position reached, the facts of the last
    response, the requests made, and the bounds and rate guard of the one running."""

    def __init__(
        self,
        target: Target,
        start: int,
        end: int | None,
        sink: Sink,
        expect: Version,
        chunks: ChunkSizer | None,
    ) -> None:
        self.target = target
        self.start = self.position = self.before = start
        self.end = self.stop = end
        self.sink = sink
        self.expect = expect
        self.chunks = chunks
        self.facts: Facts | None = None
        self.requests = 0
        self.guard = _RateGuard(target.min_rate, target.rate_window, target.fill)

    def ask(
        self, rest_of_body: bool, passthrough: tuple[type[BaseException], ...]
    ) -> Exception | None:
        """One request from the position reached (to ``end``, or one chunk); the failure
        it ended in, or None. ``VersionMismatch``, ``Unproven`` and ``passthrough`` are
        raised."""
        target = self.target
        self.before = self.position
        self.stop = self.end
        if self.chunks is not None and self.end is not None:
            self.stop = min(self.end, self.position + self.chunks.size)
        self.requests += 1
        if target.fill is not None:
            target.fill.started()
        self.guard = _RateGuard(target.min_rate, target.rate_window, target.fill)
        try:
            self.facts = target.transport.stream(
                target.path,
                self.position,
                self.stop,
                self._passed,
                target.policy.timeout,
                rest_of_body,
                self.expect,
            )
        except (VersionMismatch, Unproven, *passthrough):
            raise
        except Exception as exc:
            return exc
        finally:
            if target.fill is not None:
                target.fill.ended()
        return None

    def judge(self, error: Exception | None) -> bool | Exception:
        """What the request that ended in ``error`` (None: none) means: True, the range is
        read; False, ask for the next chunk; else the failure to count (``retry.Attempts``)."""
        if error is None:
            if self.stop is None or self.position >= self.stop:
                if self.chunks is not None and self.stop is not None:
                    self.chunks.succeeded()
                return self.stop is None  # (None: read to the end of the body)
            if self.expect.size is None:
                return True  # size unknown: the body ended, so did the object
            return TransientError(f"short read: at byte {self.position} of {self.expect.size}")
        if self.expect.size is None and self.position > self.start and http_status(error) == 416:
            return True  # size unknown and the last read ended exactly at the end
        return error

    def _passed(self, data: bytes) -> None:
        self.sink(data)
        self.position += len(data)
        self.guard.passed(len(data))
