"""Warnings of a cache that works in a degraded mode: each said once per process."""

from __future__ import annotations

import threading
import warnings

_SAID: set[tuple[str, str]] = set()
_SAID_LOCK = threading.Lock()


class CacheWarning(UserWarning):
    """The cache works in a degraded mode (read-only, rebuilt index, entries ignored)."""


def warn_once(path: str, topic: str, message: str) -> None:
    """Warn ``message`` (which names ``path``) the first time ``(path, topic)`` comes up."""
    with _SAID_LOCK:
        if (path, topic) in _SAID:
            return
        _SAID.add((path, topic))
    warnings.warn(message, CacheWarning, stacklevel=4)
