"""Where the ranges of a parallel fill start, from the fill's own rule (``filling._Layout``
and ``range_plan.Ramp``), for tests that aim a fault at one range."""

from __future__ import annotations

from fsspec_shards.storage.transfer.range_plan import Ramp
from fsspec_shards.storage.transfer.ranges import _Layout


def range_starts(size: int, ranges_in_flight: int) -> list[int]:
    """The first byte of each range of a fill of ``size`` bytes with a fixed
    ``ranges_in_flight`` on a store answering ranges: the first range, then the rest."""
    ramp = Ramp(ranges_in_flight, "test:layout")
    layout = _Layout(size, ramp)
    starts = [layout.take().start]
    ramp.ranges_answered(True)
    while layout.cursor < size:
        starts.append(layout.take().start)
    return starts
