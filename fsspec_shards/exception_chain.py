"""The links of an exception's ``__cause__``/``__context__`` chain, walked in one place.

Retry classification (:mod:`fsspec_shards.storage.core.retry`), secret scrubbing
(:mod:`fsspec_shards.redact`) and the cache's disk-full test
(:mod:`fsspec_shards.storage.cache.space`) all ask "does any exception this one was raised
from say X?". Neutral (imports nothing of the package), so storage and the top-level
modules can share it.
"""

from __future__ import annotations

from collections.abc import Iterator


def links(error: BaseException, *, follow_suppressed: bool = False) -> Iterator[BaseException]:
    """``error``, then the exception it was raised from, and so on: ``__cause__`` when set,
    else ``__context__``; each link once, so a cyclic chain ends.

    Like Python's traceback, a ``__context__`` hidden by ``raise ... from`` (``from None``
    or an explicit cause: ``__suppress_context__``) is not followed, unless
    ``follow_suppressed``: a caller that must see every exception still reachable from
    ``error`` (a secret in a hidden context still leaves with it) then gets each link's
    cause and its context too, cause first, depth first.
    """
    seen: set[int] = set()
    waiting: list[BaseException] = [error]
    while waiting:
        current = waiting.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        if follow_suppressed:
            after = [current.__context__, current.__cause__]  # popped: the cause first
        elif current.__cause__ is not None:
            after = [current.__cause__]
        else:
            after = [None if current.__suppress_context__ else current.__context__]
        waiting.extend(link for link in after if link is not None)
