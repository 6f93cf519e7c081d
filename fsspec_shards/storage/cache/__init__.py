"""The shard cache: whole, verified files on local disk, shared by any number of processes.

:class:`ShardCache` (:mod:`.store`) keeps the files; :mod:`.trust` decides which directories
it uses, :mod:`.layout` which names it makes (and so may delete), :mod:`.index` records
entries, write generations and counters, :mod:`.usage` batches what hits record, and
:mod:`.locks` serializes processes.
"""

from fsspec_shards.storage.cache.index import ReadOnlyCacheError
from fsspec_shards.storage.cache.notices import CacheWarning
from fsspec_shards.storage.cache.store import (
    COUNTERS,
    CacheFullError,
    ShardCache,
    WrittenWhileReadingError,
)
from fsspec_shards.storage.cache.trust import CacheDirectoryError, NotACacheError

__all__ = [
    "COUNTERS",
    "CacheDirectoryError",
    "CacheFullError",
    "CacheWarning",
    "NotACacheError",
    "ReadOnlyCacheError",
    "ShardCache",
    "WrittenWhileReadingError",
]
