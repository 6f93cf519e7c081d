"""The one verification rule: every known checksum is checked, none instead of another."""

from __future__ import annotations

import hashlib

import google_crc32c
import pytest

from fsspec_shards.checksums import Checksum
from fsspec_shards.storage.core import verification
from fsspec_shards.storage.core.verification import (
    BACKEND,
    Expectation,
    Known,
    Mismatch,
    WholeHasher,
    expected,
)

DATA = b"the one verification rule\n" * 5000
SHA = Checksum("sha256", hashlib.sha256(DATA).hexdigest())
MD5 = Checksum("md5", hashlib.md5(DATA).hexdigest())
CRC = Checksum("crc32c", google_crc32c.Checksum(DATA).digest().hex())


def _computed(data: bytes, expectation: Expectation) -> list[Checksum]:
    hasher = WholeHasher(expectation.algorithms)
    for start in range(0, len(data), 7000):  # in pieces, as a download hands them over
        hasher.update(data[start : start + 7000])
    return hasher.checksums()


def test_every_checksum_from_the_manifests_and_the_backend_is_expected():
    manifest = [Known(MD5, "manifest SUMS"), Known(SHA, "block manifest SUMS.blocks")]
    expectation = expected(manifest, [CRC, MD5], "auto")
    assert set(expectation.checksums) == {SHA, MD5, CRC}  # none skipped for another
    assert expectation.algorithms == ("md5", "sha256", "crc32c")  # each hashed once
    assert expectation.strongest() == SHA
    assert expectation.sources_of(MD5) == f"manifest SUMS and {BACKEND}"
    assert expectation.mismatch(_computed(DATA, expectation)) is None


def test_one_disagreeing_checksum_fails_whatever_the_others_say():
    wrong_md5 = Checksum("md5", hashlib.md5(b"other bytes").hexdigest())
    expectation = expected([Known(wrong_md5, "manifest SUMS")], [CRC], "auto")
    expectation = Expectation((*expectation.known, Known(SHA, "block manifest SUMS.blocks")))
    found = expectation.mismatch(_computed(DATA, expectation))
    assert found == Mismatch(str(wrong_md5), str(MD5), "manifest SUMS")


def test_only_the_size_is_checked_with_verify_size_or_off():
    assert not expected([Known(SHA, "manifest SUMS")], [MD5], "size")
    assert not expected([Known(SHA, "manifest SUMS")], [MD5], False)
    assert expected([], [], "auto").strongest() is None


def test_large_pieces_are_hashed_by_every_algorithm_at_once_into_the_same_checksums():
    # pieces from CONCURRENT_FROM on go to helper threads for all but one algorithm;
    # update() returns once every algorithm has the piece, so a reused buffer is safe
    data = DATA * 40  # 5 MiB
    expectation = expected([Known(SHA, "manifest SUMS")], [MD5, CRC], "auto")
    hasher = WholeHasher(expectation.algorithms)
    buffer = bytearray(verification.CONCURRENT_FROM * 3)
    for start in range(0, len(data), len(buffer)):
        piece = data[start : start + len(buffer)]
        buffer[: len(piece)] = piece
        hasher.update(memoryview(buffer)[: len(piece)])
        buffer[:] = bytes(len(buffer))  # the caller reuses its buffer at once
    assert hasher.checksums() == [
        Checksum("sha256", hashlib.sha256(data).hexdigest()),
        Checksum("md5", hashlib.md5(data).hexdigest()),
        Checksum("crc32c", google_crc32c.Checksum(data).digest().hex()),
    ]


def test_a_helper_threads_failure_is_raised_to_the_caller_of_update():
    class Broken:
        def update(self, data):
            raise RuntimeError("cannot hash")

    hasher = WholeHasher(["sha256", "md5"])
    hasher._hashers[1] = Broken()
    with pytest.raises(RuntimeError, match="cannot hash"):
        hasher.update(bytes(verification.CONCURRENT_FROM))


def test_crc32c_takes_a_writable_buffer_as_a_file_read_back_hands_it_over():
    # the ranges fill reads the file back into one reused bytearray (one_stream.OrderedHasher)
    hasher = WholeHasher(["crc32c"])
    hasher.update(memoryview(bytearray(DATA)))
    assert hasher.checksums() == [CRC]


def test_a_forked_child_hashes_large_pieces_with_threads_of_its_own():
    # the parent's hashing threads are not in a forked child: reusing its executor would
    # wait forever for them
    import multiprocessing

    parent = WholeHasher(["sha256", "md5"])
    parent.update(bytes(verification.CONCURRENT_FROM))  # the parent's threads exist now
    context = multiprocessing.get_context("fork")
    with context.Pool(1) as pool:
        digests = pool.apply_async(_large_piece_checksums).get(timeout=60)
    assert digests == [
        Checksum("sha256", hashlib.sha256(bytes(verification.CONCURRENT_FROM)).hexdigest()),
        Checksum("md5", hashlib.md5(bytes(verification.CONCURRENT_FROM)).hexdigest()),
    ]


def _large_piece_checksums() -> list[Checksum]:
    hasher = WholeHasher(["sha256", "md5"])
    hasher.update(bytes(verification.CONCURRENT_FROM))
    return hasher.checksums()
