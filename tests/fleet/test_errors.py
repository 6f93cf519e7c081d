"""How a shard's problem is described in a report, and the chores' errors."""

from __future__ import annotations

import errno

from fsspec_shards.errors import IntegrityError, ShardFormatError
from fsspec_shards.fleet.errors import InputError, ShardsFailed, describe_error


def test_each_kind_of_problem_is_named_first_once():
    missing = FileNotFoundError(errno.ENOENT, "No such file", "/d/a.tar")
    assert describe_error(missing) == "not found: No such file: /d/a.tar"
    assert describe_error(PermissionError("denied")).startswith("permission denied: ")
    bad = IntegrityError("s3://b/a.tar", "sha256:aa", "sha256:bb")
    assert describe_error(bad).startswith("integrity check failed for s3://b/a.tar")
    assert describe_error(ShardFormatError("/d/a.tar", 512, "cut")).startswith("malformed tar")
    assert describe_error(TimeoutError()) == "TimeoutError"


def test_descriptions_carry_no_secret():
    error = OSError("GET https://h/a.tar?X-Amz-Signature=s3cr3t failed")
    assert "s3cr3t" not in describe_error(error)


def test_input_errors_are_value_errors_and_failures_carry_their_rows():
    assert issubclass(InputError, ValueError)
    failed = ShardsFailed("2 shards could not be read", [("a", "x"), ("b", "y")])
    assert failed.failures == [("a", "x"), ("b", "y")] and str(failed).startswith("2 shards")
