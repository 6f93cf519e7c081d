"""The shard cache: whole, verified files on local disk, shared by any number of processes.

:class:`ShardCache` (:mod:`.store`) keeps the files, :mod:`.publication` publishes a
download into it, :mod:`.room` finds and removes the files it made and keeps them under its
size limit; :mod:`.trust` decides which directories it uses and takes over those of earlier
layouts, :mod:`.layout` says which names it makes (and so may delete),
:mod:`.index` records entries, write generations and counters in a diskcache (what hits
record batched by :mod:`.room`), :mod:`.locks` serializes processes with filelock,
:mod:`.space` handles a full disk, and :mod:`.shared` is the tier all nodes mount.
"""

from fsspec_shards.storage.cache.index_database import ReadOnlyCacheError
from fsspec_shards.storage.cache.notices import CacheWarning
from fsspec_shards.storage.cache.room import CacheFullError
from fsspec_shards.storage.cache.store import COUNTERS, ShardCache, WrittenWhileReadingError
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
