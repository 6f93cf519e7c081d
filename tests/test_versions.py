"""A response is used only if it is of the version expected and starts where asked."""

from __future__ import annotations

import datetime
import threading
import time

import pytest

from fsspec_shards.storage.backends import backend_for
from fsspec_shards.storage.backends.versions import (
    Facts,
    Unproven,
    Version,
    VersionMismatch,
    check_response,
    expected_version,
    facts_from_headers,
    parse_content_range,
    timestamp,
)
from fsspec_shards.storage.core.retry import TransientError, is_transient

LAST_MODIFIED = "Wed, 02 Dec 2026 10:00:00 GMT"


def test_content_range_gives_the_first_byte_and_the_total():
    assert parse_content_range("bytes 100-199/1000") == (100, 200, 1000)
    assert parse_content_range("bytes 0-9/*") == (0, 10, None)
    assert parse_content_range("bytes */1000") == (None, None, None)
    assert parse_content_range(None) == (None, None, None)


def test_a_partial_response_starting_elsewhere_than_asked_is_a_retryable_error():
    with pytest.raises(TransientError, match="starts at byte 7, asked for 0") as raised:
        check_response(Facts(status=206, start=7, total=100), 0, Version(100))
    assert is_transient(raised.value)
    with pytest.raises(TransientError, match="without a valid Content-Range"):
        check_response(Facts(status=206), 0, Version(100))
    check_response(Facts(status=206, start=5, total=100), 5, Version(100))


@pytest.mark.parametrize(
    ("expected", "facts"),
    [
        (Version(100, '"abc"'), Facts(200, total=101)),
        (Version(100, '"abc"'), Facts(206, 0, 100, etag='"abd"')),
        (Version(100, None, "7"), Facts(206, 0, 100, version="8")),
        (Version(100, None, None, 1000.0), Facts(206, 0, 100, modified=1001.0)),
    ],
)
def test_another_size_etag_version_or_date_is_another_version(expected, facts):
    with pytest.raises(VersionMismatch):
        check_response(facts, 0, expected)


def test_etags_compare_by_their_opaque_part_and_dates_only_without_etag():
    Version(100, '"abc"').check(Facts(206, 0, 100, etag='W/"abc"'))
    Version(100, "abc").check(Facts(206, 0, 100, etag='"abc"'))
    Version(100, '"abc"', None, 1000.0).check(Facts(206, 0, 100, etag='"abc"', modified=5.0))


def test_what_the_start_lacks_the_first_response_fills_in_and_later_ones_must_match():
    version = Version()
    assert not version.identified
    version.check(Facts(206, 0, 100, etag='"e1"'))
    assert (version.size, version.etag, version.identified) == (100, '"e1"', True)
    with pytest.raises(VersionMismatch, match="size 120, expected 100"):
        version.check(Facts(206, 50, 120, etag='"e1"'), 50)


def test_an_answer_that_proves_no_version_is_used_only_whole_and_nothing_is_spliced_on():
    partial = Facts(206, 0, 100, stop=50)
    with pytest.raises(Unproven, match='no ETag, version or Last-Modified .* ETag "abc"'):
        check_response(partial, 0, Version(100, '"abc"'))
    version = Version(100, '"abc"')
    check_response(Facts(206, 0, 100, stop=100), 0, version)  # the whole object, one answer
    with pytest.raises(Unproven, match="nothing may be spliced onto it"):
        check_response(Facts(206, 60, 100, stop=100, etag='"abc"'), 60, version)  # a resume
    check_response(Facts(200, None, 100), 0, Version(100, '"abc"'))  # a 200 from byte 0
    with pytest.raises(Unproven):
        check_response(Facts(200, None, 100), 10, Version(100, '"abc"'))  # its tail: spliced


def test_without_the_etag_every_identity_field_an_answer_carries_is_compared():
    # the answer leaves the ETag out: its Last-Modified is compared (and then suffices)
    with pytest.raises(VersionMismatch, match="Last-Modified differs"):
        Version(100, '"abc"', None, 1000.0).check(Facts(206, 10, 100, modified=1001.0), 10)
    Version(100, '"abc"', None, 1000.0).check(Facts(206, 10, 100, modified=1000.0), 10)
    with pytest.raises(VersionMismatch, match="size 90"):
        Version(100, '"abc"', None, 1000.0).check(Facts(206, 10, 90, modified=1000.0), 10)


def test_a_block_checked_read_and_a_transport_that_cannot_say_take_answers_without_proof():
    blocks = Version(100, '"abc"')
    blocks.blocks_checked = True  # every block is checked against its digest
    check_response(Facts(206, 10, 100, stop=20), 10, blocks)
    cat_file = Version(100, '"abc"')  # cat_file results carry nothing: info() is asked
    check_response(Facts(206, 10, says_version=False), 10, cat_file)
    assert cat_file.unconfirmed == 1
    sizeless = Version(100)
    sizeless.check(Facts(206, 0, 100))
    assert sizeless.unconfirmed == 0  # without identity the size is what there is to compare


def test_if_match_is_sent_only_for_a_strong_etag():
    assert Version(1, '"abc"').strong_etag == '"abc"'
    assert Version(1, "abc").strong_etag == '"abc"'
    assert Version(1, 'W/"abc"').strong_etag is None
    assert Version(1).strong_etag is None


def test_headers_give_the_facts_and_a_200_its_length_as_the_total():
    partial = facts_from_headers(
        206,
        {"Content-Range": "bytes 5-9/10", "ETag": '"e"', "Last-Modified": LAST_MODIFIED},
    )
    assert (partial.start, partial.total, partial.etag) == (5, 10, '"e"')
    assert partial.modified == timestamp(LAST_MODIFIED)
    whole = facts_from_headers(
        200, {"Content-Length": "10", "x-goog-generation": "3"}, "x-goog-generation"
    )
    assert (whole.total, whole.version) == (10, "3")
    assert (
        facts_from_headers(200, {"Content-Length": "4", "Content-Encoding": "gzip"}).total is None
    )


def test_dates_compare_in_whole_seconds_whatever_their_form():
    moment = datetime.datetime(2026, 12, 2, 10, 0, 0, 400_000, tzinfo=datetime.timezone.utc)
    assert timestamp(moment) == timestamp(LAST_MODIFIED) == timestamp("2026-12-02T10:00:00Z")
    assert timestamp("not a date") is None


@pytest.mark.parametrize(
    ("protocol", "info", "version"),
    [
        ("s3", {"size": 5, "ETag": '"e"', "VersionId": "v1"}, (5, '"e"', "v1")),
        ("s3", {"size": 5, "ETag": '"e-2"', "VersionId": "null"}, (5, '"e-2"', None)),
        ("gcs", {"size": 5, "etag": "CJ", "generation": 17}, (5, "CJ", "17")),
        ("az", {"size": 5, "etag": '"0x8D"', "version_id": None}, (5, '"0x8D"', None)),
        ("https", {"size": 5, "ETag": '"n-5"'}, (5, '"n-5"', None)),
        ("https", {"size": 5}, (5, None, None)),
    ],
)
def test_each_backend_describes_a_version_in_its_own_fields(protocol, info, version):
    expected = expected_version(backend_for(protocol).version_fields, info)
    assert (expected.size, expected.etag, expected.version) == version


def test_a_fresh_info_matches_the_version_when_nothing_tells_them_apart():
    read = Version(100, '"abc"')
    assert read.matches(Version(100, 'W/"abc"', None, 5.0))
    assert not read.matches(Version(100, '"abd"'))
    assert not read.matches(Version(101))
    assert Version(100, None, None, 7.0).matches(Version(100, None, None, 7.0))
    assert not Version(100, None, None, 7.0).matches(Version(100, None, None, 8.0))


class _SlowFacts(Facts):
    """Facts whose ETag takes a moment to read: the thread switches there, as it may
    between any two steps of a check."""

    def __getattribute__(self, name):
        if name == "etag":
            time.sleep(0.001)
        return super().__getattribute__(name)


def test_answers_arriving_together_adopt_one_version_never_two():
    # A block fill's first pieces answer on several threads at once, before any version is
    # known: the first adopts its ETag, an answer of another version is a mismatch.
    for _ in range(10):
        version = Version(100)
        version.blocks_checked = True
        start = threading.Barrier(6)
        adopted: list[str] = []

        def answer(etag: str, version: Version = version, start=start, adopted=adopted):
            start.wait()
            try:
                version.check(_SlowFacts(206, 0, 100, etag=etag))
            except VersionMismatch:
                return
            adopted.append(etag)

        threads = [threading.Thread(target=answer, args=(f'"v{n % 2}"',)) for n in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(set(adopted)) == 1 and adopted[0] == version.etag, adopted


def test_a_fresh_info_must_describe_the_version_the_answers_adopted():
    version = Version(100)
    version.check(Facts(206, 0, 100, etag='"abc"'))
    version.agree(Version(100, '"abc"', "7", 1000.0))  # what the answers lacked: adopted
    assert (version.etag, version.version, version.modified) == ('"abc"', "7", 1000.0)
    with pytest.raises(VersionMismatch, match="its info\\(\\) says ETag"):
        version.agree(Version(100, '"abd"'))
    with pytest.raises(VersionMismatch, match="size 101"):
        Version(100).agree(Version(101))
