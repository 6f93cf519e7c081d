"""Exceptions shared by the storage and iteration layers."""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from fsspec_shards.redact import redact_url

# Query parameters that carry credentials in pre-signed / SAS / token URLs.
_SECRET_QUERY_KEYS = frozenset(
    {
        "x-amz-signature",
        "x-amz-credential",
        "x-amz-security-token",
        "signature",
        "awsaccesskeyid",
        "x-goog-signature",
        "x-goog-credential",
        "googleaccessid",
        "sig",
        "sv",
        "se",
        "st",
        "sp",
        "spr",
        "srt",
        "ss",
        "sr",
        "skoid",
        "sktid",
        "skt",
        "ske",
        "sks",
        "skv",
        "token",
        "access_token",
        "key",
        "api_key",
        "apikey",
        "password",
        "secret",
    }
)

# Query parameters that are no secret but change each time a URL is signed (date, expiry,
# signing algorithm...): dropped from cache keys, so that a URL signed again is the same object.
_SIGNING_QUERY_KEYS = frozenset(
    {
        "x-amz-algorithm",
        "x-amz-date",
        "x-amz-expires",
        "x-amz-signedheaders",
        "x-goog-algorithm",
        "x-goog-date",
        "x-goog-expires",
        "x-goog-signedheaders",
        "expires",
        "policy",
        "key-pair-id",
    }
)


class IntegrityError(OSError):
    """Bytes from storage did not match the expected size or checksum."""

    def __init__(self, url: str, expected: str, actual: str, detail: str = "") -> None:
        self.url = redact_url(url)
        self.expected = expected
        self.actual = actual
        self.detail = detail
        message = f"integrity check failed for {self.url}: expected {expected}, got {actual}"
        if detail:
            message += f" ({detail})"
        super().__init__(message)

    def __reduce__(self):
        return (type(self), (self.url, self.expected, self.actual, self.detail))


class ShardFormatError(ValueError):
    """A shard is not a well-formed tar archive."""

    def __init__(self, shard: str, offset: int, reason: str) -> None:
        self.shard = redact_url(shard)
        self.offset = offset
        self.reason = reason
        super().__init__(f"malformed tar shard {self.shard} at byte {offset}: {reason}")

    def __reduce__(self):
        return (type(self), (self.shard, self.offset, self.reason))


def strip_secrets(url: str) -> str:
    """Return ``url`` without user info, credential-bearing query parameters and those that
    change each time a URL is signed (date, expiry).

    Used to derive cache keys: two signed URLs of the same object map to one key.
    """
    if "::" in url:
        return "::".join(strip_secrets(part) for part in url.split("::"))
    if "://" not in url and "?" not in url:
        return url
    parts = urlsplit(url)
    if "@" not in parts.netloc and not parts.query:
        return url
    netloc = parts.netloc.rsplit("@", 1)[-1]
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    dropped = _SECRET_QUERY_KEYS | _SIGNING_QUERY_KEYS
    query = urlencode([(k, v) for k, v in pairs if k.lower() not in dropped])
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
