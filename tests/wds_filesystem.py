"""The one builder of ``wds`` filesystems for tests: a new instance each call (fsspec's
instance cache skipped), so no test sees another's options or counters."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import fsspec

from fsspec_shards import WdsFileSystem
from tests.planned_faults import PlannedFaultFileSystem

QUICK_RETRIES = {"backoff": 0.01, "max_backoff": 0.05}
"""Retry pauses short enough for tests that make requests fail on purpose."""

SHARD_DATA = bytes(range(256)) * 4000
"""The bytes of the shard :func:`local_shard` and :func:`planned_filesystem` serve (1 MB)."""


def wds_filesystem(
    target_protocol: str | None = None,
    target_options: dict[str, Any] | None = None,
    *,
    cache_dir: str | Path | None = None,
    **options: Any,
) -> WdsFileSystem:
    """A new ``wds`` filesystem over ``target_protocol`` (or ``fs=``), caching in
    ``cache_dir``; ``options`` as :class:`WdsFileSystem` takes them."""
    given = {
        "target_protocol": target_protocol,
        "target_options": target_options,
        "cache_dir": None if cache_dir is None else str(cache_dir),
    }
    chosen = {name: value for name, value in given.items() if value is not None}
    return fsspec.filesystem("wds", skip_instance_cache=True, **chosen, **options)


def local_shard(tmp_path: Path) -> tuple[str, dict[str, Any]]:
    """A local file of :data:`SHARD_DATA` and the options of a fresh cache directory."""
    path = tmp_path / "data" / "train-0000.tar"
    path.parent.mkdir()
    path.write_bytes(SHARD_DATA)
    return str(path), {"cache_dir": str(tmp_path / "cache"), "backoff": 0.001}


def planned_filesystem(
    tmp_path: Path, plan: Any = None, **options: Any
) -> tuple[WdsFileSystem, PlannedFaultFileSystem, str]:
    """A ``wds`` filesystem over a backend failing by ``plan``, holding :data:`SHARD_DATA`
    at the path returned: ``(fs, backend, path)``."""
    backend = PlannedFaultFileSystem(plan)
    path = f"/fs-{uuid.uuid4().hex}/train-0000.tar"
    backend.pipe_file(path, SHARD_DATA)
    fs = wds_filesystem(fs=backend, cache_dir=str(tmp_path / "cache"), backoff=0.001, **options)
    return fs, backend, path
