"""What identifies one version of an object, and checking a response against it.

Invariants:

- A :class:`Version` is taken from ``info()`` when a read starts (:func:`expected_version`
  knows each backend's fields); what that lacks, the first response fills in. From then on
  every response of the read must agree with it: same size (Content-Range total), same ETag,
  same version id / generation, and, when neither of those exists, the same Last-Modified.
  A difference is a :class:`VersionMismatch`, never bytes.
- A partial response (206) must start at the byte asked for; otherwise it is a retryable
  :class:`~fsspec_shards.storage.retry.TransientError` and its bytes are not used.
- ETags compare by their opaque part (quotes and a weak marker aside); Last-Modified by whole
  seconds, as HTTP dates carry them.
"""

from __future__ import annotations

import datetime
import email.utils
import errno
import re
from dataclasses import dataclass
from typing import Any

from fsspec_shards.config import is_number
from fsspec_shards.storage.backends import backend_of
from fsspec_shards.storage.retry import TransientError

_CONTENT_RANGE = re.compile(r"^\s*bytes\s+(\d+)-(\d+)/(\d+|\*)\s*$", re.IGNORECASE)


class VersionMismatch(OSError):
    """A response is of another version of the object than the one being read."""


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
    if is_number(value):
        return float(int(value))
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
    return None


class Version:
    """The version one read is of: size, ETag, version id / generation, Last-Modified.

    Taken from ``info()`` at the start of a download; what that lacks is filled in from the
    first response that says it. ``unconfirmed`` counts responses that carried nothing to
    compare with the strongest identity known (a backend without facts, or a server that
    sends no ETag): the caller then checks the version through ``info()``.
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

    def check(self, facts: Facts) -> None:
        """Raise :class:`VersionMismatch` if ``facts`` show another version; else adopt what
        they say that this lacks."""
        mismatch = self._difference(facts)
        if mismatch is not None:
            raise VersionMismatch(errno.ESTALE, mismatch)
        if not self._confirmed_by(facts):
            self.unconfirmed += 1
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
        described = Facts(
            total=info_version.size,
            etag=info_version.etag,
            version=info_version.version,
            modified=info_version.modified,
        )
        return self._difference(described) is None

    def _difference(self, facts: Facts) -> str | None:
        """How ``facts`` show another version, or None."""
        if self.size is not None and facts.total is not None and facts.total != self.size:
            return f"size {facts.total}, expected {self.size}"
        if self.etag and facts.etag and _etag(self.etag) != _etag(facts.etag):
            return f"ETag {facts.etag}, expected {self.etag}"
        if self.version and facts.version and str(self.version) != str(facts.version):
            return f"version {facts.version}, expected {self.version}"
        if (
            not self.etag
            and not self.version
            and self.modified is not None
            and facts.modified is not None
            and self.modified != facts.modified
        ):
            return "Last-Modified differs"
        return None

    def _confirmed_by(self, facts: Facts) -> bool:
        if self.etag:
            return facts.etag is not None
        if self.version:
            return facts.version is not None
        if self.modified is not None:
            return facts.modified is not None
        return facts.total is not None


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
        expect.check(facts)


def expected_version(protocol: str, info: dict[str, Any]) -> Version:
    """The version ``info()`` describes, in the backend's own fields (its module's
    ``VERSION_FIELDS``)."""
    etag, version, modified = backend_of(protocol).VERSION_FIELDS.read(info)
    return Version(info.get("size"), etag, version, timestamp(modified))
