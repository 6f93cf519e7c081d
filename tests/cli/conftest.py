"""Fixtures of the command-line tests: a small demo dataset, and a cache directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from fsspec_shards.fleet.demo import DemoDataset, make_demo_dataset


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> DemoDataset:
    return make_demo_dataset(tmp_path_factory.mktemp("shards"), shards=4, samples_per_shard=30)


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    return tmp_path / "cache"
