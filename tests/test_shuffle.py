"""The seeded, bounded shuffle buffer and its exact continuation from a saved state."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fsspec_shards.iteration.rng import CounterRNG
from fsspec_shards.iteration.shuffle import (
    OldestBuffered,
    ShuffleBuffer,
    replay_buffer,
    shuffle_key,
)


def shuffled(items, size, key=7):
    return list(ShuffleBuffer(size, CounterRNG(key)).shuffle(items))


def test_shuffle_yields_every_item_once():
    assert sorted(shuffled(range(100), 10)) == list(range(100))


def test_shuffle_changes_the_order_and_is_seeded():
    assert shuffled(range(100), 10) != list(range(100))
    assert shuffled(range(100), 10) == shuffled(range(100), 10)
    assert shuffled(range(100), 10, key=1) != shuffled(range(100), 10, key=2)


def test_buffer_of_one_keeps_the_order():
    assert shuffled(range(20), 1) == list(range(20))


def test_buffer_never_holds_more_than_its_size():
    buffer = ShuffleBuffer(5, CounterRNG(3))
    largest = 0

    def source():
        nonlocal largest
        for item in range(50):
            largest = max(largest, len(buffer))
            yield item

    list(buffer.shuffle(source()))
    assert largest <= 5
    with pytest.raises(OverflowError):
        full = ShuffleBuffer(1, CounterRNG(0), [1])
        full.add(2)


def test_keys_differ_per_consumer_and_epoch():
    keys = {
        shuffle_key(0, epoch, rank, worker)
        for epoch in range(3)
        for rank in range(2)
        for worker in range(2)
    }
    assert len(keys) == 12


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    length=st.integers(0, 40),
    size=st.integers(1, 12),
    cut=st.integers(0, 40),
)
def test_items_and_counter_continue_the_shuffle_exactly(length, size, cut):
    cut = min(cut, length)
    expected = shuffled(range(length), size)
    buffer = ShuffleBuffer(size, CounterRNG(7))
    source = iter(range(length))
    stream = buffer.shuffle(_positions(source, consumed := []))
    head = [next(stream) for _ in range(cut)]
    saved_items, saved_counter = list(buffer.items), buffer.rng.counter
    resumed = ShuffleBuffer(size, CounterRNG(7, saved_counter), saved_items)
    tail = list(resumed.shuffle(range(len(consumed), length)))
    assert head + tail == expected


def _positions(source, consumed):
    for item in source:
        consumed.append(item)
        yield item


def buffered_after(size: int, key: int, total: int, delivered: int):
    """(buffer items, rng counter, source ended) of a real buffer over ``range(total)``
    after ``delivered`` items came out."""
    buffer = ShuffleBuffer(size, CounterRNG(key))
    source_ended = []

    def source():
        yield from range(total)
        source_ended.append(True)

    stream = buffer.shuffle(source())
    for _ in range(delivered):
        next(stream)
    read = delivered + len(buffer.items)
    return list(buffer.items), buffer.rng.counter, bool(source_ended), read


@pytest.mark.parametrize("size", [1, 2, 5, 16])
def test_replay_rebuilds_the_buffer_from_the_counts_alone(size):
    for total in (0, 3, 40):
        for delivered in range(total + 1):
            items, counter, drained, read = buffered_after(size, 7, total, delivered)
            rng = CounterRNG(7)
            assert replay_buffer(size, rng, read, delivered, drained) == items
            assert rng.counter == counter


def test_replay_refuses_counts_no_stream_gives():
    with pytest.raises(ValueError, match="do not fit a shuffle buffer"):
        replay_buffer(4, CounterRNG(1), read=10, delivered=5, drained=False)
    with pytest.raises(ValueError, match="do not fit a shuffle buffer"):
        replay_buffer(4, CounterRNG(1), read=10, delivered=3, drained=True)
    with pytest.raises(ValueError, match="more than the 10 read"):
        replay_buffer(4, CounterRNG(1), read=10, delivered=11, drained=True)


def test_oldest_buffered_follows_the_smallest_read_index_still_held():
    buffer = ShuffleBuffer(6, CounterRNG(3))
    oldest = OldestBuffered()
    for index in range(200):
        buffer.add(index)
        oldest.read(index, index)
        if buffer.full:
            oldest.delivered(buffer.pop())
            assert oldest.oldest == min(buffer.items)
    while buffer.items:
        oldest.delivered(buffer.pop())
        assert oldest.oldest == (min(buffer.items) if buffer.items else None)
