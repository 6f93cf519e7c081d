"""One stream (``transfer/one_stream.py``): ranged reads and one-request fills resumed from
the byte reached. The passes around them: tests/test_planner.py."""

from __future__ import annotations

import io

from fsspec_shards.storage.transfer.one_stream import fill_one_stream, read_range
from tests.faults import Short
from tests.test_planner import _setup, _target


def test_ranged_read_continues_after_a_short_read():
    fs, path, data, _, count = _setup(plan=[Short(10), ConnectionResetError("cut")])
    target = _target(fs, path, count)
    got = read_range(target, 100, 5000, target.expect(fs.info(path)).version)
    assert got == data[100:5000]
    assert [start for start, _, _ in fs.reads] == [100, 110, 110]


def test_one_stream_asks_once_to_the_end_and_after_a_cut_from_the_byte_reached():
    fs, path, data, _, count = _setup(plan=[Short(1000)])
    target = _target(fs, path, count)
    out = io.BytesIO()
    received = []
    written = fill_one_stream(
        target, out, target.expect(fs.info(path)).version, None, None, received.append
    )
    assert written == len(data) and out.getvalue() == data and sum(received) == len(data)
    assert [(start, end) for start, end, _ in fs.reads] == [(0, len(data)), (1000, len(data))]
