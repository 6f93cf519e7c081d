"""Units of size (units.py)."""

from fsspec_shards.units import MiB


def test_a_mebibyte_is_two_to_the_twentieth_bytes():
    assert MiB == 1 << 20
