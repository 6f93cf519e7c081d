"""ConsumerStream against sample counts that lie: an absurd count (2**32), a shard that holds fewer
or more samples than its count (an error under handler="raise", equal lengths otherwise)."""

from __future__ import annotations

import logging

import pytest

from fsspec_shards import ShardDataset
from fsspec_shards.iteration.lengths import SampleCountError
from tests.shardmaker import keys, write_shards

HELD = [5, 3, 4, 6]


@pytest.fixture
def shards(tmp_path):
    return write_shards(tmp_path, len(HELD), HELD)


def ranks(urls, counts, world_size=2, **args):
    """(len, keys) of every rank's epoch."""
    result = []
    for rank in range(world_size):
        dataset = ShardDataset(
            urls,
            samples_per_shard=dict(zip(urls, counts, strict=True)),
            rank=rank,
            world_size=world_size,
            shuffle_shards=False,
            prefetch=0,
            **args,
        )
        result.append((len(dataset), keys(dataset)))
    return result


def test_an_absurd_count_starts_the_stream_without_planning_it_in_memory(shards):
    counts = dict(zip(shards, [2**32, 3, 4, 6], strict=True))
    # Rank 1 pads its 3 + 6 samples towards 2**32 + 4: its first samples come at once.
    args = dict(samples_per_shard=counts, world_size=2, prefetch=0, shuffle_shards=False)
    dataset = ShardDataset(shards, rank=1, split="shards", **args)
    iterator = iter(dataset)
    assert [next(iterator)["__key__"] for _ in range(10)][:3] == keys(ShardDataset(shards[1:2]))
    # Rank 0 reads the shard whose count lies: a clear error at its end.
    liar = ShardDataset(shards, rank=0, split="shards", **args)
    with pytest.raises(SampleCountError, match=r"shard-0000.tar holds only 5 samples where"):
        keys(liar)
    with pytest.raises(SampleCountError, match="shard-0000.tar holds 5 samples from byte 0"):
        keys(ShardDataset(shards, rank=0, **args))


@pytest.mark.parametrize("split", ["shards", "samples"])
def test_a_shard_holding_more_than_its_count_raises_naming_it(shards, split):
    with pytest.raises(SampleCountError, match=r"shard-0003.tar holds more samples where its"):
        ranks(shards, [5, 3, 4, 4], split=split)


@pytest.mark.parametrize("split", ["shards", "samples"])
def test_a_shard_holding_fewer_than_its_count_raises_naming_it(shards, split):
    with pytest.raises(SampleCountError, match=r"shard-0002.tar holds"):
        ranks(shards, [5, 3, 7, 6], split=split)


@pytest.mark.parametrize("counts", [[5, 3, 7, 6], [5, 3, 4, 4], [9, 3, 4, 1]])
@pytest.mark.parametrize("split", ["shards", "samples"])
def test_other_handlers_keep_every_rank_at_the_equal_length(shards, caplog, counts, split):
    with caplog.at_level(logging.WARNING, logger="fsspec_shards"):
        result = ranks(shards, counts, split=split, handler="warn", shuffle_buffer=2)
    assert "sample count says" in caplog.text
    lengths = {length for length, _ in result}
    assert len(lengths) == 1 and [len(part) for _, part in result] == [lengths.pop()] * 2


def test_a_resume_in_a_pass_past_the_plan_continues_exactly(shards):
    counts = dict(zip(shards, [5, 3, 9, 6], strict=True))  # shard 2 holds 4, not 9
    args = dict(
        samples_per_shard=counts,
        rank=0,
        world_size=2,
        split="shards",
        prefetch=0,
        handler="skip",
        shuffle_shards=False,
    )
    expected = keys(ShardDataset(shards, **args))
    assert len(expected) == 14  # 5 + 4 read, 5 more in a pass past the plan's two
    for cut in (9, 12, 13):
        dataset = ShardDataset(shards, **args)
        iterator = iter(dataset)
        head = [next(iterator)["__key__"] for _ in range(cut)]
        resumed = ShardDataset(shards, **args)
        resumed.load_state_dict(dataset.state_dict())
        assert head + keys(resumed) == expected, f"cut after {cut}"


def test_an_equal_length_ending_right_at_a_low_count_still_finds_the_shard_longer(tmp_path):
    urls = write_shards(tmp_path, 2, [6, 3])
    # Rank 0 takes shard 0 (count 4, holds 6) and ends at the length 4 right at its count.
    counts = dict(zip(urls, [4, 3], strict=True))
    dataset = ShardDataset(
        urls,
        samples_per_shard=counts,
        rank=0,
        world_size=2,
        split="shards",
        shuffle_shards=False,
        prefetch=0,
    )
    with pytest.raises(SampleCountError, match="shard-0000.tar holds more samples"):
        keys(dataset)
