"""The links of an exception's ``__cause__``/``__context__`` chain, walked in one place.

Retry classification (:mod:`fsspec_shards.storage.retry`), secret scrubbing
(:mod:`fsspec_shards.redact`) and the cache's disk-full test
(:mod:`fsspec_shards.storage.cache.store`) all ask "does any exception this one was raised
from say X?". Neutral (imports nothing of the package), so storage and the top-level
modules can share it.
"""

from __future__ import annotations

from collections.abc import Iterator


def links(error: BaseException, *, follow_suppressed: bool = False) -> Iterator[BaseException]:
    """``error``, then the exception it was raised from, and so on: ``__cause__`` when set,
    else ``__context__``; each link once, so a cyclic chain ends.

    Like Python's traceback, a ``__context__`` hidden by ``raise ... from None``
    (``__suppress_context__``) ends the chain, unless ``follow_suppressed``: a caller that
    must see every object still reachable from ``error`` (a secret in a hidden context still
    leaves with it) asks for those too.
    """
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        if current.__cause__ is not None:
            current = current.__cause__
        elif follow_suppressed or not current.__suppress_context__:
            current = current.__context__
        else:
            current = None
