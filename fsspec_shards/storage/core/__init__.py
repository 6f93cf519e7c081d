"""The storage layer's ground floor: options, retries, verification and manifests,
the worker thread. Imports nothing of the storage layer above it."""
