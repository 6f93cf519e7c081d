"""The public surface of ``fsspec_shards``: ``__all__`` holds what the contract promises
(sections 2 and 5), and every name in it imports; so do the names ``fsspec_shards.storage``
offers the rest of the package."""

from __future__ import annotations

import subprocess
import sys

import pytest

import fsspec_shards

PROMISED = {
    "IndexedShardDataset",
    "IntegrityError",
    "MixedDataset",
    "ShardDataset",
    "ShardFormatError",
    "ShardWriter",
    "patch_webdataset",
    "unpatch_webdataset",
}
"""The names the contract's users import from ``fsspec_shards``."""

OWN = {"WdsFileSystem", "__version__"}
"""Besides: the class fsspec's entry point registers for ``wds``, and the version."""


def test_all_is_the_promised_surface_once_each():
    assert set(fsspec_shards.__all__) == PROMISED | OWN
    assert len(fsspec_shards.__all__) == len(set(fsspec_shards.__all__))


def test_every_exported_name_imports():
    assert all(getattr(fsspec_shards, name) is not None for name in fsspec_shards.__all__)


def test_star_import_in_a_fresh_interpreter_gives_every_name():
    code = (
        "from fsspec_shards import *\n"
        "import fsspec_shards\n"
        "names = dir()\n"
        "print(sorted(set(fsspec_shards.__all__) - set(names)))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert (result.returncode, result.stdout.strip()) == (0, "[]"), result.stderr


def test_every_public_name_of_the_storage_layer_imports():
    import fsspec_shards.storage as storage

    assert all(getattr(storage, name) is not None for name in storage.__all__)
    with pytest.raises(AttributeError, match="NoSuchName"):
        storage.NoSuchName  # noqa: B018


def test_an_unknown_name_is_an_attribute_error_naming_it():
    with pytest.raises(AttributeError, match="NoSuchName"):
        fsspec_shards.NoSuchName  # noqa: B018
