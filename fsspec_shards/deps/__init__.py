"""Where a module outside the storage layer uses a dependency beyond its public API: one
module per dependency, as in ``fsspec_shards/storage/deps``, each guarded by
``tests/deps/test_<dependency>.py``."""
