"""webdataset's opener state, saved and put back around a test that patches it."""

from __future__ import annotations

import importlib
from collections.abc import Iterator

import pytest


def restored() -> Iterator[object]:
    """For a fixture: yields webdataset's ``gopen`` module, and afterwards puts back its
    table, its ``gopen`` (and the package's re-export) and ``StreamingOpen``'s call."""
    webdataset = pytest.importorskip("webdataset")
    module = importlib.import_module("webdataset.gopen")
    streaming = importlib.import_module("webdataset.cache").StreamingOpen
    schemes, function, exported = dict(module.gopen_schemes), module.gopen, webdataset.gopen
    opener_stage = streaming.__call__
    yield module
    streaming.__call__ = opener_stage
    module.gopen_schemes.clear()
    module.gopen_schemes.update(schemes)
    module.gopen, webdataset.gopen = function, exported
