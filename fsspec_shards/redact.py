"""What of a URL is secret, and keeping it out of everything the library shows.

Invariants:

- Display text (messages, logs, stats, CLI output, cache metadata) shows every query value
  and every URL password as ``REDACTED``; parameter names, hosts and paths stay readable.
  No list of "secret" names decides: any query value may be a token.
- An exception that leaves the library carries no secret anywhere in its
  ``__cause__``/``__context__`` chain (:func:`clean_error`): error reporters walk the chain,
  and ``raise ... from None`` only hides the context from tracebacks.
- While a ``wds`` filesystem is in use, log records of the backend libraries it drives (and
  ours) are redacted before any handler sees them (:func:`install_log_redaction`);
  ``FSSPEC_SHARDS_REDACT_LOGS=0`` turns that off. The rule: a library installs no handler and
  no process-wide hook (no LogRecord factory, no root configuration), so redaction is a
  :class:`logging.Filter` attached to the *loggers* of :data:`BACKEND_LOGGERS`, each one that
  exists when a ``wds`` filesystem is made (a logger's filters see only the records logged
  on it, not those its children propagate, so each child gets the filter too; a logger made
  later is covered from the next ``wds`` filesystem on). Never on handlers: they are the
  application's. A record is never dropped and never leaves with a secret: one whose
  message cannot be formatted keeps its redacted text and arguments as its message, and an
  exception whose chain shows a secret is replaced by its redacted text.
- Signing parameters (:func:`is_signing_parameter`, recognised by structure: AWS SigV4/V2,
  GCS V4/V2, Azure SAS, CloudFront) are what changes when the same object's URL is signed
  again; :func:`without_signing` drops them, so identities ignore re-signing. Every other
  query parameter (``?key=``, ``?id=``, ``?token=``) may select content and is kept.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Callable
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from fsspec_shards import exception_chain

REDACTED = "REDACTED"

BACKEND_LOGGERS = (
    "fsspec",
    "s3fs",
    "aiobotocore",
    "gcsfs",
    "adlfs",
    "aiohttp",
    "azure",
    "botocore",
    "urllib3",
    "obstore",
    "fsspec_shards",
)
"""Names of the loggers (with their children) whose records are redacted."""

_AZURE_SAS = frozenset(
    [
        "sv",
        "ss",
        "srt",
        "sp",
        "se",
        "st",
        "spr",
        "sig",
        "sr",
        "si",
        "skoid",
        "sktid",
        "skt",
        "ske",
        "sks",
        "skv",
        "sdd",
        "ses",
    ]
)
_AWS_V2 = frozenset({"awsaccesskeyid", "signature", "expires"})
_GCS_V2 = frozenset({"googleaccessid", "signature", "expires"})
_CLOUDFRONT = frozenset({"policy", "signature", "key-pair-id", "expires"})
# a URL in text: it does not end in punctuation ("not found: http://h/k?sig=x: reason")
_URL_RE = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>()\[\]{}]*[^\s'\"<>()\[\]{}.,;:!?]")
_QUERY_IN_TEXT_RE = re.compile(
    r"\?([^\s'\"<>?#()\[\]{}]*=(?:[^\s'\"<>#()\[\]{}]*[^\s'\"<>#()\[\]{}.,;:!?])?)"
)


def _redact_query(query: str) -> str:
    pairs = parse_qsl(query, keep_blank_values=True)
    if not pairs:
        return REDACTED if query else query
    return urlencode([(name, REDACTED) for name, _ in pairs], safe=REDACTED)


def _redact_netloc(netloc: str) -> str:
    if "@" not in netloc:
        return netloc
    userinfo, host = netloc.rsplit("@", 1)
    user = userinfo.split(":", 1)[0]
    return f"{user}:{REDACTED}@{host}" if ":" in userinfo else f"{REDACTED}@{host}"


def redact_url(url: str) -> str:
    """``url`` for display: every query value and the userinfo password as ``REDACTED``.

    Works on chained fsspec URLs (``wds::s3://...``) and on backend paths with a query.
    """
    if not isinstance(url, str):
        return url
    if "::" in url:
        return "::".join(redact_url(part) for part in url.split("::"))
    if "?" not in url and "@" not in url:
        return url
    if "://" not in url:
        path, _, query = url.partition("?")
        return f"{path}?{_redact_query(query)}" if query else url
    try:
        parts = urlsplit(url)
    except ValueError:
        return url.split("?", 1)[0].split("@")[-1] + ("?" + REDACTED if "?" in url else "")
    shown = f"{parts.scheme}://{_redact_netloc(parts.netloc)}{parts.path}"
    if parts.query:
        shown += "?" + _redact_query(parts.query)
    return shown + (f"#{parts.fragment}" if parts.fragment else "")


def redact_text(text: str, *urls: str) -> str:
    """``text`` with every URL in it redacted, and any query string it quotes without a
    scheme (fsspec errors quote backend paths). ``urls`` known to appear in the text are
    also hidden where they are quoted in pieces (the query alone, the netloc alone)."""
    if not isinstance(text, str):
        text = str(text)
    for url in urls:
        for part in str(url).split("::"):
            try:
                original = urlsplit(part)
            except ValueError:
                continue
            if original.query:
                text = text.replace(original.query, _redact_query(original.query))
            if "@" in original.netloc:
                text = text.replace(original.netloc, _redact_netloc(original.netloc))
    text = _URL_RE.sub(lambda match: redact_url(match.group(0)), text)
    return _QUERY_IN_TEXT_RE.sub(lambda match: "?" + _redact_query(match.group(1)), text)


# A header whose name says it carries a credential (Authorization, X-Amz-Security-Token,
# X-Api-Key, Cookie, x-amz-server-side-encryption-customer-key, ...): log text only.
_SECRET_HEADER = (
    r"[A-Za-z0-9_-]*"
    r"(?:auth|token|secret|signature|credential|passw|cookie|session|key|sas)"
    r"[A-Za-z0-9_-]*"
)
# 'Name': b'value' (a headers dict or a list of pairs, as botocore's request dumps show it)
_QUOTED_HEADER_RE = re.compile(
    rf"(?P<name>(?P<quote>['\"]){_SECRET_HEADER}(?P=quote)\s*[:,]\s*b?)"
    r"(?P<value>'(?:\\.|[^'\\])*'|\"(?:\\.|[^\"\\])*\")",
    re.IGNORECASE,
)
# name:value lines (a canonical request's signed headers, raw HTTP headers), and
# botocore's "Signature:" line whose value is on the next line
_HEADER_LINE_RE = re.compile(
    rf"^(?P<name>[ \t]*{_SECRET_HEADER}[ \t]*:)"
    r"(?P<gap>[ \t]*(?:\r?\n[ \t]*)?)(?P<value>\S[^\r\n]*)",
    re.IGNORECASE | re.MULTILINE,
)
# a canonical request's query line: name=value pairs without a "?" (two at least)
_QUERY_LINE_RE = re.compile(r"^[^\s=&?]+=[^\s&]*(?:&[^\s=&]+=[^\s&]*)+$", re.MULTILINE)


def redact_log_text(text: str) -> str:
    """``text`` of a log record with its URLs redacted (:func:`redact_text`) and the values
    of headers that carry credentials, in a headers dump or a signed (canonical) request."""
    text = redact_text(text)
    if "=" in text:
        text = _QUERY_LINE_RE.sub(lambda match: _redact_query(match.group(0)), text)
    text = _QUOTED_HEADER_RE.sub(lambda match: f"{match.group('name')}'{REDACTED}'", text)
    return _HEADER_LINE_RE.sub(
        lambda match: f"{match.group('name')}{match.group('gap')}{REDACTED}", text
    )


def shows_secret(text: str) -> bool:
    """Whether ``text`` would change under :func:`redact_text`."""
    return redact_text(text) != text


def _link_shows_secret(error: BaseException, urls: tuple[str, ...]) -> bool:
    text = str(error)
    notes = "\n".join(getattr(error, "__notes__", []) or [])
    return redact_text(text, *urls) != text or (bool(notes) and redact_text(notes) != notes)


def clean_error(error: BaseException, *urls: str) -> BaseException:
    """``error`` safe to raise past the library: no link of its cause/context chain shows a
    secret (any URL's query values or password, or a piece of ``urls``).

    Every cause or context (hidden ones too) that shows one is cut off, with what hangs
    from it. If ``error`` itself shows one, a copy of its type (else an ``OSError``) with
    redacted text replaces it. Raise the result outside any ``except`` block, or Python
    chains the handled exception again.
    """
    if _link_shows_secret(error, urls):
        error = _redacted_copy(error, urls)
    for link in list(exception_chain.links(error, follow_suppressed=True)):
        if link.__cause__ is not None and _link_shows_secret(link.__cause__, urls):
            link.__cause__ = None
            link.__suppress_context__ = True
        if link.__context__ is not None and _link_shows_secret(link.__context__, urls):
            link.__context__ = None
            link.__suppress_context__ = True
    return error


def _redacted_copy(error: BaseException, urls: tuple[str, ...]) -> BaseException:
    text = redact_text(str(error), *urls)
    errno_value = getattr(error, "errno", None)
    try:
        if isinstance(error, OSError) and errno_value is not None:
            copy = type(error)(errno_value, text)
        else:
            copy = type(error)(text)
    except Exception:
        copy = OSError(errno_value, text) if errno_value is not None else OSError(text)
    if str(copy) != text and not (isinstance(copy, OSError) and text in str(copy)):
        copy = OSError(errno_value, text) if errno_value is not None else OSError(text)
    copy.__suppress_context__ = True
    return copy.with_traceback(error.__traceback__)


def raising_clean(function: Callable) -> Callable:
    """Decorator: an exception from ``function`` leaves it through :func:`clean_error`,
    raised outside the ``except`` block so that nothing is chained again."""

    def wrapper(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except Exception as exc:
            error = exc
        raise clean_error(error)

    wrapper.__name__ = function.__name__
    wrapper.__qualname__ = function.__qualname__
    wrapper.__doc__ = function.__doc__
    wrapper.__wrapped__ = function
    return wrapper


def is_signing_parameter(name: str, names: frozenset[str]) -> bool:
    """Whether query parameter ``name`` is part of a URL signature, given all ``names``
    (lower case) of its query: signatures are recognised by their structure."""
    lower = name.lower()
    if lower.startswith(("x-amz-", "x-goog-")):
        return True
    if "sig" in names and lower in _AZURE_SAS and names & {"sv", "se", "sp"}:
        return True
    if "signature" in names:
        if "awsaccesskeyid" in names and lower in _AWS_V2:
            return True
        if "googleaccessid" in names and lower in _GCS_V2:
            return True
        if "key-pair-id" in names and lower in _CLOUDFRONT:
            return True
    return False


def without_signing(url: str) -> str:
    """``url`` without its signing parameters (and without userinfo); the remaining query
    parameters sorted, so that a URL signed again, or its parameters reordered, compares
    equal. The result can still hold secrets (a ``?token=`` selector): never display it."""
    if "::" in url:
        return "::".join(without_signing(part) for part in url.split("::"))
    if "?" not in url and "@" not in url:
        return url
    try:
        parts = urlsplit(url) if "://" in url else urlsplit("//" + url)._replace(netloc="")
    except ValueError:
        return url
    if "://" not in url:
        path, _, query = url.partition("?")
        parts = parts._replace(path=path, query=query)
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    names = frozenset(name.lower() for name, _ in pairs)
    kept = sorted((n, v) for n, v in pairs if not is_signing_parameter(n, names))
    netloc = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit((parts.scheme, netloc, parts.path, urlencode(kept), parts.fragment))


def _text(value: object) -> str:
    """``str(value)``, or a placeholder when its ``__str__`` fails: logs never raise."""
    try:
        return str(value)
    except Exception:
        return f"<unprintable {type(value).__name__}>"


def redact_record(record: logging.LogRecord) -> None:
    """Redact ``record`` in place: its message (formatted with its arguments, or, when that
    fails, the text of both) and its exception, when any link of the exception's chain
    shows a secret."""
    try:
        message = record.getMessage()
        formatted = True
    except Exception:  # logging would print the raw msg and args when it fails to format
        message, formatted = f"{_text(record.msg)} (arguments: {_text(record.args)})", False
    shown = redact_log_text(message)
    if shown != message or not formatted:
        record.msg, record.args = shown, None
    error = record.exc_info[1] if record.exc_info else None
    if error is not None and any(
        shows_secret(_text(link)) for link in exception_chain.links(error, follow_suppressed=True)
    ):
        record.msg = f"{shown} ({type(error).__name__}: {redact_text(_text(error))})"
        record.args = None
        record.exc_info = None
        record.exc_text = None


class RedactingFilter(logging.Filter):
    """A logger filter that redacts each record (:func:`redact_record`) and drops none."""

    def filter(self, record: logging.LogRecord) -> bool:
        if _enabled:
            redact_record(record)
        return True


_FILTER = RedactingFilter()


_enabled = os.environ.get("FSSPEC_SHARDS_REDACT_LOGS", "1").strip().lower() not in (
    "0",
    "false",
    "no",
    "off",
)
_install_lock = threading.Lock()


def install_log_redaction() -> None:
    """Attach the redacting filter to every logger of :data:`BACKEND_LOGGERS` (and their
    children) that exists now; idempotent. Off with ``FSSPEC_SHARDS_REDACT_LOGS=0`` or
    :func:`set_log_redaction`."""
    with _install_lock:
        for name, logger in list(logging.Logger.manager.loggerDict.items()):
            if (
                isinstance(logger, logging.Logger)
                and name.split(".", 1)[0] in BACKEND_LOGGERS
                and _FILTER not in logger.filters
            ):
                logger.addFilter(_FILTER)


def set_log_redaction(enabled: bool) -> None:
    """Turn the redaction of backend log records on or off for this process."""
    global _enabled
    _enabled = bool(enabled)
    if enabled:
        install_log_redaction()
