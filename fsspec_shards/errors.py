"""Exceptions shared by the storage and iteration layers."""

from __future__ import annotations

from fsspec_shards.redact import redact_url


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


class OptionError(ValueError):
    """A storage option no filesystem of the chain takes; ``option`` names it as
    ``PROTOCOL.KEY`` (``s3.endpoint_urll``), checked when the filesystem is made."""

    def __init__(self, option: str, reason: str) -> None:
        self.option = option
        self.reason = reason
        super().__init__(f"invalid storage option {option}: {reason}")

    def __reduce__(self):
        return (type(self), (self.option, self.reason))
