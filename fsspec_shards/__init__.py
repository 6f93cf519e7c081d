"""fsspec-shards: a retrying, verifying, cached fsspec protocol and resumable sample streams.

Importing this package is cheap: the storage layer loads with fsspec's entry point, and the
iteration module (which may import torch) loads on first use of :class:`ShardDataset`,
:class:`IndexedShardDataset`, :class:`ShardWriter` or :class:`MixedDataset`, and
:func:`patch_webdataset` (which changes webdataset's opener, until
:func:`unpatch_webdataset`) only when called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fsspec_shards.errors import IntegrityError, ShardFormatError

if TYPE_CHECKING:
    from fsspec_shards.iteration.dataset import ShardDataset
    from fsspec_shards.iteration.indexed import IndexedShardDataset
    from fsspec_shards.iteration.mixing import MixedDataset
    from fsspec_shards.iteration.writer import ShardWriter
    from fsspec_shards.storage.filesystem import WdsFileSystem
    from fsspec_shards.webdataset_patch import patch_webdataset, unpatch_webdataset

__version__ = "0.1.0"
__all__ = [
    "IndexedShardDataset",
    "IntegrityError",
    "MixedDataset",
    "ShardDataset",
    "ShardFormatError",
    "ShardWriter",
    "WdsFileSystem",
    "__version__",
    "patch_webdataset",
    "unpatch_webdataset",
]


def __getattr__(name: str) -> Any:
    if name == "ShardDataset":
        from fsspec_shards.iteration.dataset import ShardDataset

        return ShardDataset
    if name == "IndexedShardDataset":
        from fsspec_shards.iteration.indexed import IndexedShardDataset

        return IndexedShardDataset
    if name == "MixedDataset":
        from fsspec_shards.iteration.mixing import MixedDataset

        return MixedDataset
    if name == "ShardWriter":
        from fsspec_shards.iteration.writer import ShardWriter

        return ShardWriter
    if name == "WdsFileSystem":
        from fsspec_shards.storage.filesystem import WdsFileSystem

        return WdsFileSystem
    if name in ("patch_webdataset", "unpatch_webdataset"):
        from fsspec_shards import webdataset_patch

        return getattr(webdataset_patch, name)
    raise AttributeError(f"module 'fsspec_shards' has no attribute {name!r}")
