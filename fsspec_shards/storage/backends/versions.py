"""What identifies one version of an object, and checking a response against it.

The version rule, for every answer of every read (one stream, ranges in flight, a resume
after a cut, both transports):

- A :class:`Version` is taken from ``info()`` when a read starts (:func:`expected_version`
  knows each backend's fields); what that lacks, the first response fills in. Requests are
  conditional on it where the backend allows (``If-Match`` on a strong ETag, version id,
  generation). A block fill may start before ``info()`` is in (its size is the block
  manifest's): its first answer then names the version, and ``info()``, once in, must
  describe that version (:meth:`Version.agree`) or the object changed during the read.
- Adoption is atomic: answers that arrive together on several threads are checked and
  adopted one at a time (:meth:`Version.check` holds the version's lock), so of two answers
  of different versions the second is a :class:`VersionMismatch`, never adopted too.
- Every identity field an answer carries is compared with the expected one: size (the
  Content-Range total, a 200's length), ETag, version id / generation and, when the answer
  carries neither of those while the object has one, Last-Modified. A difference is a
  :class:`VersionMismatch`, never bytes.
- An answer that carries no identity field at all (no ETag, version id, generation or
  Last-Modified) while the object has an identity proves nothing: its bytes could be of
  another version of the same size (a server that ignores ``If-Match`` and leaves the
  ETag out). Its bytes are used only when they are the whole object from byte 0 in that one
  answer (nothing is spliced onto them); any other such answer raises :class:`Unproven`
  before a byte of it is used, and the caller falls back to one request from byte 0, or
  fails naming why. Two exceptions: a read whose every block is checked against a block
  manifest (``Version.blocks_checked``: the bytes are proven by their digests), and a
  transport that cannot carry identity at all (``Facts.says_version`` False: a backend read
  through ``cat_file``), whose caller asks ``info()`` again instead (``unconfirmed``).
- A partial response (206) must start at the byte asked for; otherwise it is a retryable
  :class:`~fsspec_shards.storage.core.retry.TransientError` and its bytes are not used.
- ETags compare by their opaque part (quotes and a weak marker aside); Last-Modified by whole
  seconds, as HTTP dates carry them.
"""

from __future__ import annotations

import datetime
import email.utils
import errno
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fsspec_shards.config import is_number
from fsspec_shards.storage.core.retry import TransientError

_CONTENT_RANGE = re.compile(r"^\s*bytes\s+(\d+)-(\d+)/(\d+|\*)\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class VersionFields:
    """The ``info()`` fields of one backend that name a version: each the first of its
    names present; a version id in ``no_version`` (or empty) means none."""

    etag: tuple[str, ...] = ()
    version: tuple[str, ...] = ()
    modified: tuple[str, ...] = ()
    no_version: tuple[str, ...] = ("",)

    def read(self, info: Mapping[str, Any]) -> tuple[Any, str | None, Any]:
        """``(etag, version id, modified)`` of ``info`` (None where absent)."""
        etag, version, modified = (
            next((info[name] for name in names if name in info), None)
            for names in (self.etag, self.version, self.modified)
        )
        if version is not None and str(version) in self.no_version:
            version = None
        return etag, None if version is None else str(version), modified


class VersionMismatch(OSError):
    """A response is of another version of the object than the one being read."""


class Unproven(OSError):
    """A response to a request for part of an object carries no identity field while the
    object has one: its bytes are not spliced onto bytes of the expected version (module
    docstring)."""


@dataclass(frozen=True)
class Facts:
    """What a response says about itself (None: not said)."""

    status: int | None = None
    start: int | None = None  # first byte, from Content-Range
    total: int | None = None  # the object's size: Content-Range total, or a 200's length
    etag: str | None = None
    version: str | None = None  # S3 version id, GCS generation, Azure version id
    modified: float | None = None  # Last-Modified, seconds since the epoch
    stop: int | None = None  # one past the last byte Content-Range labels
    says_version: bool = True  # False: the transport cannot carry identity (cat_file)


def _etag(value: Any) -> str | None:
    """An ETag compared by its opaque part: quotes and a weak marker do not matter."""
    if not value:
        return None
    text = str(value).strip()
    if text.startswith("W/"):
        text = text[2:]
    return text.strip('"') or None


def timestamp(value: Any) -> float | None:
    """Seconds since the epoch of a Last-Modified given as HTTP date text, a datetime or a
    number; whole seconds, as HTTP dates carry them."""
    if value is None or value == "":
        return None
    if isinstance(value, str):
        try:
            value = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            try:
                value = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
            except ValueError:
                return None
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=datetime.timezone.utc)
        return float(int(value.timestamp()))
    if is_number(value):
        return float(int(value))
    return None


class Version:
    """The version one read is of: size, ETag, version id / generation, Last-Modified.

    Taken from ``info()`` at the start of a download; what that lacks is filled in from the
    first response that says it. ``unconfirmed`` counts responses that carried nothing to
    compare with the strongest identity known (a transport that cannot say, or a whole
    answer that proved nothing): the caller then checks the version through ``info()``.
    """

    def __init__(
        self,
        size: int | None = None,
        etag: str | None = None,
        version: str | None = None,
        modified: float | None = None,
    ) -> None:
        self.size = size
        self.etag = etag  # as the server sent it, quotes included (If-Match wants them)
        self.version = version
        self.modified = modified
        self.unconfirmed = 0
        self.blocks_checked = False
        """Every byte read is checked against a block manifest: answers need not prove
        their version (a block of other bytes fails its digest)."""
        self.unproven_whole = False
        """An answer of the whole object that proved no version was used: a cut in it
        cannot be resumed (the read starts over from byte 0)."""
        self._lock = threading.Lock()  # (answers to concurrent requests: one at a time)

    def __repr__(self) -> str:
        return (
            f"Version(size={self.size}, etag={self.etag!r}, version={self.version!r}, "
            f"modified={self.modified})"
        )

    @property
    def identified(self) -> bool:
        """Whether anything beyond the size tells this version from another of that size."""
        return bool(self.etag or self.version or self.modified is not None)

    @property
    def strong_etag(self) -> str | None:
        """The ETag for an ``If-Match`` header (a weak one never matches there)."""
        if self.etag and not str(self.etag).startswith("W/"):
            text = str(self.etag)
            return text if text.startswith('"') else f'"{text}"'
        return None

    def check(self, facts: Facts, start: int = 0, whole: bool = False) -> None:
        """Raise :class:`VersionMismatch` if ``facts`` show another version, and
        :class:`Unproven` if they show none while this version has an identity and the
        answer is not ``whole`` (the whole object from byte 0), or if the answer (for bytes
        from ``start``) would be spliced onto such a whole answer accepted before; else
        adopt what they say that this lacks."""
        with self._lock:
            mismatch = self._difference(facts)
            if mismatch is not None:
                raise VersionMismatch(errno.ESTALE, mismatch)
            if not self.blocks_checked:
                self._check_proof(facts, start, whole)
            if not self._confirmed_by(facts):
                self.unconfirmed += 1
            self._adopt(facts)

    def agree(self, described: Version) -> None:
        """Adopt what ``described`` (the version a fresh ``info()`` describes) says that this
        lacks; :class:`VersionMismatch` if it is another version than the answers so far
        were of (the object changed during the read). Atomic with :meth:`check`."""
        with self._lock:
            mismatch = self._difference(_facts_of(described))
            if mismatch is not None:
                raise VersionMismatch(errno.ESTALE, f"its info() says {mismatch}")
            self._adopt(_facts_of(described))

    def _adopt(self, facts: Facts) -> None:
        if self.size is None:
            self.size = facts.total
        if not self.etag:
            self.etag = facts.etag
        if not self.version:
            self.version = facts.version
        if self.modified is None:
            self.modified = facts.modified

    def matches(self, info_version: Version) -> bool:
        """Whether ``info_version`` (from a fresh ``info()``) describes this version: what a
        caller checks when responses said nothing of their version."""
        return self._difference(_facts_of(info_version)) is None

    def _difference(self, facts: Facts) -> str | None:
        """How ``facts`` show another version, or None."""
        if self.size is not None and facts.total is not None and facts.total != self.size:
            return f"size {facts.total}, expected {self.size}"
        if self.etag and facts.etag and _etag(self.etag) != _etag(facts.etag):
            return f"ETag {facts.etag}, expected {self.etag}"
        if self.version and facts.version and str(self.version) != str(facts.version):
            return f"version {facts.version}, expected {self.version}"
        proven = (self.etag and facts.etag) or (self.version and facts.version)
        if (
            not proven
            and self.modified is not None
            and facts.modified is not None
            and self.modified != facts.modified
        ):
            return "Last-Modified differs"
        return None

    def _check_proof(self, facts: Facts, start: int, whole: bool) -> None:
        if start > 0 and self.unproven_whole:
            raise Unproven(
                errno.ESTALE,
                "the answer these bytes would follow carried no ETag, version or "
                "Last-Modified: nothing may be spliced onto it",
            )
        if facts.says_version and self.identified and not self._carried(facts):
            if not whole:
                raise Unproven(
                    errno.ESTALE,
                    "an answer carries no ETag, version or Last-Modified though the object "
                    f"has {self._identity_shown()}: its bytes could be another version's",
                )
            self.unproven_whole = True

    def _carried(self, facts: Facts) -> bool:
        """Whether ``facts`` carry an identity field this version has (compared already)."""
        return bool(
            (self.etag and facts.etag)
            or (self.version and facts.version)
            or (self.modified is not None and facts.modified is not None)
        )

    def _identity_shown(self) -> str:
        if self.etag:
            return f"ETag {self.etag}"
        if self.version:
            return f"version {self.version}"
        return "a Last-Modified"

    def _confirmed_by(self, facts: Facts) -> bool:
        if self.etag:
            return facts.etag is not None
        if self.version:
            return facts.version is not None
        if self.modified is not None:
            return facts.modified is not None
        return facts.total is not None


def _facts_of(version: Version) -> Facts:
    """What an answer carrying exactly ``version``'s fields would say."""
    return Facts(
        total=version.size, etag=version.etag, version=version.version, modified=version.modified
    )


def parse_content_range(value: str | None) -> tuple[int | None, int | None, int | None]:
    """First byte, one past the last byte, and total of a ``Content-Range: bytes
    a-b/total`` header (``None``s where it is missing or malformed)."""
    match = _CONTENT_RANGE.match(value or "")
    if match is None:
        return None, None, None
    total = match.group(3)
    return int(match.group(1)), int(match.group(2)) + 1, (None if total == "*" else int(total))


def facts_from_headers(
    status: int, headers: Any, version_header: str | None = None, length_header: str = ""
) -> Facts:
    """Facts of an HTTP response from its headers (a case-insensitive mapping)."""
    start, stop, total = parse_content_range(headers.get("Content-Range"))
    if status == 200 and not headers.get("Content-Encoding"):
        length = headers.get(length_header or "Content-Length")
        total = int(length) if length and str(length).isdigit() else None
    return Facts(
        status=status,
        start=start,
        stop=stop,
        total=total,
        etag=headers.get("ETag"),
        version=headers.get(version_header) if version_header else None,
        modified=timestamp(headers.get("Last-Modified")),
    )


def check_response(facts: Facts, start: int, expect: Version | None) -> None:
    """Refuse a response whose bytes are not the ones asked for (see the module docstring)."""
    if facts.status == 206:
        if facts.start is None:
            raise TransientError(errno.EIO, "a partial response without a valid Content-Range")
        if facts.start != start:
            raise TransientError(
                errno.EIO, f"Content-Range starts at byte {facts.start}, asked for {start}"
            )
    if expect is not None:
        whole = start == 0 and (
            facts.status == 200
            or (facts.stop is not None and facts.total is not None and facts.stop >= facts.total)
        )
        expect.check(facts, start, whole)


def expected_version(fields: VersionFields, info: dict[str, Any]) -> Version:
    """The version ``info()`` describes, in the backend's own ``fields`` (its
    ``Backend.version_fields``)."""
    etag, version, modified = fields.read(info)
    return Version(info.get("size"), etag, version, timestamp(modified))
