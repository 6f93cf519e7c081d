"""A server that trickles is given up on (the stall rule of storage/transfer/target.py): a request
slower than ``min_rate`` over ``min_rate_window`` is ended, and only a request at that rate
starts a new failure chain, so every download ends. Against a real HTTP server that sends a
few bytes per request and stalls, through both transports.
"""

from __future__ import annotations

import random
import threading
import time

import pytest

from tests.integration.hostile_http import HostileServer, Trickle
from tests.wds_filesystem import QUICK_RETRIES, wds_filesystem

DATA = random.Random(22).randbytes(2 * 1024 * 1024)


def _read_in_time(fs, url: str, seconds: float) -> BaseException | bytes:
    """What reading ``url`` gave (bytes or the error), failing if it takes past ``seconds``
    (before the stall rule, such a read went on for hours)."""
    outcome: list = []

    def read() -> None:
        try:
            outcome.append(fs.cat_file(url))
        except Exception as exc:
            outcome.append(exc)

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    thread.join(seconds)
    assert outcome, f"the read of a trickling server was still going after {seconds}s"
    return outcome[0]


def test_a_server_that_sends_a_little_per_request_then_stalls_is_given_up_on(tmp_path, transport):
    with HostileServer() as server:
        url = server.put("t.bin", DATA, plan=[Trickle(1000, 0.0, 1, stall=30)] * 20)
        fs = wds_filesystem(
            "http",
            cache_dir=tmp_path / "cache",
            transport=transport,
            retries=3,
            **QUICK_RETRIES,
            timeout=0.5,
        )
        started = time.monotonic()
        error = _read_in_time(fs, url, 30)
        assert isinstance(error, OSError), error
        assert "t.bin" in str(error) and "after 3 attempts" in str(error)
        assert time.monotonic() - started < 15
        assert len(server.gets("t.bin")) == 3  # each trickle spent an attempt
        assert fs.cache_stats()["cached_files"] == 0


def test_a_server_that_keeps_moving_below_the_minimum_rate_is_given_up_on(tmp_path, transport):
    with HostileServer() as server:
        slow = Trickle(200, 0.05, 100_000)  # 4 kB/s, never silent for the time-out
        url = server.put("s.bin", DATA, plan=[slow] * 20)
        fs = wds_filesystem(
            "http",
            cache_dir=tmp_path / "cache",
            transport=transport,
            retries=3,
            **QUICK_RETRIES,
            timeout=5,
            min_rate="16KiB",
            min_rate_window=0.5,
        )
        error = _read_in_time(fs, url, 30)
        assert isinstance(error, OSError), error
        assert "below the minimum rate" in str(error) and "s.bin" in str(error)
        assert len(server.gets("s.bin")) == 3


def test_without_a_floor_a_slow_server_is_waited_for(tmp_path, transport):
    with HostileServer() as server:
        small = DATA[:20_000]
        url = server.put("k.bin", small, plan=[Trickle(500, 0.05, 40)])  # 10 kB/s for 2 s
        fs = wds_filesystem(
            "http",
            cache_dir=tmp_path / "cache",
            transport=transport,
            retries=3,
            **QUICK_RETRIES,
            timeout=5,
            min_rate=0,
            min_rate_window=0.2,
        )
        assert _read_in_time(fs, url, 30) == small


@pytest.mark.parametrize("value", [-1, "fast", True])
def test_a_bad_min_rate_is_refused_naming_the_option(tmp_path, value):
    with pytest.raises(ValueError, match="min_rate"):
        wds_filesystem(
            "http",
            cache_dir=tmp_path / "cache",
            transport="fsspec",
            retries=3,
            **QUICK_RETRIES,
            min_rate=value,
        )
