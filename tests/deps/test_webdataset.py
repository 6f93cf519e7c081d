"""webdataset beyond its public API: the openers whose checks patch_webdataset runs are
the ones recorded (a check a later webdataset adds fails here, not silently bypassed), and
the version gate."""

from __future__ import annotations

import pytest

from fsspec_shards.deps import webdataset as deps

wds = pytest.importorskip("webdataset")


def test_the_installed_webdatasets_openers_have_the_recorded_checks():
    loaded = deps.load()
    recorded = deps.GUARDS[loaded.series]
    found = {name: deps.guards(function) for name, function in deps.openers(loaded).items()}
    assert found == recorded, (
        f"webdataset {loaded.version} changed an opener patch_webdataset wraps: review "
        "fsspec_shards/webdataset_patch.py against it, then record its checks in GUARDS"
    )


def _opener(url):
    if url == "-":
        raise ValueError("stdin")
    return open(url, "rb")


def _opener_with_a_new_check(url):
    if url == "-":
        raise ValueError("stdin")
    if url.startswith("/etc"):
        raise PermissionError(url)
    return open(url, "rb")


def test_a_new_check_changes_what_is_recorded():
    assert deps.guards(_opener) != deps.guards(_opener_with_a_new_check)
    assert "test url.startswith('/etc')" in deps.guards(_opener_with_a_new_check)


@pytest.mark.parametrize(
    ("version", "series"),
    [
        ("0.2.86", "0.2"),
        ("0.2.111", "0.2"),
        ("1.0.0", "1.0"),
        ("1.0.2", "1.0"),
        ("0.2.85", None),
        ("0.1.103", None),
        ("1.1.0", None),
        ("2.0.0", None),
        ("dev", None),
    ],
)
def test_the_supported_versions(version, series):
    assert deps.series(version) == series


def test_the_installed_version_is_supported():
    assert deps.load().version == wds.__version__
