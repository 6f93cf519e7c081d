"""The ranges-in-flight rule (storage/transfer/range_plan.py): gate, bounds, what is
learned (the option's parser: tests/test_options.py).

The adaptive ramp against a link that rewards ranges (and one that does not) is in
tests/integration/test_ranges_in_flight.py, through a pacing proxy.
"""

from __future__ import annotations

import json
import threading
import time

import pytest

from fsspec_shards.storage.transfer import range_plan
from fsspec_shards.storage.transfer.range_plan import Ramp, link_of


@pytest.fixture(autouse=True)
def _fresh_process_state(monkeypatch):
    monkeypatch.setattr(range_plan, "_learned", {})
    monkeypatch.setattr(range_plan, "_recalled", set())
    monkeypatch.setattr(range_plan, "_slots_taken", 0)


def test_the_link_is_the_store_not_the_object():
    assert link_of("s3", "bucket/a/b.tar") == link_of("s3", "bucket/c.tar") == "s3:bucket"
    assert link_of("https", "https://host:8080/x.tar") == "https:https://host:8080"
    assert link_of("s3", "other/a") != link_of("s3", "bucket/a")


def _admitted(ramp: Ramp, worker: int, timeout: float = 5.0) -> bool | None:
    """What ``ramp.admit(worker)`` returned, or None while it still waits."""
    outcome: list[bool] = []
    thread = threading.Thread(target=lambda: outcome.append(ramp.admit(worker)), daemon=True)
    thread.start()
    thread.join(timeout)
    return outcome[0] if outcome else None


def test_a_fixed_number_runs_that_many_once_the_first_range_was_answered_as_one():
    ramp = Ramp(3, "s3:bucket")
    assert _admitted(ramp, 1, timeout=0.05) is None  # before the first answer: one stream
    ramp.ranges_answered(True)
    assert _admitted(ramp, 1) is True
    assert _admitted(ramp, 2) is True
    assert ramp.span(99 * 2**20) == 33 * 2**20  # the rest in 3 equal ranges
    assert ramp.span(66 * 2**20) == 33 * 2**20


def test_a_200_answer_to_the_first_range_keeps_the_fill_at_one_stream():
    ramp = Ramp("auto", "http:x")
    ramp.ranges_answered(False)
    assert _admitted(ramp, 1) is False
    assert ramp.span(50 * 2**20) == 50 * 2**20  # the rest in one request


def test_the_first_auto_range_is_small_and_decides():
    ramp = Ramp("auto", "s3:bucket")
    assert ramp.span(100 * 2**20) == range_plan.FIRST_BYTES


def test_the_streams_of_all_fills_of_a_process_are_bounded(monkeypatch):
    monkeypatch.setattr(range_plan, "PROCESS_MAX", 3)
    ramps = [Ramp(4, f"s3:b{n}") for n in range(2)]
    for ramp in ramps:
        ramp.ranges_answered(True)
    admitted = [_admitted(ramp, worker) for ramp in ramps for worker in (1, 2, 3)]
    assert admitted.count(True) == 3  # the rest run with fewer streams, never wait
    ramps[0].release(1)
    assert _admitted(ramps[1], 3) is True


def test_a_store_that_settled_on_one_stream_starts_there_without_probing():
    range_plan._learned["http:x"] = (1, 0)
    ramp = Ramp("auto", "http:x")
    ramp.ranges_answered(True)
    assert _admitted(ramp, 1) is False
    assert ramp.span(60 * 2**20) == 60 * 2**20


def test_a_store_that_settled_on_eight_starts_with_eight_without_a_first_range():
    range_plan._learned["s3:bucket"] = (8, 0)
    ramp = Ramp("auto", "s3:bucket")
    assert not ramp.gated  # it answered ranges before: no 1 MiB request alone first
    assert all(_admitted(ramp, worker) for worker in range(1, 8))
    assert ramp.span(80 * 2**20) == 10 * 2**20  # the rest in 8 equal ranges


def test_a_closed_ramp_lets_waiting_workers_go():
    ramp = Ramp(4, "s3:bucket")
    outcome: list[bool] = []
    thread = threading.Thread(target=lambda: outcome.append(ramp.admit(1)), daemon=True)
    thread.start()
    ramp.close()
    thread.join(5)
    assert outcome == [False]


def test_a_store_settled_at_one_stream_is_filled_by_one_request_until_its_next_probe():
    assert not range_plan.one_request("auto", "http:x")  # unknown: probed
    range_plan._learned["http:x"] = (1, 0)
    fills = [range_plan.one_request("auto", "http:x") for _ in range(range_plan.REPROBE_AT_ONE)]
    assert all(fills)
    assert not range_plan.one_request("auto", "http:x")  # due: the ramp probes again
    ramp = Ramp("auto", "http:x")
    assert ramp.probing and not ramp.gated
    assert range_plan.one_request(1, "s3:any") and not range_plan.one_request(4, "s3:any")


def test_an_unknown_store_is_probed():
    ramp = Ramp("auto", "s3:new")
    assert ramp.probing and ramp.gated


def test_a_range_is_split_for_a_late_stream_only_when_enough_is_left():
    assert range_plan.split_point(0, 2 * range_plan.SPLIT_MIN) == range_plan.SPLIT_MIN
    assert range_plan.split_point(10, 10 + range_plan.SPLIT_MIN - 1) is None


def test_the_round_trip_after_the_first_range_is_not_measured_as_the_links_rate():
    # a link capped as a whole: one stream gets all of it, two share it. Worker 0's first
    # range is answered, then its next request takes 0.25 s to start (a busy machine).
    # Measured from the gate, that pause looks like a slow single stream and a second
    # stream like a gain; measured from the next request's bytes, one stream is enough.
    ramp = Ramp("auto", "https:https://link")
    done = threading.Event()
    streaming: set[int] = set()
    lock = threading.Lock()

    def link(rate: float = 50e6) -> None:  # bytes by elapsed time: load does not change rates
        last = time.monotonic()
        while not done.wait(0.005):
            now = time.monotonic()
            with lock:
                workers = sorted(streaming)
            for worker in workers:
                ramp.moved(worker, int(rate * (now - last) / len(workers)))
            last = now

    def worker_0() -> None:
        ramp.requesting(0)
        ramp.moved(0, range_plan.FIRST_BYTES)
        ramp.ranges_answered(True)
        time.sleep(0.25)
        ramp.requesting(0)
        with lock:
            streaming.add(0)

    def worker_1() -> None:
        if ramp.admit(1):
            ramp.requesting(1)
            with lock:
                streaming.add(1)

    for target in (link, worker_0, worker_1):
        threading.Thread(target=target, daemon=True).start()
    steering = threading.Thread(target=ramp.steer, args=(done,), daemon=True)
    steering.start()
    steering.join(10)
    done.set()
    ramp.close()
    assert not steering.is_alive()
    assert range_plan._learned["https:https://link"] == (1, 0)  # settled at one stream


def test_the_link_is_the_endpoint_without_credentials():
    assert link_of("s3", "bucket/a", "http://127.0.0.1:9000") == "s3:http://127.0.0.1:9000"
    assert link_of("s3", "other/b", "http://127.0.0.1:9000") == "s3:http://127.0.0.1:9000"
    assert link_of("https", "https://user:secret@host:8443/x") == "https:https://host:8443"
    assert "secret" not in link_of("s3", "b/a", "https://key:secret@minio.example")


def test_what_a_store_settled_on_is_kept_in_the_cache_directory_for_the_next_process(tmp_path):
    # the fill ended within the first measurement at one stream (moto, loopback)
    ramp = Ramp("auto", "s3:http://far:1", str(tmp_path), eager=True)
    ended = threading.Event()
    ended.set()
    ramp.steer(ended)
    kept = json.loads((tmp_path / range_plan.PLAN_FILE).read_text())
    assert kept["s3:http://far:1"][0] == 1
    range_plan.forget()  # a new process
    assert range_plan.one_request("auto", "s3:http://far:1", str(tmp_path))  # no probe
    assert not range_plan.one_request("auto", "s3:http://other:1", str(tmp_path))


def test_a_kept_level_older_than_the_reprobe_period_is_probed_again(tmp_path):
    old = time.time() - range_plan.REPROBE_AFTER - 1
    (tmp_path / range_plan.PLAN_FILE).write_text(
        json.dumps({"s3:a": [1, old], "s3:b": [4, time.time()], "s3:c": "junk"})
    )
    assert not range_plan.one_request("auto", "s3:a", str(tmp_path))
    ramp = Ramp("auto", "s3:b", str(tmp_path))
    assert ramp.level == 4 and not ramp.probing and not ramp.gated
    assert not range_plan.one_request("auto", "s3:c", str(tmp_path))


def test_an_unreadable_plan_file_costs_a_probe_and_nothing_else(tmp_path):
    (tmp_path / range_plan.PLAN_FILE).write_bytes(b"\xff not json")
    ramp = Ramp("auto", "s3:x", str(tmp_path), eager=True)
    assert ramp.probing
    ramp.ranges_answered(False)
    assert json.loads((tmp_path / range_plan.PLAN_FILE).read_text())["s3:x"][0] == 1


def test_an_eager_fill_asks_its_first_range_to_the_end_and_may_add_streams_at_once():
    ramp = Ramp("auto", "s3:new", eager=True)
    assert ramp.probing and not ramp.gated and ramp.answered
    assert ramp.span(100 * 2**20) == 100 * 2**20  # one request, as ranges_in_flight=1


def test_an_added_stream_answered_with_the_whole_object_settles_the_store_at_one():
    ramp = Ramp("auto", "http:x", eager=True)
    with ramp._cond:
        ramp.allowed = 2  # the probe added a stream
    assert _admitted(ramp, 1) is True
    ramp.ranges_answered(False)  # its range came back as a 200
    assert not ramp.keeps(1)
    assert range_plan._learned["http:x"] == (1, 0)
    assert range_plan.one_request("auto", "http:x")


def test_a_fill_that_ends_before_its_second_stream_was_measured_settles_at_one():
    # moto on a busy machine: the object ends while the probe waits for a second stream's
    # rate; one stream carried it about as fast as a probe could tell, so the next fill of
    # the store is one request, not another probe
    ramp = Ramp("auto", "s3:fast", eager=True)
    done = threading.Event()

    def worker_0() -> None:
        ramp.requesting(0)
        while not done.is_set():
            ramp.moved(0, 2**20)
            time.sleep(0.005)

    threading.Thread(target=worker_0, daemon=True).start()
    threading.Timer(0.25, done.set).start()  # the object ends during the probe
    ramp.steer(done)
    assert range_plan._learned["s3:fast"] == (1, 0)
    assert range_plan.one_request("auto", "s3:fast")


def test_a_store_whose_one_stream_moves_enough_is_not_probed_for_more():
    # loopback (moto): one stream at hundreds of MB/s; a second request would cost the
    # server a copy of the whole object, so the store settles at one without trying two
    ramp = Ramp("auto", "s3:loopback", eager=True)
    done = threading.Event()
    per_tick = int(range_plan.ONE_IS_ENOUGH * 2 * 0.005)

    def worker_0() -> None:
        ramp.requesting(0)
        last = time.monotonic()
        while not done.is_set():
            time.sleep(0.005)
            now = time.monotonic()  # bytes by elapsed time: load does not change the rate
            ramp.moved(0, int(per_tick * (now - last) / 0.005))
            last = now

    threading.Thread(target=worker_0, daemon=True).start()
    try:
        ramp.steer(done)
        assert ramp.allowed == 1  # no second stream was let in
        assert range_plan._learned["s3:loopback"] == (1, 0)
    finally:
        done.set()


def test_a_block_fills_first_block_is_asked_in_pieces_where_ranges_may_pay():
    two_mib = 2 * 2**20
    assert Ramp("auto", "s3:new").first_pieces(two_mib) == range_plan.FIRST_PIECES
    assert Ramp(2, "s3:new").first_pieces(two_mib) == 2  # never more than the number asked
    assert Ramp("auto", "s3:new").first_pieces(2**20) == 2  # pieces of PIECE_BYTES at least
    assert Ramp("auto", "s3:new").first_pieces(64 * 1024) == 1
    assert Ramp(1, "s3:new").first_pieces(two_mib) == 1  # one request asked for
    range_plan._learned["s3:loopback"] = (1, 0)
    assert Ramp("auto", "s3:loopback").first_pieces(two_mib) == 1  # ranges do not pay there
    range_plan._learned["s3:far"] = (4, 0)
    assert Ramp("auto", "s3:far").first_pieces(two_mib) == range_plan.FIRST_PIECES


def test_the_pieces_of_a_first_block_take_process_slots_and_give_them_back(monkeypatch):
    monkeypatch.setattr(range_plan, "PROCESS_MAX", 2)
    ramp = Ramp("auto", "s3:a")
    assert ramp.first_pieces(2 * 2**20) == 3  # the first piece is the fill's own stream
    assert Ramp("auto", "s3:b").first_pieces(2 * 2**20) == 1  # no slot left: one request
    ramp.pieces_ended(3)
    assert Ramp("auto", "s3:c").first_pieces(2 * 2**20) == 3


@pytest.mark.parametrize(
    ("as_ranges", "rate", "settled"),
    [(True, 25e6, None), (True, None, None), (False, 25e6, 1), (True, 1e9, 1)],
    ids=["ranges-pay", "rate-unknown", "whole-object-200", "one-stream-enough"],
)
def test_the_pieces_answers_settle_a_store_where_one_stream_is_enough(
    tmp_path, as_ranges, rate, settled
):
    ramp = Ramp("auto", "s3:x", str(tmp_path))
    ramp.first_answered(as_ranges, rate)
    assert ramp.answered  # the gate is open either way
    assert range_plan._learned.get("s3:x", (None,))[0] == settled
    kept = (tmp_path / range_plan.PLAN_FILE).exists()
    assert kept == (settled is not None)  # the next process starts from one request
    assert Ramp("auto", "s3:x").first_pieces(2 * 2**20) == (1 if settled else 4)
