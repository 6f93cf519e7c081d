"""Epoch planning as pure functions: every sample to one consumer, equal lengths, sample ranges."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fsspec_shards.iteration.plan import (
    EpochPlan,
    Segment,
    batch_quotas,
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


@settings(max_examples=80, deadline=None, derandomize=True)
@given(
    sizes=st.lists(st.integers(0, 30), min_size=1, max_size=10),
    ranks=st.integers(1, 4),
    workers=st.integers(1, 4),
    batch_size=st.integers(1, 16),
    equalize=st.sampled_from(["pad", "truncate"]),
)
def test_whole_batches_per_worker_and_the_same_count_per_rank_for_any_worker_count(
    sizes, ranks, workers, batch_size, equalize
):
    pieces = shard_pieces(list(range(len(sizes)))[::-1], sizes)
    consumers = ranks * workers
    try:
        plans = [
            plan_epoch(pieces, c, consumers, "samples", equalize, batch_size, workers)
            for c in range(consumers)
        ]
    except ValueError as exc:  # fewer samples than consumers to pad
        assert "has no samples" in str(exc) and equalize == "pad"
        return
    total = sum(sizes)
    per_rank = {
        sum(plan.length for plan in plans[r * workers : (r + 1) * workers]) for r in range(ranks)
    }
    alone = plan_epoch(pieces, 0, ranks, "samples", equalize, batch_size, 1).length
    assert per_rank == {alone}
    assert all(plan.length % batch_size == 0 for plan in plans)
    seen = [item for plan in plans for item in samples_of(plan, sizes)]
    assert len(seen) == len(set(seen)) == total
    if equalize == "pad":
        assert all(plan.own <= plan.length for plan in plans)
        assert ranks * alone - total < ranks * batch_size
    else:
        assert all(plan.own >= plan.length for plan in plans)
        assert total - ranks * alone < ranks * batch_size + ranks


def test_batch_quotas_give_a_rank_its_batches_over_its_workers():
    assert batch_quotas(1000, 2, 3, 32, "pad") == [192, 160, 160] * 2
    assert batch_quotas(1000, 2, 1, 32, "truncate") == [480, 480]
    assert batch_quotas(10, 4, 2, 32, "truncate") == [0] * 8


def test_auto_split_shares_by_samples_when_the_counts_are_known():
    assert choose_split("auto", 10, 4, counts_known=True) == "samples"
    assert choose_split("auto", 10, 4, counts_known=False) == "shards"
    with pytest.raises(ValueError, match="cannot be split over 8 consumers"):
        choose_split("auto", 4, 8, counts_known=False)
