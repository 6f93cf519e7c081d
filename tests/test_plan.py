"""Epoch planning as pure functions: every sample to one consumer, equal lengths, sample ranges."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fsspec_shards.iteration.plan import (
    EpochPlan,
    Segment,
    choose_split,
    plan_epoch,
    shard_pieces,
)


def samples_of(plan: EpochPlan, sizes: list[int]) -> list[tuple[int, int]]:
    """(shard, sample index) of every sample the plan reads in its first pass."""
    result = []
    for segment in plan.segments:
        assert segment.start == 0 and segment.end is None
        size = sizes[segment.shard]
        stop = size if segment.count is None else segment.skip + segment.count
        result += [(segment.shard, index) for index in range(segment.skip, stop)]
    return result


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    sizes=st.lists(st.integers(0, 9), min_size=1, max_size=12),
    consumers=st.integers(1, 20),
    split=st.sampled_from(["shards", "samples"]),
)
def test_every_sample_goes_to_exactly_one_consumer(sizes, consumers, split):
    if split == "shards" and len(sizes) < consumers:
        split = "samples"
    pieces = shard_pieces(list(range(len(sizes)))[::-1], sizes)
    seen = []
    for consumer in range(consumers):
        plan = plan_epoch(pieces, consumer, consumers, split)
        mine = samples_of(plan, sizes)
        assert len(mine) == plan.own == sum(count for count in plan.samples)
        seen += mine
    assert sorted(seen) == sorted((shard, i) for shard, n in enumerate(sizes) for i in range(n))


def test_sample_ranges_differ_by_at_most_one_and_follow_the_order():
    pieces = shard_pieces([2, 0, 1], [5, 3, 4])
    plans = [plan_epoch(pieces, consumer, 5, "samples") for consumer in range(5)]
    assert [plan.own for plan in plans] == [3, 3, 2, 2, 2]
    assert plans[0].segments == (Segment(2, count=3),)
    assert plans[1].segments == (Segment(2, skip=3), Segment(0, count=2))
    assert plans[2].segments == (Segment(0, skip=2, count=2),)


@pytest.mark.parametrize("split", ["shards", "samples"])
def test_pad_and_truncate_give_every_consumer_the_same_length(split):
    sizes = [3, 7, 2, 5, 4, 6]
    pieces = shard_pieces(list(range(6)), sizes)
    for mode, pick in (("pad", max), ("truncate", min)):
        plans = [plan_epoch(pieces, consumer, 4, split, mode) for consumer in range(4)]
        lengths = {plan.length for plan in plans}
        assert lengths == {pick(plan.own for plan in plans)}
        for plan in plans:
            passes = -(-plan.length // plan.own) if mode == "pad" else 1
            assert plan.passes == passes and plan.own * plan.passes >= plan.length


def test_padding_is_the_segment_indices_past_the_first_pass():
    plan = plan_epoch(shard_pieces([0, 1, 2], [1, 5, 1]), 0, 2, "shards", "pad")
    assert plan.own == 2 and plan.length == 5 and plan.passes == 3 and plan.limit == 6
    assert plan.segment(4) == plan.segments[0]
    assert not plan.is_padding(1) and plan.is_padding(2)


def test_counts_unknown_give_no_length():
    plan = plan_epoch(shard_pieces([0, 1, 2], None), 1, 2, "shards", "pad")
    assert plan.segments == (Segment(1),) and plan.length is None and plan.own is None


def test_a_consumer_with_nothing_to_pad_is_an_error():
    with pytest.raises(ValueError, match="has no samples to pad to 4"):
        plan_epoch(shard_pieces([0, 1], [0, 4]), 0, 2, "shards", "pad")


def test_fewer_shards_than_consumers_switch_to_sample_ranges_when_counts_are_known():
    assert choose_split("shards", 16, 64, counts_known=True) == "samples"
    assert choose_split("shards", 64, 64, counts_known=False) == "shards"
    with pytest.raises(ValueError, match=r"16 shard\(s\) cannot be split over 64 consumers"):
        choose_split("shards", 16, 64, counts_known=False)
    with pytest.raises(ValueError, match="split='samples' needs the sample count"):
        choose_split("samples", 64, 4, counts_known=False)


def test_segments_round_trip_as_lists():
    for segment in (Segment(3), Segment(1, 512, 4096), Segment(2, skip=4, count=9)):
        assert Segment.from_list(segment.to_list()) == segment
