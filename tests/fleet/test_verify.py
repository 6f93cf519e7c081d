"""The verify chore: one row per shard and per manifest entry storage lacks."""

from __future__ import annotations

import pytest

from fsspec_shards.fleet.errors import InputError
from fsspec_shards.fleet.executors import ThreadExecutor
from fsspec_shards.fleet.verify import MISSING, read_manifest, verify_shards
from tests.cli.running import corrupt_copy, make_glob_copy
from tests.fleet.conftest import streaming


def test_a_good_dataset_verifies_against_its_manifest(dataset):
    report = verify_shards(dataset.pattern, streaming(), ThreadExecutor(2), str(dataset.manifest))
    assert report.bad == [] and report.samples == 120
    assert [row.check for row in report.rows] == ["sha256 (manifest)"] * 4
    assert report.summary().startswith(f"verified 4 shards against manifest {dataset.manifest}")
    assert "4 ok, 0 bad" in report.summary()


def test_a_corrupted_shard_is_the_one_bad_row(dataset, tmp_path):
    bad = corrupt_copy(dataset, tmp_path / "bad")
    report = verify_shards(bad.pattern, streaming(), ThreadExecutor(2), str(bad.manifest))
    assert [row.shard for row in report.bad] == [str(bad.shards[1])]
    assert report.bad[0].problem.startswith("integrity: expected sha256:")
    assert report.failure_line().startswith(f"1 of 4 shards bad, first {bad.shards[1]}")
    assert report.as_dict()["bad"] == 1 and len(report.as_dict()["results"]) == 4


def test_manifest_entries_the_glob_names_but_storage_lacks_get_a_row(dataset, tmp_path):
    copy = make_glob_copy(dataset, tmp_path / "copy")
    copy.shards[3].unlink()
    report = verify_shards(
        f"{copy.directory}/demo-*.tar", streaming(), ThreadExecutor(2), str(copy.manifest)
    )
    assert [(row.shard, row.check, row.problem) for row in report.bad] == [
        (str(copy.shards[3]), "-", MISSING)
    ]


def test_without_a_manifest_local_shards_get_their_size_checked(dataset):
    report = verify_shards(dataset.pattern, streaming(), ThreadExecutor(2))
    assert {row.check for row in report.rows} == {"size only"} and report.bad == []


def test_a_missing_or_malformed_manifest_is_an_input_error_naming_it(dataset, tmp_path):
    with pytest.raises(InputError, match="manifest not found"):
        read_manifest(str(tmp_path / "absent"), {})
    broken = tmp_path / "broken"
    broken.write_text("not a line of sha256sum\n")
    with pytest.raises(InputError, match="broken"):
        verify_shards(dataset.pattern, streaming(), ThreadExecutor(1), str(broken))


def test_a_manifest_names_the_entries_a_pattern_matches_as_a_glob_would(dataset, tmp_path):
    manifest = read_manifest(str(dataset.manifest), {})
    directory = dataset.directory
    assert manifest.named_by(f"{directory}/demo-*.tar") == [str(p) for p in dataset.shards]
    assert manifest.named_by(f"{directory}/demo-00000[13].tar") == [
        str(dataset.shards[1]), str(dataset.shards[3])
    ]  # fmt: skip
    assert manifest.named_by(f"{directory}/{{demo-000002,absent}}.tar") == [str(dataset.shards[2])]
    assert manifest.named_by(f"{directory}/*/demo-*.tar") == []
