"""Hits and counters batched in memory and written in one transaction
(:mod:`fsspec_shards.storage.cache.usage`), over a real index."""

from __future__ import annotations

import contextlib
import json
import os
import time

import pytest

from fsspec_shards.storage.cache import usage as usage_module
from fsspec_shards.storage.cache.index import Index
from fsspec_shards.storage.cache.usage import Usage, flush_all

KEY = "ab" + "0" * 62


@pytest.fixture(autouse=True)
def no_due_batch_during_a_test(monkeypatch):
    """A batch is due after a minute, not a second: a loaded box must not write a batch
    while a test looks at what is pending."""
    monkeypatch.setattr(usage_module, "FLUSH_INTERVAL_SECONDS", 60.0)


def _index(path) -> Index:
    path.mkdir(exist_ok=True)
    return Index(str(path), True, space_lock=contextlib.nullcontext, on_reset=lambda: None)


def test_hits_and_counts_gather_in_memory_and_one_flush_writes_them(tmp_path):
    index = _index(tmp_path)
    usage = Usage(index)
    for _ in range(3):
        usage.touch(KEY)
    usage.touch(KEY, count=False)  # a use, not counted as a hit
    usage.add("misses", 2)
    assert index.counters() == {}
    assert usage.pending_counts() == {"hits": 3, "misses": 2}
    usage.flush()
    assert index.counters() == {"hits": 3, "misses": 2}
    assert usage.pending_counts() == {}
    usage.add("misses")
    usage.flush()
    assert index.counters()["misses"] == 3  # added to, not replaced


def test_the_first_use_a_flush_interval_later_writes_the_batch_and_no_thread_before(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(usage_module, "FLUSH_INTERVAL_SECONDS", 0.2)
    index = _index(tmp_path)
    usage = Usage(index)
    usage.touch(KEY)
    usage.add("misses")
    time.sleep(0.5)
    assert index.counters() == {}  # nothing written once the uses returned
    usage.add("misses")  # finds the batch due: written before it returns
    assert index.counters() == {"hits": 1, "misses": 2}
    assert usage.pending_counts() == {}
    usage.touch(KEY)
    assert usage.pending_counts() == {"hits": 1}  # a new batch


def test_without_a_writable_index_the_counts_stay_pending_for_the_report():
    usage = Usage(None)
    usage.touch(KEY)
    usage.add("bytes_downloaded", 100)
    usage.flush()
    assert usage.pending_counts() == {"hits": 1, "bytes_downloaded": 100}


def test_forget_drops_what_is_pending(tmp_path):
    index = _index(tmp_path)
    usage = Usage(index)
    usage.touch(KEY)
    usage.forget()
    usage.flush()
    assert usage.pending_counts() == {} and index.counters() == {}


def test_flush_all_writes_every_cache_of_the_process(tmp_path):
    indexes = [_index(tmp_path / name) for name in ("one", "two")]
    usages = [Usage(index) for index in indexes]
    for amount, usage in enumerate(usages, 1):
        usage.add("retries", amount)
    flush_all()
    assert [index.counters() for index in indexes] == [{"retries": 1}, {"retries": 2}]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_starts_with_nothing_pending():
    usage = Usage(None)
    usage.add("hits", 5)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report what it finds pending, then leave at once
        try:
            os.close(read)
            os.write(write, json.dumps(usage.pending_counts()).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        child = json.loads(pipe.read())
    os.waitpid(pid, 0)
    assert child == {} and usage.pending_counts() == {"hits": 5}
