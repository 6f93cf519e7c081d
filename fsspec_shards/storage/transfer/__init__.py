"""Moving an object's bytes into a file: one stream, ranges in flight or verified
blocks, planned per store. Imports only ``core`` and ``backends`` below it."""
