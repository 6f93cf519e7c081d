"""Per-shard sample counts (sidecar, mapping, header scan) and the equal epoch lengths they
give: pad (the default) or truncate, and len()."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fsspec_shards import ShardDataset
from fsspec_shards.iteration.lengths import load_sample_counts, shard_sizes
from tests.shardmaker import keys, write_shards

COUNTS = [3, 7, 2, 5, 4, 6]


@pytest.fixture
def shards(tmp_path):
    return write_shards(tmp_path, len(COUNTS), COUNTS)


@pytest.fixture
def sidecar(tmp_path, shards):
    path = tmp_path / "counts.json"
    path.write_text(json.dumps({Path(url).name: n for url, n in zip(shards, COUNTS, strict=True)}))
    return str(path)


def rank_keys(monkeypatch, world_size, **args):
    result = []
    for rank in range(world_size):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", str(world_size))
        result.append(keys(ShardDataset(**args)))
    return result


@pytest.mark.parametrize("shuffle_buffer", [0, 3])
def test_truncate_gives_every_rank_the_smallest_count_without_overlap(
    shards, sidecar, monkeypatch, shuffle_buffer
):
    per_rank = rank_keys(
        monkeypatch,
        3,
        urls=shards,
        samples_per_shard=sidecar,
        equalize="truncate",
        seed=1,
        shuffle_buffer=shuffle_buffer,
    )
    unequal = rank_keys(
        monkeypatch, 3, urls=shards, seed=1, shuffle_buffer=shuffle_buffer, equalize=None
    )
    shortest = min(len(part) for part in unequal)
    assert [len(part) for part in per_rank] == [shortest] * 3
    assert len({key for part in per_rank for key in part}) == 3 * shortest


def test_pad_is_the_default_and_gives_every_rank_the_largest_count_from_its_own_shards(
    shards, sidecar, monkeypatch
):
    args = dict(urls=shards, samples_per_shard=sidecar, seed=1)
    padded = rank_keys(monkeypatch, 3, **args)
    unequal = rank_keys(monkeypatch, 3, equalize=None, **args)
    longest = max(len(part) for part in unequal)
    for own, part in zip(unequal, padded, strict=True):
        assert len(part) == longest
        assert part[: len(own)] == own
        assert set(part) == set(own)


@pytest.mark.parametrize("equalize", ["truncate", "pad"])
def test_equal_length_streams_resume_exactly(shards, monkeypatch, equalize):
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "3")
    counts = {url: n for url, n in zip(shards, COUNTS, strict=True)}
    args = dict(urls=shards, samples_per_shard=counts, equalize=equalize, shuffle_buffer=4)
    expected = keys(ShardDataset(**args))
    for cut in range(len(expected) + 1):
        dataset = ShardDataset(**args)
        iterator = iter(dataset)
        head = [next(iterator)["__key__"] for _ in range(cut)]
        resumed = ShardDataset(**args)
        resumed.load_state_dict(json.loads(json.dumps(dataset.state_dict())))
        assert head + keys(resumed) == expected, f"cut after {cut}"


def test_counts_must_cover_every_shard(shards):
    with pytest.raises(ValueError, match="no sample count for .*shard-0005.tar"):
        ShardDataset(shards, samples_per_shard={Path(u).name: 1 for u in shards[:5]})
    assert shard_sizes(shards[:2], {shards[0]: 9, "shard-0001.tar": 8}) == [9, 8]


def test_truncate_needs_counts_and_the_mode_must_be_known(shards, sidecar):
    with pytest.raises(ValueError, match="truncate' needs the sample counts"):
        ShardDataset(shards, equalize="truncate")
    assert ShardDataset(shards).equalize is None
    with pytest.raises(ValueError, match="equalize must be one of"):
        ShardDataset(shards, samples_per_shard=sidecar, equalize="stretch")


def test_sidecar_that_is_not_counts_is_refused(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text("[1, 2]")
    with pytest.raises(ValueError, match="must be a JSON object"):
        load_sample_counts(str(path))
    with pytest.raises(ValueError, match="cannot read sample counts"):
        load_sample_counts(str(tmp_path / "absent.json"))


def test_padding_a_consumer_without_samples_is_an_error(tmp_path, monkeypatch):
    urls = write_shards(tmp_path, 2, [0, 4])
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    dataset = ShardDataset(
        urls,
        samples_per_shard={u: n for u, n in zip(urls, [0, 4], strict=True)},
        equalize="pad",
        shuffle_shards=False,
    )
    with pytest.raises(ValueError, match="has no samples"):
        list(dataset)


def test_an_unreadable_signed_counts_url_never_shows_its_signature():
    source = "memory://bucket/counts.json?X-Amz-Signature=SIGSECRET"
    with pytest.raises(ValueError, match="cannot read sample counts") as raised:
        load_sample_counts(source)
    assert "counts.json" in str(raised.value) and "SIGSECRET" not in str(raised.value)
