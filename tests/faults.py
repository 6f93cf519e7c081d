"""The fault vocabulary: what a test plans for one answer of a storage backend.

Every fault injector of the tests reads these actions: the memory filesystem of
:mod:`tests.planned_faults`, the scripted responses of ``tests/test_target.py``, and on
loopback the fault proxy (:mod:`tests.integration.fault_proxy`) and the hostile HTTP server
(:mod:`tests.integration.hostile_http`). Each takes the actions it can carry out and adds
its own (a server's ``WrongStart``, a scripted response's ``Paced``). Offsets and byte
counts are of the body handed over (the payload, not chunk framing).
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Pass:
    """Answer as asked, untouched."""

    def __str__(self) -> str:
        return "pass"


@dataclasses.dataclass(frozen=True)
class Cut:
    """Hand over ``after_bytes`` bytes of the body, then the connection breaks (FIN)."""

    after_bytes: int

    def __str__(self) -> str:
        return f"cut({self.after_bytes})"


@dataclasses.dataclass(frozen=True)
class Reset:
    """Reset the connection (RST): on receipt of the request when ``after_bytes`` is None,
    else after that many bytes of the body."""

    after_bytes: int | None = None

    def __str__(self) -> str:
        return "reset" if self.after_bytes is None else f"reset({self.after_bytes})"


@dataclasses.dataclass(frozen=True)
class Short:
    """Hand over only ``length`` bytes, then end the body as if it were whole."""

    length: int


@dataclasses.dataclass(frozen=True)
class Stall:
    """Send the headers and ``after_bytes`` body bytes, then nothing for ``seconds``, then
    the rest (if the client is still there)."""

    seconds: float
    after_bytes: int = 0

    def __str__(self) -> str:
        return f"stall({self.seconds}, after_bytes={self.after_bytes})"


@dataclasses.dataclass(frozen=True)
class Delay:
    """Hold the request for ``seconds`` before answering it."""

    seconds: float

    def __str__(self) -> str:
        return f"delay({self.seconds})"


@dataclasses.dataclass(frozen=True)
class Flip:
    """Invert every bit of the byte at ``offset``: of the response body behind a proxy, of
    the object in a planned read (when the range holds it)."""

    offset: int

    def __str__(self) -> str:
        return f"flip({self.offset})"


@dataclasses.dataclass(frozen=True)
class Status:
    """Answer with ``code`` (and ``Retry-After``, if given) without asking the server."""

    code: int
    retry_after: float | None = None
    body: bytes | None = None

    def __str__(self) -> str:
        suffix = "" if self.retry_after is None else f", retry_after={self.retry_after}"
        return f"status({self.code}{suffix})"

    def response_body(self) -> bytes:
        if self.body is not None:
            return self.body
        return f"fault proxy: injected {self.code}\n".encode()


@dataclasses.dataclass(frozen=True)
class WholeBody:
    """Answer a range request with the whole object (the Range ignored, as a server that
    does not support it)."""


@dataclasses.dataclass(frozen=True)
class Replace:
    """Replace the object with ``data`` (a new version), then answer."""

    data: bytes = dataclasses.field(repr=False)
