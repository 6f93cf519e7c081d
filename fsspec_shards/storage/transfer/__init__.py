"""Moving an object's bytes into a file: one stream, ranges in flight or verified
blocks, chosen by ``planner.fill``. Imports only ``core`` and ``backends`` below it (the
cache's names and locks, and readers of a fill in flight: ``cache/following.py``)."""
