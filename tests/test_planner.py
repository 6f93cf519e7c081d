"""Whole-object fills (``planner.fill``): resume after cuts, adapt chunk sizes, verify, start
over on change."""

from __future__ import annotations

import errno
import hashlib
import io
import logging
import random
import uuid

import pytest

from fsspec_shards.errors import IntegrityError
from fsspec_shards.storage.backends import object_id
from fsspec_shards.storage.core.integrity import Checksum
from fsspec_shards.storage.core.retry import RetriesExhaustedError, RetryPolicy
from fsspec_shards.storage.core.verification import Known
from fsspec_shards.storage.transfer.planner import fill
from fsspec_shards.storage.transfer.target import ChunkSizer, Target
from tests.faults import Flip, Replace, Short, WholeBody
from tests.planned_faults import PlannedFaultFileSystem, UnknownSizeFileSystem

KiB = 1024
FAST = RetryPolicy(attempts=4, backoff=0.001, max_backoff=0.002, deadline=300.0, timeout=30.0)


def _object(size: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(size)


def _setup(size: int = 300 * KiB, plan: list | None = None, seed: int = 0):
    fs = PlannedFaultFileSystem(plan)
    path = f"/dl-{uuid.uuid4().hex}/shard.tar"
    data = _object(size, seed)
    fs.pipe_file(path, data)
    counters: dict[str, int] = {}

    def count(name: str, amount: int) -> None:
        counters[name] = counters.get(name, 0) + amount

    return fs, path, data, counters, count


def _target(fs, path, count, policy=FAST, verify="auto", checksum=None) -> Target:
    manifest = (Known(checksum, "manifest"),) if checksum is not None else ()
    return Target(fs, path, object_id(fs, path), policy, verify, manifest, count)


def _small_chunks() -> ChunkSizer:
    return ChunkSizer(size=64 * KiB, minimum=16 * KiB, maximum=128 * KiB)


def test_a_cut_mid_object_resumes_from_the_byte_reached_not_from_zero():
    fs, path, data, counters, count = _setup(plan=[None, ConnectionResetError("cut")])
    out = io.BytesIO()
    result = fill(_target(fs, path, count), out, chunks=_small_chunks())
    assert out.getvalue() == data
    assert result["size"] == len(data)
    starts = [start for start, _, _ in fs.reads]
    assert starts[1] == starts[2] > 0  # the failed range is asked again, not byte 0
    assert starts.count(0) == 1
    assert counters["retries"] == 1


def test_several_cuts_in_one_object_still_deliver_it_whole_with_little_waste():
    plan = [None, ConnectionResetError("cut"), None, TimeoutError("stall"), None, Short(1000)]
    fs, path, data, counters, count = _setup(size=600 * KiB, plan=plan)
    out = io.BytesIO()
    fill(_target(fs, path, count), out, chunks=_small_chunks())
    assert out.getvalue() == data
    assert counters["retries"] == 3
    assert counters["bytes_downloaded"] == len(data)  # failed reads delivered nothing twice


def test_chunk_size_halves_after_a_failure_and_grows_after_successes():
    chunks = ChunkSizer(size=4, minimum=1, maximum=16)
    chunks.succeeded()
    assert chunks.size == 8
    chunks.failed()
    assert chunks.size == 4
    chunks.succeeded()
    assert chunks.size == 4  # the failure lowered the ceiling
    for _ in range(5):
        chunks.failed()
    assert chunks.size == 1


def test_a_server_that_ignores_range_is_sliced_to_the_range():
    fs, path, data, _, count = _setup(plan=[None, WholeBody(), WholeBody()])
    out = io.BytesIO()
    fill(_target(fs, path, count), out, chunks=_small_chunks())
    assert out.getvalue() == data


def test_flipped_byte_is_discarded_and_downloaded_again_when_a_checksum_is_known():
    fs, path, data, counters, count = _setup(plan=[Flip(1234)])
    expected = Checksum("sha256", hashlib.sha256(data).hexdigest())
    out = io.BytesIO()
    result = fill(_target(fs, path, count, checksum=expected), out)
    assert out.getvalue() == data
    assert result["checksum"] == str(expected)
    assert counters["integrity_failures"] == 1


def test_a_copy_corrupt_at_rest_is_downloaded_twice_then_integrity_error_with_one_warning(caplog):
    fs, path, data, counters, count = _setup(plan=[Flip(7)] * 10)
    expected = Checksum("md5", hashlib.md5(data).hexdigest())
    out = io.BytesIO()
    with caplog.at_level(logging.WARNING, "fsspec_shards"):
        with pytest.raises(IntegrityError) as raised:
            fill(_target(fs, path, count, checksum=expected), out)
    assert raised.value.expected == str(expected)
    assert raised.value.actual.startswith("md5:") and raised.value.actual != str(expected)
    assert path in str(raised.value)
    assert counters["integrity_failures"] == 2
    assert counters["bytes_downloaded"] == 2 * len(data)
    assert out.getvalue() == b""  # nothing unverified is left behind
    warnings = [record for record in caplog.records if record.levelno == logging.WARNING]
    assert len(warnings) == 1 and "integrity check failed" in warnings[0].getMessage()


@pytest.mark.parametrize("verify", ["size", False])
def test_without_checksum_verification_a_flipped_byte_passes(verify):
    fs, path, data, counters, count = _setup(plan=[Flip(7)])
    expected = Checksum("sha256", hashlib.sha256(data).hexdigest())
    out = io.BytesIO()
    result = fill(_target(fs, path, count, verify=verify, checksum=expected), out)
    assert out.getvalue() != data and len(out.getvalue()) == len(data)
    assert result["checksum"] is None
    assert "integrity_failures" not in counters


def test_object_replaced_between_reads_starts_over_instead_of_splicing_versions():
    new = _object(300 * KiB, seed=1)
    plan = [None, ConnectionResetError("cut"), Replace(new)]
    fs, path, _, _, count = _setup(plan=plan)
    out = io.BytesIO()
    result = fill(_target(fs, path, count), out, chunks=_small_chunks())
    assert out.getvalue() == new
    assert result["identity"].startswith("ETag=v2")


def test_object_replaced_without_any_failure_is_noticed_at_the_end():
    new = _object(300 * KiB, seed=2)
    fs, path, _, _, count = _setup(plan=[None, Replace(new)])
    out = io.BytesIO()
    fill(_target(fs, path, count), out, chunks=_small_chunks())
    assert out.getvalue() == new


def test_an_object_that_keeps_changing_is_given_up_on():
    # each pass reads three chunks (64 + 128 + 108 KiB); the second sees a new version
    replacements = [Replace(_object(300 * KiB, seed=10 + i)) for i in range(FAST.attempts)]
    plan = [item for replacement in replacements for item in (None, replacement, None)]
    fs, path, _, _, count = _setup(plan=plan)
    with pytest.raises(OSError, match="changed 4 times"):
        fill(_target(fs, path, count), io.BytesIO(), chunks=_small_chunks())


def test_persistent_transient_failure_gives_up_after_the_attempts():
    fs, path, _, counters, count = _setup(plan=[ConnectionResetError("cut")] * 10)
    with pytest.raises(RetriesExhaustedError, match="after 4 attempts"):
        fill(_target(fs, path, count), io.BytesIO())
    assert counters["retries"] == 3


def test_permanent_failure_is_raised_at_once():
    fs, path, _, counters, count = _setup(plan=[PermissionError(errno.EACCES, "denied")])
    with pytest.raises(PermissionError, match=path):
        fill(_target(fs, path, count), io.BytesIO())
    assert "retries" not in counters


@pytest.mark.parametrize("size", [64 * KiB * 3, 64 * KiB * 3 + 5])
def test_unknown_size_downloads_until_the_body_ends_also_exactly_at_a_chunk_boundary(size):
    fs = UnknownSizeFileSystem()
    path = f"/dl-{uuid.uuid4().hex}/shard.tar"
    data = _object(size)
    fs.pipe_file(path, data)
    out = io.BytesIO()
    chunks = ChunkSizer(64 * KiB, maximum=64 * KiB)
    result = fill(_target(fs, path, None), out, chunks=chunks)
    assert out.getvalue() == data and result["size"] == size
