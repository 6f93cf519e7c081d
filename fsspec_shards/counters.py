"""The names of the counters every ``wds`` cache keeps, in one place.

The storage layer counts them (:mod:`fsspec_shards.storage.cache.store`,
:mod:`fsspec_shards.storage.fetcher`); ``fs.cache_stats()`` reports them; the fleet chores
and the command line read them. Neutral (imports nothing), so storage, iteration and the CLI
can all name the same tuple.
"""

COUNTERS = ("hits", "misses", "bytes_downloaded", "retries", "integrity_failures", "evictions")
"""Per cache: lookups served from disk, lookups that downloaded, bytes fetched from the
backend, transient failures retried, checksum mismatches, files evicted for room."""

SHARED_COUNTERS = ("shared_hits", "shared_misses", "shared_evictions")
"""With a shared tier (``shared_cache_dir``): misses of the local cache the shared tier
served, misses it did not (read from the backend), files it evicted for room."""
