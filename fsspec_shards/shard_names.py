"""Finding a shard in a table of names by the trailing part of its path.

Checksum manifests (:mod:`fsspec_shards.storage.core.integrity`) and sample-count sidecars
(:mod:`fsspec_shards.iteration.lengths`) name shards as their writer saw them: a full URL, a
path, or a name relative to somewhere unknown. Both look a shard up the same way, here.
Neutral (imports nothing of the package): storage and iteration never import each other.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

T = TypeVar("T")


def by_trailing_path(table: Mapping[str, T], path: str) -> T | None:
    """``table[path]``, else the entry of the longest trailing run of ``path``'s whole
    ``/``-separated components (the last one at least) that ``table`` names, a leading ``/``
    of the name ignored (``/shards/a.tar`` and ``shards/a.tar`` both match
    ``bucket/shards/a.tar``); None when no name matches.

    Costs two dictionary look-ups per component of ``path``, whatever the size of ``table``.
    """
    parts = path.split("/")
    for first in range(len(parts)):
        trailing = "/".join(parts[first:])
        for name in (trailing, "/" + trailing):
            if name in table:
                return table[name]
    return None
