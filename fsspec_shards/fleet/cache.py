"""The cache directory as it stands: found for ``cache info | ls | clear``, never created."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fsspec_shards.fleet.errors import InputError

if TYPE_CHECKING:
    from fsspec_shards.storage import ShardCache


def existing_cache(directory: str, size_limit: int, *, writable: bool = False) -> ShardCache | None:
    """The cache in ``directory``, read-only unless ``writable``; None when there is none yet.

    Never creates one; a directory that is not a cache (or not a safe one) is an
    :class:`InputError` naming it."""
    from fsspec_shards.storage import CacheDirectoryError, NotACacheError, ShardCache

    try:
        return ShardCache.existing(directory, size_limit, writable=writable)
    except NotACacheError as error:
        if error.kind in ("missing", "empty"):
            return None
        problem = str(error)
    except CacheDirectoryError as error:
        problem = str(error)
    raise InputError(problem)
