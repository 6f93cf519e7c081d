"""The ``wds`` storage layer: :class:`WdsFileSystem` and what the rest of the package may use
of it.

The folders below this one (``deps``, ``core``, ``backends``, ``transfer``, ``cache``) are
the layer's inside; the rest of the package (``fleet/``, ``cli/``) takes only the names
listed here, or goes through the fsspec protocol. They load on first use, so that importing
one storage module does not load them all.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fsspec_shards.storage.cache.store import ShardCache
    from fsspec_shards.storage.cache.trust import CacheDirectoryError, NotACacheError
    from fsspec_shards.storage.core.integrity import Manifest, load_manifest
    from fsspec_shards.storage.core.options import OPTIONS, default_of
    from fsspec_shards.storage.filesystem import WdsFileSystem
    from fsspec_shards.storage.read_checks import backend_checks

_HOMES = {
    "CacheDirectoryError": "fsspec_shards.storage.cache.trust",
    "Manifest": "fsspec_shards.storage.core.integrity",
    "NotACacheError": "fsspec_shards.storage.cache.trust",
    "OPTIONS": "fsspec_shards.storage.core.options",
    "ShardCache": "fsspec_shards.storage.cache.store",
    "WdsFileSystem": "fsspec_shards.storage.filesystem",
    "backend_checks": "fsspec_shards.storage.read_checks",
    "default_of": "fsspec_shards.storage.core.options",
    "load_manifest": "fsspec_shards.storage.core.integrity",
}

__all__ = [
    "CacheDirectoryError",
    "Manifest",
    "NotACacheError",
    "OPTIONS",
    "ShardCache",
    "WdsFileSystem",
    "backend_checks",
    "default_of",
    "load_manifest",
]


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(import_module(_HOMES[name]), name)
    raise AttributeError(f"module 'fsspec_shards.storage' has no attribute {name!r}")
