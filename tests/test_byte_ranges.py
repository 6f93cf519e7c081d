"""Byte ranges with Python's slice rules (storage/byte_ranges.py); read straight from the
backend, of one version: tests/test_fetcher.py (``read_ranges``) and the integration tests."""

from __future__ import annotations

import io

import pytest

from fsspec_shards.storage.byte_ranges import read_local_range, resolve_range


@pytest.mark.parametrize(
    ("start", "end", "expected"),
    [
        (None, None, (0, 10)),
        (2, 5, (2, 5)),
        (-3, None, (7, 10)),
        (None, -4, (0, 6)),
        (8, 50, (8, 10)),
        (6, 2, (6, 6)),  # an empty range, never a negative one
        (-50, 3, (0, 3)),
    ],
)
def test_a_range_resolves_as_a_slice_of_the_object_does(start, end, expected):
    assert resolve_range(start, end, 10) == expected
    data = bytes(range(10))
    assert read_local_range(io.BytesIO(data), start, end) == data[start:end]


def test_without_a_size_only_a_closed_range_from_the_front_resolves():
    assert resolve_range(3, 9, None) == (3, 9)
    for start, end in [(-1, 5), (0, None), (0, -2)]:
        with pytest.raises(ValueError, match="needs the object's size"):
            resolve_range(start, end, None)
