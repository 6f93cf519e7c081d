"""webdataset's opener state: taken, compared and put back around a test that patches it."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from typing import Any

import pytest


def _places() -> list[tuple[Any, str]]:
    """Every (owner, attribute) that ``patch_webdataset`` may replace, on either series."""
    webdataset = importlib.import_module("webdataset")
    gopen = importlib.import_module("webdataset.gopen")
    cache = importlib.import_module("webdataset.cache")
    places = [(webdataset, "gopen"), (gopen, "gopen"), (cache, "cached_url_opener")]
    for name in ("StreamingOpen", "FileCache"):
        if hasattr(cache, name):
            places += [(getattr(cache, name), "__call__"), (getattr(cache, name), "__init__")]
    return places


def snapshot() -> dict[str, Any]:
    """webdataset's opener state: the scheme table (a copy) and every patchable attribute."""
    table = importlib.import_module("webdataset.gopen").gopen_schemes
    state: dict[str, Any] = {"gopen_schemes": dict(table)}
    for owner, name in _places():
        state[f"{getattr(owner, '__name__', owner)}.{name}"] = vars(owner).get(name)
    return state


def restored() -> Iterator[object]:
    """For a fixture: yields webdataset's ``gopen`` module, and afterwards unpatches and
    puts back whatever still differs (so one failing test cannot leak into the next)."""
    pytest.importorskip("webdataset")
    import fsspec_shards

    module = importlib.import_module("webdataset.gopen")
    table = dict(module.gopen_schemes)
    saved = [(owner, name, vars(owner).get(name)) for owner, name in _places()]
    yield module
    fsspec_shards.unpatch_webdataset()
    for owner, name, value in saved:
        if value is not None and vars(owner).get(name) is not value:
            setattr(owner, name, value)
    module.gopen_schemes.clear()
    module.gopen_schemes.update(table)
