"""The state's shape (what torchdata's StatefulDataLoader snapshots at every batch) and
states written by earlier versions (version 2: the fingerprint as a nested dict)."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import fsspec
import pytest

from fsspec_shards import ShardDataset

V2_STATE = Path(__file__).parent / "data" / "state-v2.json"
"""A state taken after 7 samples by the code of version 2, with the samples before and after
it, over the shards :func:`write_shards` makes."""


@pytest.fixture
def memory_shards():
    """Five shards in fsspec's memory filesystem, at the URLs the version-2 state was taken
    over (the state's shard identity is a digest of the URLs)."""
    fs = fsspec.filesystem("memory")
    urls = []
    for shard, count in enumerate([3, 4, 2, 5, 3]):
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
            for index in range(count):
                data = f"{shard}-{index}".encode()
                info = tarfile.TarInfo(f"s{shard}_{index:03d}.txt")
                info.size = len(data)
                info.mtime = 1_700_000_000
                tar.addfile(info, io.BytesIO(data))
        fs.pipe(f"/state-v2/shard-{shard}.tar", buffer.getvalue())
        urls.append(f"memory://state-v2/shard-{shard}.tar")
    yield urls
    fs.rm("/state-v2", recursive=True)


def mid_epoch_state(urls, cut=7):
    dataset = ShardDataset(urls, shuffle_buffer=4, seed=1)
    iterator = iter(dataset)
    for _ in range(cut):
        next(iterator)
    return dataset.state_dict()


def test_a_state_written_by_version_2_resumes_exactly(memory_shards):
    saved = json.loads(V2_STATE.read_text())
    assert saved["state"]["version"] == 2
    assert isinstance(saved["state"]["fingerprint"], dict)
    whole = [sample["__key__"] for sample in ShardDataset(memory_shards, shuffle_buffer=4, seed=1)]
    assert whole == saved["before"] + saved["after"]
    dataset = ShardDataset(memory_shards, shuffle_buffer=4, seed=1)
    dataset.load_state_dict(saved["state"])
    assert [sample["__key__"] for sample in dataset] == saved["after"]


def test_a_version_2_state_of_other_arguments_names_them(memory_shards):
    state = json.loads(V2_STATE.read_text())["state"]
    with pytest.raises(ValueError, match=r"seed \(state: 1, dataset: 2\)"):
        ShardDataset(memory_shards, shuffle_buffer=4, seed=2).load_state_dict(state)


def test_the_state_is_flat_with_the_fingerprint_as_one_value(memory_shards):
    state = mid_epoch_state(memory_shards)
    assert state["version"] == 3
    assert not any(isinstance(value, dict) for value in state.values())
    fingerprint = dict(state["fingerprint"])
    assert fingerprint["seed"] == 1 and fingerprint["num_workers"] == 1
    assert all(isinstance(pair, list) and len(pair) == 2 for pair in state["fingerprint"])
    assert json.loads(json.dumps(state)) == state


def test_torchdata_compares_a_dozen_leaves_per_snapshot(memory_shards):
    incremental = pytest.importorskip("torchdata.stateful_dataloader.incremental_state")
    assert len(incremental._flatten(mid_epoch_state(memory_shards))) <= 12


def test_a_state_of_this_version_resumes_exactly(memory_shards):
    saved = json.loads(V2_STATE.read_text())
    state = json.loads(json.dumps(mid_epoch_state(memory_shards)))
    dataset = ShardDataset(memory_shards, shuffle_buffer=4, seed=1)
    dataset.load_state_dict(state)
    assert [sample["__key__"] for sample in dataset] == saved["after"]


@pytest.mark.parametrize(
    "change",
    [
        {"fingerprint": {"seed": 1}},  # a version-2 fingerprint in a version-3 state
        {"fingerprint": [["seed", 1, 2]]},
        {"fingerprint": [[1, "seed"]]},
        {"fingerprint": "seed=1"},
        {"version": 2},  # a version-3 fingerprint in a version-2 state
    ],
)
def test_a_malformed_fingerprint_is_named(memory_shards, change):
    state = dict(mid_epoch_state(memory_shards), **change)
    with pytest.raises(ValueError, match="field 'fingerprint'"):
        ShardDataset(memory_shards, shuffle_buffer=4, seed=1).load_state_dict(state)


@pytest.mark.parametrize("version", [1, 4, None])
def test_a_state_of_an_unknown_version_is_not_a_state(memory_shards, version):
    state = dict(mid_epoch_state(memory_shards), version=version)
    with pytest.raises(ValueError, match="not a ShardDataset state"):
        ShardDataset(memory_shards, shuffle_buffer=4, seed=1).load_state_dict(state)


def test_the_state_of_a_running_iteration_does_not_ask_the_environment(memory_shards, monkeypatch):
    dataset = ShardDataset(memory_shards, shuffle_buffer=4, seed=1)
    iterator = iter(dataset)
    next(iterator)

    def asked():
        raise AssertionError("consumer() asked at every state_dict()")

    monkeypatch.setattr(dataset, "consumer", asked)
    assert dataset.state_dict()["delivered"] == 1


def test_a_stateful_dataloader_state_written_by_version_2_resumes_exactly(memory_shards):
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    saved = json.loads((V2_STATE.parent / "loader-state-v2.json").read_text())
    loader = stateful.StatefulDataLoader(
        ShardDataset(memory_shards, shuffle_buffer=4, seed=1),
        batch_size=2,
        num_workers=2,
        collate_fn=keys_of,
    )
    loader.load_state_dict(saved["loader_state"])
    assert list(loader) == saved["after"]


def keys_of(batch):
    return [sample["__key__"] for sample in batch]
