"""Warnings of a degraded cache, each said once per process
(:mod:`fsspec_shards.storage.cache.notices`)."""

from __future__ import annotations

import uuid
import warnings

import pytest

from fsspec_shards.storage.cache.notices import CacheWarning, warn_once


def _said(*calls: tuple[str, str, str]) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for path, topic, message in calls:
            warn_once(path, topic, message)
    assert all(issubclass(warning.category, CacheWarning) for warning in caught)
    return [str(warning.message) for warning in caught]


def test_a_notice_is_said_once_per_directory_and_topic():
    path = f"/cache-{uuid.uuid4().hex}"
    said = _said(
        (path, "read-only", "first"),
        (path, "read-only", "again"),
        (path, "index", "other topic"),
        (path + "-2", "read-only", "other directory"),
    )
    assert said == ["first", "other topic", "other directory"]
    assert _said((path, "read-only", "later")) == []  # once per process, not per call site


def test_a_cache_warning_is_a_user_warning_a_filter_can_silence():
    assert issubclass(CacheWarning, UserWarning)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)
        with pytest.raises(CacheWarning, match="degraded"):
            warn_once(f"/cache-{uuid.uuid4().hex}", "topic", "degraded")
