"""How many ranged GETs of one object are in flight: the one rule of every parallel fill.

``ranges_in_flight="auto"`` (the default) starts a fill with one stream and adds streams,
doubling, while the aggregate rate grows by :data:`GROWTH` or more; when it does not, the
streams go back to the last level that paid and stay there. One connection to a far store
carries tens of MB/s, so there several ranges reach the link's rate; on loopback, a server
that copies the object for every ranged GET, or a link capped as a whole, a second stream
adds nothing and the fill stays at one (a single request for the rest of the object).

What a store settled on is remembered per store (:func:`link_of`: the protocol and the
endpoint's host and port, or the bucket where there is no endpoint; never credentials):
in the process, and in the cache directory (:data:`PLAN_FILE`), so that the next process
starts there. The next object starts at that level (and probes on from there when the last
probe was cut short by the fill's end, and every :data:`REPROBE_EVERY` fills); a store
settled at one stream is filled by one request to the end (:func:`one_request`), probed
again every :data:`REPROBE_AT_ONE` fills of a process. A fill that ends before its first
added stream was measured, or whose one stream moves :data:`ONE_IS_ENOUGH`, settles the
store at one stream too: one stream carried the object about as fast as the probe could
tell (loopback, moto). What the cache directory holds is
trusted for :data:`REPROBE_AFTER` seconds; older, the store is probed as a new one.

A fill whose first range is to say whether the store answers ranges at all (an int
``ranges_in_flight``, a block fill whose first block is one request) asks it alone
(:data:`FIRST_BYTES`) before more streams start; a whole-object fill under auto
(``eager``) asks its first range to the end, so a store where one stream is the answer
costs the one request ``ranges_in_flight=1`` makes, and learns from the streams the ramp
adds: a range beyond byte 0 answered with the whole object (200) settles the store at one
stream.

A block fill's first block is what a reader waits for, so it is asked as
:data:`FIRST_PIECES` concurrent pieces of at least :data:`PIECE_BYTES`
(:meth:`Ramp.first_pieces`), before any answer is in: on a link paced per connection
(every far store) the block then comes in one round trip plus a piece's time instead of a
whole block's (2 MiB at 25 MB/s: 84 ms, a piece 21 ms). Not where ranges do not pay:
``ranges_in_flight=1``, or a store settled at one stream and not due for a probe (what
this process or the cache directory learned: a loopback store, a server that ignores
ranges), gets one request. The pieces' answers are the first
range's answer (:meth:`Ramp.first_answered`): one answered with the whole object (200)
settles the store at one stream as above, and so do pieces that each moved
:data:`ONE_IS_ENOUGH` (a fast link: next time one request). The last piece runs on to the
end of the fill's first span (for a small object, its end), so the pieces cost no request
after them; the other pieces take a process slot each (:data:`PROCESS_MAX`), fewer when none
is free. Each answer is checked against the version of the fill (``versions.py``) like any
range; the block is verified once all its pieces are in.

An int fixes the number of streams (1: one request); more than ``PROCESS_MAX + 1`` could
never all get a slot, so a fill runs at most that many.

The ranges: the object (after the first range, where there is one) in as many equal ranges
as streams run when the fill starts, one request each, as a careful hand-written tool
does; a stream that joins later (the ramp added it) or ends early takes the second half of
the range with the most bytes left (:func:`split_point`), whose stream stops where the
half begins. So every stream always has work, however the level changes, the ends come
together, and a fill costs as few requests as it has streams (some servers copy the whole
object for each ranged GET).

Bounds: a fill has at most :data:`AUTO_MAX` streams under auto; all fills of a process
share :data:`PROCESS_MAX` streams beyond the first of each fill (a fill never waits for a
slot: it runs with fewer streams). A host running N processes (e.g. DataLoader workers)
thus has at most N x (PROCESS_MAX + fills in flight) download requests in flight; its open
connections may exceed that by idle ones in the clients' pools (docs/transport.md).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from fsspec_shards.units import MiB

AUTO_ABOVE = 32 * MiB
"""Objects larger than this may be filled by several ranges (smaller: one request)."""
AUTO_MAX = 8
PROCESS_MAX = 16
GROWTH = 1.5
"""Aggregate-rate growth that makes the extra streams worth keeping."""
FIRST_BYTES = 1 * MiB
"""The first range of a parallel fill on a store not seen answering ranges yet: its answer
(206, or 200: ranges ignored) decides whether more ranges follow."""
FIRST_PIECES = 4
"""Concurrent requests that fetch a block fill's first block, where ranges may pay."""
PIECE_BYTES = MiB // 2
"""The least bytes of one such piece (a smaller block is asked in fewer pieces, or one)."""
SPLIT_MIN = 4 * MiB
"""A range with fewer bytes left is not split for a stream that joins later: the new
request's round trips would cost more than its half saves."""
SETTLE_MAX = 0.3
"""Longest wait for added streams' first bytes before their rate is measured."""
WINDOW = 0.15
ONE_IS_ENOUGH = 256e6
"""Bytes per second of one stream at which a store is not probed for more: a link that
carries this much on one connection is loopback or a fast local server (an object store
far away gives tens of MB/s per connection), and there a second request costs more than
it can bring (moto copies the whole object for each; the fill's hash and fsync are the
limit)."""
REPROBE_EVERY = 4
REPROBE_AT_ONE = 64
"""A store settled at one stream (a fast link) is probed again only this often: a probe
costs it 8 requests instead of one, and some servers copy the object for each."""
REPROBE_AFTER = 24 * 3600.0
"""Seconds a level kept in a cache directory is trusted by a new process."""
PLAN_FILE = "range-plan.json"
"""In a cache directory: ``{store: [level, unix time it was learned]}``."""

_lock = threading.Lock()
_slots_taken = 0
_learned: dict[str, tuple[int, int]] = {}
"""Per store: (the level it settled on, fills since the last probe)."""
_recalled: set[str] = set()
"""Cache directories whose :data:`PLAN_FILE` this process read."""


def _after_fork() -> None:
    global _slots_taken, _lock
    _lock = threading.Lock()
    _slots_taken = 0  # the parent's streams are not this process's


os.register_at_fork(after_in_child=_after_fork)


def forget() -> None:
    """Forget what this process learned and read (as a new process starts): for benchmarks
    and tests of a first fill."""
    with _lock:
        _learned.clear()
        _recalled.clear()


def link_of(protocol: str, path: str, endpoint: str | None = None) -> str:
    """The store a path lives on, as the key of what its link settled on: the protocol and
    the host and port requests go to (``endpoint``, or the URL's), else the bucket; never
    the credentials a URL may carry."""
    where = endpoint or (path if "://" in path else None)
    if where:
        parts = urlsplit(where if "://" in where else f"//{where}")
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
        return f"{protocol}:{parts.scheme}://{host}{port}"
    return f"{protocol}:{path.lstrip('/').split('/', 1)[0]}"


def endpoint_of(fs: Any) -> str | None:
    """The endpoint a backend filesystem sends requests to, where it names one (s3fs's
    ``endpoint_url``, also in ``client_kwargs``); None: the store's own."""
    endpoint = getattr(fs, "endpoint_url", None)
    if not isinstance(endpoint, str):
        endpoint = (getattr(fs, "client_kwargs", None) or {}).get("endpoint_url")
    return endpoint if isinstance(endpoint, str) and endpoint else None


def recall(directory: str | None) -> None:
    """Take what the cache ``directory`` says its stores settled on (once per process; an
    entry older than :data:`REPROBE_AFTER`, or one this process learned itself, is not)."""
    if directory is None or directory in _recalled:
        return
    try:
        with open(os.path.join(directory, PLAN_FILE), encoding="utf-8") as handle:
            kept = json.load(handle)
    except (OSError, ValueError):
        kept = {}
    now = time.time()
    with _lock:
        _recalled.add(directory)
        for link, entry in kept.items() if isinstance(kept, dict) else ():
            try:
                level, when = int(entry[0]), float(entry[1])
            except (TypeError, ValueError, IndexError, KeyError):
                continue
            if 1 <= level <= AUTO_MAX and 0 <= now - when < REPROBE_AFTER:
                _learned.setdefault(link, (level, 0))


def _keep(directory: str | None, link: str, level: int) -> None:
    """Write ``link``'s level into the cache ``directory`` (best effort: a cache directory
    that cannot take it costs the next process a probe, nothing else)."""
    if directory is None:
        return
    path = os.path.join(directory, PLAN_FILE)
    try:
        with open(path, encoding="utf-8") as handle:
            kept = json.load(handle)
        if not isinstance(kept, dict):
            kept = {}
    except (OSError, ValueError):
        kept = {}
    kept[link] = [level, time.time()]
    temporary = f"{path}.{os.getpid()}.{threading.get_ident()}"
    try:
        with open(temporary, "w", encoding="utf-8") as handle:
            json.dump(kept, handle)
        os.replace(temporary, path)
    except OSError:
        try:
            os.unlink(temporary)
        except OSError:
            pass


def _reprobe_every(level: int) -> int:
    return REPROBE_AT_ONE if level == 1 else REPROBE_EVERY


def one_request(ranges_in_flight: int | str, link: str, directory: str | None = None) -> bool:
    """Whether the fill of an object on ``link`` is one request to its end: ``1``, or auto
    on a store settled at one stream (here or in the cache ``directory``) and not due for a
    probe (the fill is counted)."""
    if ranges_in_flight == 1:
        return True
    if ranges_in_flight != "auto":
        return False
    recall(directory)
    with _lock:
        learned, fills = _learned.get(link, (0, 0))
        if learned != 1 or fills >= REPROBE_AT_ONE:
            return False
        _learned[link] = (1, fills + 1)
        return True


def _take_slot() -> bool:
    global _slots_taken
    with _lock:
        if _slots_taken >= PROCESS_MAX:
            return False
        _slots_taken += 1
        return True


def _give_slot() -> None:
    global _slots_taken
    with _lock:
        _slots_taken = max(0, _slots_taken - 1)


class Ramp:
    """The streams one fill may run: worker 0 always; worker ``n`` once :meth:`admit`
    lets it (module docstring). Workers report bytes with :meth:`moved`; the filling
    thread runs :meth:`steer` while they work."""

    def __init__(
        self,
        ranges_in_flight: int | str,
        link: str,
        directory: str | None = None,
        eager: bool = False,
    ) -> None:
        self.adaptive = ranges_in_flight == "auto"
        self.link = link
        self.directory = directory
        """The cache directory that keeps what the store settled on (None: the process)."""
        if self.adaptive:
            recall(directory)
        self.cap = AUTO_MAX if self.adaptive else min(int(ranges_in_flight), PROCESS_MAX + 1)
        self.level = self.cap
        self.probing = False
        if self.adaptive:
            with _lock:
                learned, fills = _learned.get(link, (1, REPROBE_AT_ONE))  # new: probe
                self.level, self.probing = learned, fills >= _reprobe_every(learned)
                if not self.probing:
                    _learned[link] = (learned, fills + 1)
        self.gated = not (self.adaptive and (eager or link in _learned))
        """Whether the first range must be answered as a range (206) before more streams
        start: yes unless this store already answered ranges, or the fill is ``eager``
        (module docstring: its first range runs to the end and the added streams' answers
        tell)."""
        self.allowed = 1 if self.gated else self.level
        self.bytes = 0
        self._started = time.monotonic()
        self._cond = threading.Condition()
        self._gate_open = not self.gated
        self._closed = False
        self._asked_open: set[int] = set()
        """Workers whose current request was asked with the gate open."""
        self._receiving: set[int] = set()
        """Of those, the ones that have bytes of it."""
        self._span_bytes: int | None = None

    # -- the workers' side

    def requesting(self, worker: int) -> None:
        """Worker ``worker`` asks for its next range. A measurement waits until each
        stream has bytes of a request asked once the gate was open, so neither the gated
        first range nor the round trip between two requests (long on a busy machine) is
        taken for the link's rate."""
        with self._cond:
            self._receiving.discard(worker)
            if self._gate_open:
                self._asked_open.add(worker)
            else:
                self._asked_open.discard(worker)

    def moved(self, worker: int, amount: int) -> None:
        with self._cond:
            self.bytes += amount
            if worker in self._asked_open and worker not in self._receiving:
                self._receiving.add(worker)
                self._cond.notify_all()

    def ranges_answered(self, as_ranges: bool) -> None:
        """The first range was answered: as a range (206) opens the gate to more streams;
        not (200, or a transport that cannot tell) keeps the fill at one, and under auto
        settles the store there (also when a later range of an eager fill said so)."""
        with self._cond:
            self._gate_open = True
            if as_ranges:
                self.allowed = self.level
            else:
                self.cap = self.level = self.allowed = 1
                self.probing = False
            self._cond.notify_all()
        if not as_ranges and self.adaptive:
            self._settle(decided=True)

    def admit(self, worker: int) -> bool:
        """Wait until worker ``worker`` (>= 1) may run and it got a process slot; False when
        the fill ends or settled below it (the worker then exits)."""
        with self._cond:
            while not self._closed and worker >= self.allowed:
                if self._gate_open and not self.probing and worker >= self.level:
                    return False
                self._cond.wait()
            if self._closed:
                return False
        return _take_slot()

    def keeps(self, worker: int) -> bool:
        """Whether worker ``worker`` takes another range (False: the level went down)."""
        with self._cond:
            return worker < self.allowed and not self._closed

    def release(self, worker: int) -> None:
        """Worker ``worker`` (>= 1, admitted) ended: its slot goes back."""
        _give_slot()

    @property
    def answered(self) -> bool:
        """Whether more than the first range may be handed out (its answer came, or none
        was needed)."""
        return self._gate_open

    def span(self, remaining: int) -> int:
        """Bytes of the next range handed out of the ``remaining`` unassigned ones: the
        first range before its answer; then the rest in as many equal ranges as streams
        run now (module docstring), the same size for every one of them."""
        with self._cond:
            if not self._gate_open:  # (a small object: its share of the streams)
                return min(remaining, FIRST_BYTES, -(-remaining // self.cap))
            if self._span_bytes is None:
                self._span_bytes = max(1, -(-remaining // max(1, self.allowed)))
            return min(remaining, self._span_bytes)

    def first_pieces(self, block_bytes: int) -> int:
        """How many concurrent requests fetch a block fill's first block of ``block_bytes``
        (module docstring); a process slot is taken for each beyond the first (give them
        back with :meth:`pieces_ended`)."""
        settled_at_one = self.adaptive and self.level == 1 and not self.probing
        wanted = min(FIRST_PIECES, self.cap, block_bytes // PIECE_BYTES)
        if settled_at_one or wanted < 2:
            return 1
        pieces = 1
        while pieces < wanted and _take_slot():
            pieces += 1
        return pieces

    def pieces_ended(self, pieces: int) -> None:
        """The ``pieces`` of a first block ended: their slots go back."""
        for _ in range(pieces - 1):
            _give_slot()

    def first_answered(self, as_ranges: bool, slowest_rate: float | None) -> None:
        """The pieces of a first block were answered: as ranges (206) or not; the slowest
        piece moved ``slowest_rate`` bytes per second (None: too few bytes to tell). Settles
        the store at one stream when the link needs no more (module docstring); else, with
        the gate still closed, opens it (:meth:`ranges_answered`)."""
        fast = self.adaptive and slowest_rate is not None and slowest_rate >= ONE_IS_ENOUGH
        as_ranges = as_ranges and not fast
        if not as_ranges or not self._gate_open:
            self.ranges_answered(as_ranges)

    # -- the filling thread's side

    def steer(self, done: threading.Event) -> None:
        """Decide the level while the fill runs (returns when ``done`` is set or settled)."""
        with self._cond:
            while not self._gate_open and not done.is_set():
                self._cond.wait(0.05)
        if not self.probing:
            return
        previous = self._measure(done, self.level)
        # the fill ended before one window passed, or one stream moves ONE_IS_ENOUGH: one
        # stream is fast enough here
        enough = previous is not None and self.level == 1 and previous >= ONE_IS_ENOUGH
        decided = previous is None or self.level == self.cap or enough
        while previous is not None and self.level < self.cap and not enough:
            trying = min(self.cap, self.level * 2)
            with self._cond:
                self.allowed = trying
                self._cond.notify_all()
            rate = self._measure(done, trying)
            if rate is None:  # the object ended first: from one stream, one was enough
                decided = self.level == 1
                break
            if rate < previous * GROWTH or trying > self.cap:  # (cap: ranges ignored)
                decided = True
                break
            self.level, previous = trying, rate
            decided = self.level == self.cap
        with self._cond:
            self.level = min(self.level, self.cap)
            self.allowed = self.level
            self.probing = False
            self._cond.notify_all()
        self._settle(decided)

    def _settle(self, decided: bool) -> None:
        """Keep the level (here and in the cache directory when ``decided``); a probe the
        fill's end cut short goes on with the next fill."""
        with _lock:
            _learned[self.link] = (self.level, 0 if decided else _reprobe_every(self.level))
        if decided:
            _keep(self.directory, self.link, self.level)

    def close(self) -> None:
        """The fill ended: waiting workers exit."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _measure(self, done: threading.Event, streams: int) -> float | None:
        """The aggregate rate over :data:`WINDOW` once ``streams`` workers receive (see
        :meth:`requesting`; or :data:`SETTLE_MAX` passed); None when the fill ended first."""
        deadline = time.monotonic() + SETTLE_MAX
        with self._cond:
            while len(self._receiving) < streams and not done.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(min(left, 0.02))
            start, moved = time.monotonic(), self.bytes
        if done.wait(WINDOW):
            return None
        with self._cond:
            return (self.bytes - moved) / max(time.monotonic() - start, 1e-6)


def split_point(position: int, end: int) -> int | None:
    """Where a range with bytes ``[position, end)`` left is split for a stream that has no
    range (it takes ``[point, end)``), or None when too little is left to be worth it."""
    if end - position < SPLIT_MIN:
        return None
    return position + (end - position) // 2


class Stopped(Exception):
    """Another stream of the fill failed: this one stops (raised from its sink, so its
    request ends)."""


def run_stream(
    ramp: Ramp,
    worker: int,
    take: Callable[[], Any],
    fetch: Callable[[int, Any], None],
    stop: threading.Event,
    failures: list[BaseException],
    waited_on: threading.Event,
) -> None:
    """One stream of a parallel fill: once ``ramp`` admits ``worker`` (worker 0 always
    runs), fetch what ``take`` hands out (None: nothing left) while the ramp keeps it. A
    failure is kept in ``failures`` and stops every stream (``stop``), waking the filling
    thread (``waited_on``: the event it waits for, the fill's end or all handed out);
    :class:`Stopped` ends the stream quietly."""
    if worker and not ramp.admit(worker):
        return
    try:
        while not stop.is_set() and (worker == 0 or ramp.keeps(worker)):
            piece = take()
            if piece is None:
                return
            ramp.requesting(worker)
            fetch(worker, piece)
    except Stopped:
        return
    except BaseException as exc:
        failures.append(exc)
        stop.set()
        waited_on.set()
    finally:
        if worker:
            ramp.release(worker)
