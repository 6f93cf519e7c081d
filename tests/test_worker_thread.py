"""The background thread behind the syncer and the deleter: order, drain, failures, fork."""

from __future__ import annotations

import logging
import os
import signal
import threading

from fsspec_shards.storage.core.worker_thread import WorkerThread


def test_items_run_in_order_on_one_named_daemon_thread_and_drain_waits_for_them():
    done: list[tuple[int, str]] = []

    def work(number: int) -> None:
        done.append((number, threading.current_thread().name))

    worker = WorkerThread("test-worker", work)
    for number in range(5):
        worker.submit(number)
    worker.drain()
    assert done == [(n, "test-worker") for n in range(5)]
    assert worker._thread is not None and worker._thread.daemon


def test_a_failure_that_escapes_the_work_is_logged_and_the_queue_goes_on(caplog):
    done: list[int] = []

    def work(number: int) -> None:
        if number == 1:
            raise OSError("no room")
        done.append(number)

    worker = WorkerThread("test-worker", work)
    with caplog.at_level(logging.WARNING, "fsspec_shards"):
        for number in range(3):
            worker.submit(number)
        worker.drain()
    assert done == [0, 2]
    [warning] = caplog.records
    assert "no room" in warning.getMessage()


def test_a_forked_child_starts_with_an_empty_queue_and_a_thread_of_its_own():
    release = threading.Event()
    worker = WorkerThread("test-worker", lambda action: action())
    worker.submit(lambda: release.wait(30))  # the parent stays busy
    pid = os.fork()
    if pid == 0:
        signal.alarm(10)
        try:
            worker.drain()  # returns at once: the parent's item is not the child's
            ran: list[str] = []
            worker.submit(lambda: ran.append("child"))
            worker.drain()
            os._exit(0 if ran == ["child"] else 1)
        except BaseException:
            os._exit(2)
    release.set()
    _, status = os.waitpid(pid, 0)
    worker.drain()
    assert os.waitstatus_to_exitcode(status) == 0
