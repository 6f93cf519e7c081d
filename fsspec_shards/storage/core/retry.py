"""Retry policy and error classification shared by every backend call.

Backends report the same failure in different shapes (s3fs turns botocore errors into
``OSError`` with an errno, gcsfs raises ``HttpError`` with ``.code``, azure-core has
``.status_code``, fsspec's http backend wraps aiohttp errors in ``FileNotFoundError``). Here
they are sorted into transient (retry with backoff) and permanent (raise at once as the
matching ``OSError`` subclass naming the redacted URL). The rules are generic; what each
backend's library calls its failures (:class:`ErrorNames`) is the backend's
(``storage/backends/failure_names.py``), every backend's learnt here when
``storage.backends`` is imported (:func:`learn`).

Invariant: what this module raises carries no secret in its text or in its
``__cause__``/``__context__`` chain (:func:`fsspec_shards.redact.clean_error`); callers hand
failures to :meth:`Attempts.failed` outside their ``except`` blocks, so that the backend's
own exception (which may quote a signed URL) is not chained implicitly.
"""

from __future__ import annotations

import errno
import itertools
import logging
import random
import re
import socket
import ssl
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

from fsspec_shards import exception_chain
from fsspec_shards.config import is_int
from fsspec_shards.redact import clean_error, redact_text, redact_url

logger = logging.getLogger("fsspec_shards.storage")

T = TypeVar("T")

_TRANSIENT_STATUSES = frozenset({408, 429, 500, 502, 503, 504, 507, 509, 598, 599})
_TRANSIENT_ERRNOS = frozenset(
    {
        errno.EBUSY,  # s3fs: 503 SlowDown / ServiceUnavailable
        getattr(errno, "EREMOTEIO", errno.EIO),  # s3fs: 500 InternalError
        errno.ETIMEDOUT,
        errno.ECONNRESET,
        errno.ECONNREFUSED,
        errno.ECONNABORTED,
        errno.EPIPE,
        errno.EAGAIN,
        errno.ENETUNREACH,
        errno.EHOSTUNREACH,
    }
)


@dataclass(frozen=True)
class ErrorNames:
    """How one backend's library says what went wrong, as names (matched by name so that
    no optional backend library is imported here): exception class names (anywhere in the
    MRO) of network failures (``transient``), of a missing object (``not_found``) and of
    refused credentials (``denied``); error codes that mean "slow down, try again"
    (``throttle_codes``); exception classes whose ``.code`` is the HTTP status
    (``status_code_types``); message prefixes of a refusal (``denied_texts``) and of a bad
    request raised as ``ValueError`` (``invalid_texts``)."""

    transient: frozenset[str] = frozenset()
    not_found: frozenset[str] = frozenset()
    denied: frozenset[str] = frozenset()
    throttle_codes: frozenset[str] = frozenset()
    status_code_types: frozenset[str] = frozenset()
    denied_texts: tuple[str, ...] = ()
    invalid_texts: tuple[str, ...] = ()

    def __or__(self, other: ErrorNames) -> ErrorNames:
        return ErrorNames(
            self.transient | other.transient,
            self.not_found | other.not_found,
            self.denied | other.denied,
            self.throttle_codes | other.throttle_codes,
            self.status_code_types | other.status_code_types,
            self.denied_texts + other.denied_texts,
            self.invalid_texts + other.invalid_texts,
        )


_known = ErrorNames(transient=frozenset({"TransientError"}))  # a body shorter than asked for
"""The names of every backend learnt so far (:func:`learn`), and this package's own."""


def learn(names: ErrorNames) -> None:
    """Classify failures with ``names`` too (every backend's, once, when ``storage.backends``
    is imported)."""
    global _known
    _known = _known | names


class TransientError(OSError):
    """A failure worth retrying that no backend reported as such (e.g. a short body)."""


class RetriesExhaustedError(OSError):
    """A transient failure persisted through every attempt or past the deadline."""


_CHAIN_LINKS = 8
"""How many links of an exception's chain classification reads (a bound on the work per
failure; the backend's own error sits within the first few)."""


def _chain(exc: BaseException) -> Iterator[BaseException]:
    return itertools.islice(exception_chain.links(exc), _CHAIN_LINKS)


def _type_names(exc: BaseException) -> set[str]:
    return {cls.__name__ for cls in type(exc).__mro__}


_STATUS_ATTRS = ("status", "status_code")


def _status_in_code(exc: BaseException) -> bool:
    return type(exc).__name__ in _known.status_code_types


def http_status(exc: BaseException) -> int | None:
    """The HTTP status carried by ``exc`` or by an exception it was raised from, if any."""
    for link in _chain(exc):
        response = getattr(link, "response", None)
        if isinstance(response, dict):  # botocore ClientError
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if isinstance(status, int):
                return status
        # `.code` only where a backend says it is the status: aiohttp's payload errors carry a
        # parser code there
        attributes = ("status", "status_code", "code") if _status_in_code(link) else _STATUS_ATTRS
        for attribute in attributes:
            value = getattr(link, attribute, None)
            if isinstance(value, str) and value.isdigit():
                value = int(value)
            if is_int(value) and 100 <= value < 600:
                return value
    return None


def _error_code(exc: BaseException) -> str | None:
    for link in _chain(exc):
        response = getattr(link, "response", None)
        if isinstance(response, dict):
            code = response.get("Error", {}).get("Code")
            if code:
                return str(code)
        code = getattr(link, "error_code", None)  # azure-core
        if isinstance(code, str) and code:
            return code
    return None


_TLS_MISMATCH = re.compile(r"wrong.version.number|InvalidContentType", re.I)
_DNS_TEXT = re.compile(
    r"name or service not known|nodename nor servname|failed to lookup address|"
    r"temporary failure in name resolution|getaddrinfo failed|dns error",
    re.I,
)
_REFUSED_TEXT = re.compile(r"connection refused|connect call failed", re.I)


def connection_failure(exc: BaseException) -> str | None:
    """In words, when ``exc`` is a failure to connect: a TLS handshake that failed (``https``
    to a plain-HTTP server, a certificate that does not verify), a host name that does not
    resolve, or a refused connection; None otherwise. Backends bury these under their own
    errors (fsspec's HTTP filesystem under ``FileNotFoundError``), so the chain is searched."""
    links = list(_chain(exc))
    names = [_type_names(link) for link in links]
    host = next((h for h in map(_host_of, links) if h), "")
    at = f" {host}" if host else ""
    for link, types in zip(links, names, strict=True):
        if isinstance(link, ssl.SSLError) or "SSLError" in types or "ClientSSLError" in types:
            if isinstance(link, ssl.SSLCertVerificationError) or "CERTIFICATE" in str(link):
                return f"TLS with{at} failed: its certificate does not verify"
            if _TLS_MISMATCH.search(str(link)):
                return (
                    f"TLS handshake with{at} failed: it does not speak TLS "
                    "(a plain http:// server?)"
                )
    for link, types in zip(links, names, strict=True):
        if isinstance(link, socket.gaierror) or "ClientConnectorDNSError" in types:
            return f"the host name{at} does not resolve (DNS)"
    for link in links:
        if isinstance(link, ConnectionRefusedError) or getattr(link, "errno", None) == (
            errno.ECONNREFUSED
        ):
            return f"connection refused by{at}"
    text = " ".join(str(link) for link in links)  # obstore and others say it in words
    if _DNS_TEXT.search(text):
        return f"the host name{at} does not resolve (DNS)"
    if _REFUSED_TEXT.search(text):
        return f"connection refused by{at}"
    return None


def _host_of(link: BaseException) -> str | None:
    """``host:port`` of a connection error that names them (aiohttp's connector errors)."""
    host, port = getattr(link, "host", None), getattr(link, "port", None)
    if isinstance(host, str) and host:
        return f"{host}:{port}" if isinstance(port, int) else host
    return None


def _tls_is_permanent(exc: BaseException) -> bool:
    """A TLS failure retrying cannot fix: a plain-HTTP server, a certificate that fails."""
    cause = connection_failure(exc)
    return cause is not None and cause.startswith("TLS")


def is_transient(exc: BaseException) -> bool:
    """Whether retrying ``exc`` may succeed: network cuts, time-outs, 408/429/5xx, throttling."""
    if _tls_is_permanent(exc):
        return False
    for link in _chain(exc):
        if isinstance(link, ConnectionError | TimeoutError | EOFError):
            return True
        if _type_names(link) & _known.transient:
            return True
    if _error_code(exc) in _known.throttle_codes:
        return True
    status = http_status(exc)
    if status is not None:
        return status in _TRANSIENT_STATUSES
    return any(
        isinstance(link, OSError) and link.errno in _TRANSIENT_ERRNOS for link in _chain(exc)
    )


def describe(exc: BaseException, *hide: str) -> str:
    """A short, secret-free reason for logs and messages (``hide``: raw URLs or paths whose
    pieces the text may quote)."""
    status = http_status(exc)
    text = redact_text(str(exc), *hide).strip().replace("\n", " ")
    if len(text) > 200:
        text = text[:197] + "..."
    name = type(exc).__name__
    label = f"{name} HTTP {status}" if status is not None else name
    described = f"{label}: {text}" if text else label
    cause = connection_failure(exc)
    return f"{cause} ({described})" if cause else described


def permanent_error(exc: BaseException, url: str, *hide: str) -> BaseException:
    """``exc`` as the matching ``OSError`` subclass naming the redacted ``url``.

    Exceptions that are no storage failure at all (e.g. ``TypeError``) come back unchanged.
    """
    shown = redact_url(url)
    reason = describe(exc, url, *hide)
    status = http_status(exc)
    names = set().union(*(_type_names(link) for link in _chain(exc)))
    message = str(exc)
    if _tls_is_permanent(exc):  # before "not found": fsspec's HTTP wraps it in one
        return ConnectionError(errno.EPROTO, f"cannot connect for {shown}: {reason}")
    if status in (404, 410) or (status is None and isinstance(exc, FileNotFoundError)):
        return FileNotFoundError(errno.ENOENT, f"not found: {shown} ({reason})")
    if (
        status in (401, 403)
        or isinstance(exc, PermissionError)
        or names & _known.denied
        or message.startswith(_known.denied_texts)
    ):
        return PermissionError(errno.EACCES, f"permission denied: {shown} ({reason})")
    if names & _known.not_found:
        return FileNotFoundError(errno.ENOENT, f"not found: {shown} ({reason})")
    for kind in (IsADirectoryError, NotADirectoryError, FileExistsError):
        if isinstance(exc, kind):
            return kind(exc.errno, f"{exc.strerror or kind.__name__}: {shown} ({reason})")
    if status is not None:
        code = errno.EINVAL if 400 <= status < 500 else errno.EIO
        return OSError(code, f"request failed for {shown} ({reason})")
    if isinstance(exc, ValueError) and message.startswith(_known.invalid_texts):
        return OSError(errno.EINVAL, f"request failed for {shown} ({reason})")
    if isinstance(exc, OSError):
        return OSError(exc.errno or errno.EIO, f"request failed for {shown} ({reason})")
    return exc


@dataclass(frozen=True)
class RetryPolicy:
    """How hard to try: ``attempts`` per failure chain, exponential backoff with full jitter
    capped at ``max_backoff``, no retry once ``deadline`` seconds have passed since the chain's
    first failure, and ``timeout`` seconds for any single request before it counts as stalled.
    Built from the options (``StorageOptions.retry_policy``), where the defaults live.
    """

    attempts: int
    backoff: float
    max_backoff: float
    deadline: float
    timeout: float

    def delay(self, failure: int, rng: random.Random) -> float:
        """Seconds to wait after the ``failure``-th consecutive failure (1-based)."""
        ceiling = min(self.max_backoff, self.backoff * 2 ** (failure - 1))
        return rng.uniform(0.0, ceiling)

    def attempts_for(
        self,
        url: str,
        action: str,
        on_retry: Callable[[], None] | None = None,
        hide: tuple[str, ...] = (),
    ) -> Attempts:
        """A tracker for one operation that may fail, make progress and fail again."""
        return Attempts(self, url, action, on_retry, hide=hide)

    def call(
        self,
        fn: Callable[[], T],
        url: str,
        action: str,
        on_retry: Callable[[], None] | None = None,
        hide: tuple[str, ...] = (),
    ) -> T:
        """Run ``fn`` until it succeeds, a permanent error occurs, or the attempts are spent."""
        tracker = self.attempts_for(url, action, on_retry, hide)
        while True:
            try:
                return fn()
            except Exception as exc:
                error = exc
            tracker.failed(error)


class Attempts:
    """Counts consecutive failures of one operation; progress starts a new failure chain.

    ``url`` names the operation's object in messages (shown redacted); ``hide`` are raw URLs
    or paths whose pieces a backend's message may quote, hidden from what is raised.
    """

    def __init__(
        self,
        policy: RetryPolicy,
        url: str,
        action: str,
        on_retry: Callable[[], None] | None = None,
        rng: random.Random | None = None,
        sleep: Callable[[float], None] = time.sleep,
        hide: tuple[str, ...] = (),
    ) -> None:
        self.policy = policy
        self.url = url
        self.hide = (url, *hide)
        self.action = action
        self.on_retry = on_retry
        self.rng = rng or random.Random()
        self.sleep = sleep
        self.failures = 0
        self.chain_started: float | None = None

    def progressed(self) -> None:
        """The operation moved forward: the next failure starts a fresh chain."""
        self.failures = 0
        self.chain_started = None

    def failed(self, exc: BaseException) -> None:
        """Handle one failure: raise it (permanent, or attempts/deadline spent) or back off.

        Call it outside the ``except`` block that caught ``exc``: what it raises has ``exc``
        as its cause only when no link of that chain shows a secret."""
        shown = redact_url(self.url)
        if not is_transient(exc):
            converted = permanent_error(exc, self.url, *self.hide)
            if converted is not exc:
                converted.__cause__ = exc
            raise clean_error(converted, *self.hide)
        now = time.monotonic()
        if self.chain_started is None:
            self.chain_started = now
        self.failures += 1
        wait = self.policy.delay(self.failures, self.rng)
        spent = now - self.chain_started + wait > self.policy.deadline
        if self.failures >= self.policy.attempts or spent:
            limit = (
                f"{self.failures} attempts"
                if not spent
                else f"the {self.policy.deadline:g}s deadline"
            )
            error = RetriesExhaustedError(
                errno.EIO,
                f"{self.action} {shown} failed after {limit}: {describe(exc, *self.hide)}",
            )
            error.__cause__ = exc
            raise clean_error(error, *self.hide)
        logger.info(
            "retrying %s %s after %s (attempt %d of %d, waiting %.2fs)",
            self.action,
            shown,
            describe(exc, *self.hide),
            self.failures + 1,
            self.policy.attempts,
            wait,
        )
        if self.on_retry is not None:
            self.on_retry()
        self.sleep(wait)
