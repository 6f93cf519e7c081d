"""Per-shard sample counts (sidecar, mapping, header scan) and the equal epoch lengths they
give: pad (the default) or truncate, and len()."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import fsspec
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
        split="shards",
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
        split="shards",
        shuffle_shards=False,
    )
    with pytest.raises(ValueError, match="has no samples"):
        list(dataset)


def test_an_unreadable_signed_counts_url_never_shows_its_signature():
    source = "memory://bucket/counts.json?X-Amz-Signature=SIGSECRET"
    with pytest.raises(ValueError, match="cannot read sample counts") as raised:
        load_sample_counts(source)
    assert "counts.json" in str(raised.value) and "SIGSECRET" not in str(raised.value)


def test_count_samples_reads_the_counts_from_the_tar_headers(shards, tmp_path):
    gz = write_shards(tmp_path, 3, [4, 0, 2], gz=True)
    assert ShardDataset(gz, count_samples=True).shard_sizes == [4, 0, 2]
    zst = write_shards(tmp_path, 3, [4, 0, 2], zst=True)
    assert ShardDataset(zst, count_samples=True).shard_sizes == [4, 0, 2]
    assert ShardDataset(shards, count_samples=True).shard_sizes == COUNTS


def test_count_samples_counts_up_to_the_damage_unless_the_handler_raises(shards, caplog):
    Path(shards[1]).write_bytes(Path(shards[1]).read_bytes()[:700])
    with pytest.raises(ValueError, match="malformed tar shard .*shard-0001.tar"):
        ShardDataset(shards, count_samples=True)
    with caplog.at_level(logging.WARNING, logger="fsspec_shards"):
        dataset = ShardDataset(shards, count_samples=True, handler="warn", shuffle_shards=False)
    assert dataset.shard_sizes == [COUNTS[0], 0, *COUNTS[2:]]
    assert "leaving out the rest of shard" in caplog.text
    assert len(keys(dataset)) == len(dataset) == sum(COUNTS) - COUNTS[1]


@pytest.mark.parametrize("world_size", [1, 2, 4, 9])
@pytest.mark.parametrize("split", ["shards", "samples"])
def test_len_is_what_every_rank_yields_and_is_equal_across_ranks(
    shards, sidecar, monkeypatch, world_size, split
):
    if split == "shards" and world_size > len(shards):
        split = "samples"  # chosen by itself: fewer shards than ranks
    seen = []
    lengths = set()
    for rank in range(world_size):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", str(world_size))
        dataset = ShardDataset(shards, samples_per_shard=sidecar, split=split, shuffle_buffer=3)
        part = keys(dataset)
        assert len(dataset) == len(part)
        lengths.add(len(part))
        seen.append(part)
    assert len(lengths) == 1
    everything = set(keys(ShardDataset(shards, split_by_node=False)))
    assert set().union(*seen) == everything
    padding = sum(len(part) for part in seen) - len(everything)
    assert padding == lengths.pop() * world_size - sum(COUNTS)


def test_fewer_shards_than_ranks_share_shards_by_sample_ranges_exactly_once(
    shards, sidecar, monkeypatch
):
    per_rank = rank_keys(monkeypatch, 16, urls=shards, samples_per_shard=sidecar, equalize=None)
    flat = [key for part in per_rank for key in part]
    assert sorted(flat) == sorted(keys(ShardDataset(shards, split_by_node=False)))
    assert max(map(len, per_rank)) - min(map(len, per_rank)) <= 1


def test_len_without_counts_is_a_type_error(shards):
    with pytest.raises(TypeError, match="needs the sample counts"):
        len(ShardDataset(shards))


def test_too_few_shards_without_counts_is_an_error_naming_the_way_out(shards, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "8")
    with pytest.raises(ValueError, match="count_samples=True"):
        list(ShardDataset(shards))


def test_padding_is_counted_in_the_stats(shards, sidecar, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "4")
    dataset = ShardDataset(shards, samples_per_shard=sidecar, shuffle_shards=False, split="shards")
    part = keys(dataset)
    own = len(set(part))
    assert dataset.stats()["padded"] == len(part) - own > 0


def test_a_sample_range_is_reached_by_seeking_not_by_reading_the_samples_before(tmp_path):
    from tests.test_resume import CountingFileSystem

    fsspec.register_implementation("countingfile", CountingFileSystem, clobber=True)
    paths = write_shards(tmp_path, 1, 40, payload_size=64 * 1024)
    urls = ["countingfile://" + path for path in paths]
    size = Path(paths[0]).stat().st_size
    dataset = ShardDataset(urls, samples_per_shard={urls[0]: 40}, rank=3, world_size=4, prefetch=0)
    CountingFileSystem.counter.update(bytes=0, cat_ranges=0)
    assert keys(dataset) == [f"s0000_{index:05d}" for index in range(30, 40)]
    assert CountingFileSystem.counter["bytes"] < 0.4 * size


JUNK_COUNTS = [
    (None, "is not an int: None"),
    ("seven", "is not an int: 'seven'"),
    ("7", "is not an int: '7'"),
    (7.9, "is not an int: 7.9"),
    (7.0, "is not an int: 7.0"),
    (True, "is not an int: True"),
    ([7], "is not an int: [7]"),
    (-1, "is out of range: -1"),
    (10**10, "is out of range: 10000000000"),
    (2**40, "is out of range: 1099511627776"),
]


@pytest.mark.parametrize(("count", "problem"), JUNK_COUNTS)
def test_a_sidecar_count_that_is_not_a_count_names_the_file_and_the_shard(
    tmp_path, shards, count, problem
):
    path = tmp_path / "counts.json"
    counts = {Path(url).name: n for url, n in zip(shards, COUNTS, strict=True)}
    path.write_text(json.dumps({**counts, "shard-0003.tar": count}))
    with pytest.raises(ValueError) as raised:
        ShardDataset(shards, samples_per_shard=str(path))
    assert str(raised.value) == (
        f"sample counts in {path}: the sample count of 'shard-0003.tar' {problem}"
        + (" (counts are 0 to 2**32)" if "range" in problem else f" ({type(count).__name__})")
    )


@pytest.mark.parametrize(("count", "problem"), JUNK_COUNTS)
def test_a_mapping_count_that_is_not_a_count_is_refused_the_same_way(count, problem):
    with pytest.raises(ValueError) as raised:
        load_sample_counts({"a.tar": 1, "b.tar": 2} | {"a.tar": count})
    assert str(raised.value).startswith(f"samples_per_shard: the sample count of 'a.tar' {problem}")


def test_counts_at_the_bounds_and_numpy_ints_are_counts():
    numpy = pytest.importorskip("numpy")
    assert load_sample_counts({"a": 0, "b": 2**32, "c": numpy.int64(5)}) == {
        "a": 0,
        "b": 2**32,
        "c": 5,
    }
    assert type(load_sample_counts({"c": numpy.int64(5)})["c"]) is int


def test_a_shard_named_twice_in_a_sidecar_is_refused(tmp_path):
    path = tmp_path / "counts.json"
    path.write_text('{"a.tar": 3, "b.tar": 4, "a.tar": 30}')
    with pytest.raises(ValueError, match=r"counts\.json: the shard 'a\.tar' is given twice"):
        load_sample_counts(str(path))


def test_a_junk_count_of_a_signed_url_never_shows_the_signature():
    url = "https://h/a.tar?X-Amz-Signature=SIGSECRET"
    with pytest.raises(ValueError, match="is not an int") as raised:
        load_sample_counts({url: "seven"})
    assert "SIGSECRET" not in str(raised.value)
