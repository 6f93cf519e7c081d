"""The counter-based RNG: a batch of bounded draws equals the same draws one by one."""

from __future__ import annotations

import pytest

from fsspec_shards.iteration.rng import CounterRNG


@pytest.mark.parametrize("bound", [1, 2, 3, 1000, 2**63 + 7])
def test_below_many_draws_what_below_draws_and_ends_at_the_same_counter(bound):
    one_by_one, batched = CounterRNG(11, counter=5), CounterRNG(11, counter=5)
    expected = [one_by_one.below(bound) for _ in range(500)]
    assert batched.below_many(bound, 500) == expected
    assert batched.counter == one_by_one.counter


def test_below_many_refuses_an_empty_range():
    with pytest.raises(ValueError, match="bound must be positive"):
        CounterRNG(1).below_many(0, 3)
