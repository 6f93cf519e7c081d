"""The retry policy: which failures are transient, how long it backs off, what it raises."""

from __future__ import annotations

import dataclasses
import errno
import random

import pytest

from fsspec_shards.storage import backends  # noqa: F401 - teaches retry their error names
from fsspec_shards.storage.core.options import StorageOptions
from fsspec_shards.storage.core.retry import (
    Attempts,
    RetriesExhaustedError,
    RetryPolicy,
    TransientError,
    describe,
    http_status,
    is_transient,
    permanent_error,
)

DEFAULT_POLICY = StorageOptions.parse().retry_policy


def _policy(**fields) -> RetryPolicy:
    """The default policy with ``fields`` changed."""
    return dataclasses.replace(DEFAULT_POLICY, **fields)


class _StatusError(Exception):
    """Stands for aiohttp's ClientResponseError (``.status``)."""

    def __init__(self, status: int) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status


class HttpError(Exception):
    """Same shape as gcsfs.retry.HttpError (``.code``)."""

    def __init__(self, code: int) -> None:
        super().__init__(f"code {code}")
        self.code = code


class HttpResponseError(Exception):
    """Same shape as azure.core.exceptions.HttpResponseError (``.status_code``)."""

    def __init__(self, status_code: int) -> None:
        super().__init__(f"status {status_code}")
        self.status_code = status_code


def _botocore_client_error(code: str, status: int) -> Exception:
    from botocore.exceptions import ClientError

    return ClientError(
        {"Error": {"Code": code, "Message": code}, "ResponseMetadata": {"HTTPStatusCode": status}},
        "GetObject",
    )


def _wrapped(outer: BaseException, cause: BaseException) -> BaseException:
    try:
        raise outer from cause
    except BaseException as exc:  # noqa: BLE001 - building a chained exception
        return exc


def _aiohttp_errors() -> list[BaseException]:
    import aiohttp

    return [
        aiohttp.ClientPayloadError("Response payload is not completed"),
        aiohttp.ServerDisconnectedError(),
        aiohttp.ClientConnectionError("connection reset"),
    ]


def _botocore_network_errors() -> list[BaseException]:
    from botocore.exceptions import EndpointConnectionError, ReadTimeoutError

    return [
        EndpointConnectionError(endpoint_url="http://127.0.0.1:1"),
        ReadTimeoutError(endpoint_url="http://127.0.0.1:1"),
    ]


def _azure_network_errors() -> list[BaseException]:
    from azure.core.exceptions import ServiceRequestError, ServiceResponseError

    return [ServiceRequestError("connection refused"), ServiceResponseError("cut")]


TRANSIENT = [
    ConnectionResetError(errno.ECONNRESET, "reset"),
    ConnectionRefusedError(errno.ECONNREFUSED, "refused"),
    TimeoutError("timed out"),
    TransientError("short read"),
    OSError(errno.EBUSY, "SlowDown"),  # s3fs 503
    OSError(getattr(errno, "EREMOTEIO", errno.EIO), "InternalError"),  # s3fs 500
    _StatusError(503),
    _StatusError(429),
    _StatusError(408),
    HttpError(502),
    HttpResponseError(500),
]
PERMANENT = [
    FileNotFoundError(errno.ENOENT, "missing"),
    PermissionError(errno.EACCES, "denied"),
    _StatusError(404),
    _StatusError(403),
    _StatusError(400),
    HttpError(416),
    HttpResponseError(404),
    OSError(errno.EINVAL, "InvalidRange"),
]


@pytest.mark.parametrize("exc", TRANSIENT, ids=repr)
def test_network_failures_and_5xx_429_408_are_transient(exc):
    assert is_transient(exc)


@pytest.mark.parametrize("exc", PERMANENT, ids=repr)
def test_not_found_denied_and_bad_requests_are_permanent(exc):
    assert not is_transient(exc)


def test_backend_library_network_errors_are_transient():
    for exc in _aiohttp_errors() + _botocore_network_errors() + _azure_network_errors():
        assert is_transient(exc), repr(exc)


def test_s3_throttling_codes_are_transient_and_missing_key_is_not():
    assert is_transient(_botocore_client_error("SlowDown", 503))
    assert is_transient(_botocore_client_error("Throttling", 400))
    assert not is_transient(_botocore_client_error("NoSuchKey", 404))


def test_fsspec_http_file_not_found_wrapping_a_503_is_transient():
    """fsspec's http backend turns any failed HEAD into FileNotFoundError; the cause decides."""
    assert is_transient(_wrapped(FileNotFoundError("http://h/x"), _StatusError(503)))
    assert not is_transient(_wrapped(FileNotFoundError("http://h/x"), _StatusError(404)))


def test_s3fs_translated_error_keeps_the_status_of_its_botocore_cause():
    error = _wrapped(OSError(errno.EIO, "Bad Gateway"), _botocore_client_error("502", 502))
    assert http_status(error) == 502
    assert is_transient(error)


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (_StatusError(404), FileNotFoundError),
        (_wrapped(FileNotFoundError("u"), _StatusError(403)), PermissionError),
        (HttpResponseError(403), PermissionError),
        (OSError("Forbidden: b/k\nAccess denied"), PermissionError),  # gcsfs 403
        (ValueError("Bad Request: b/Bad_Bucket/o/k\nInvalid bucket name"), OSError),  # gcsfs 400
        (_StatusError(400), OSError),
        (IsADirectoryError(errno.EISDIR, "is a directory"), IsADirectoryError),
    ],
    ids=repr,
)
def test_permanent_errors_become_the_matching_oserror_naming_the_url(exc, kind):
    converted = permanent_error(exc, "s3://bucket/key.tar")
    assert type(converted) is kind
    assert "s3://bucket/key.tar" in str(converted)


def test_missing_credentials_are_a_permission_error_naming_the_url_raised_at_once():
    from botocore.exceptions import NoCredentialsError, PartialCredentialsError

    for error in (NoCredentialsError(), PartialCredentialsError(provider="env", cred_var="x")):
        assert not is_transient(error)
        converted = permanent_error(error, "s3://bucket/key.tar")
        assert type(converted) is PermissionError
        assert "s3://bucket/key.tar" in str(converted)


def test_programming_errors_are_not_turned_into_storage_errors():
    error = TypeError("bad argument")
    assert permanent_error(error, "s3://b/k") is error
    assert not is_transient(error)


def test_messages_never_show_signatures_or_keys():
    secret_url = "https://host/b/k.tar?X-Amz-Signature=deadbeefsecret&X-Amz-Credential=AKIASECRET"
    exc = _wrapped(FileNotFoundError(secret_url), _StatusError(404))
    converted = permanent_error(exc, secret_url)
    assert "deadbeefsecret" not in str(converted)
    assert "AKIASECRET" not in str(converted)
    assert "deadbeefsecret" not in describe(exc)
    assert converted.__cause__ is None


def test_a_backend_message_quoting_a_signed_url_is_not_chained_to_the_raised_error():
    leaky = _wrapped(
        FileNotFoundError("https://host/k.tar?X-Amz-Signature=deadbeefsecret"), _StatusError(404)
    )
    tracker = Attempts(DEFAULT_POLICY, "https://host/k.tar", "read")
    with pytest.raises(FileNotFoundError) as raised:
        tracker.failed(leaky)
    assert "deadbeefsecret" not in str(raised.value)
    assert raised.value.__cause__ is None and raised.value.__suppress_context__


@pytest.mark.parametrize("failure", [1, 2, 5, 10, 30])
def test_backoff_is_full_jitter_below_the_exponential_ceiling_and_the_cap(failure):
    policy = _policy(backoff=0.5, max_backoff=4.0)
    rng = random.Random(7)
    delays = [policy.delay(failure, rng) for _ in range(200)]
    ceiling = min(4.0, 0.5 * 2 ** (failure - 1))
    assert all(0.0 <= d <= ceiling for d in delays)
    assert max(delays) > ceiling * 0.8  # jitter spreads over the whole interval


def _attempts(policy: RetryPolicy, sleeps: list[float], retries: list[int]) -> Attempts:
    return Attempts(
        policy,
        "s3://b/k",
        "read",
        on_retry=lambda: retries.append(1),
        rng=random.Random(0),
        sleep=sleeps.append,
    )


def test_transient_failures_are_retried_until_success_and_counted():
    outcomes = [ConnectionResetError("reset"), _StatusError(503), b"data"]
    sleeps: list[float] = []
    retries: list[int] = []
    tracker = _attempts(_policy(attempts=5, backoff=0.01), sleeps, retries)
    while True:
        outcome = outcomes.pop(0)
        if isinstance(outcome, bytes):
            break
        tracker.failed(outcome)
    assert len(retries) == 2 and len(sleeps) == 2


def test_spent_attempts_raise_with_the_url_and_the_last_reason():
    tracker = _attempts(_policy(attempts=3, backoff=0.0), [], [])
    tracker.failed(ConnectionResetError("reset"))
    tracker.failed(ConnectionResetError("reset"))
    with pytest.raises(RetriesExhaustedError, match=r"s3://b/k failed after 3 attempts.*reset"):
        tracker.failed(ConnectionResetError("reset"))


def test_progress_starts_a_new_failure_chain():
    tracker = _attempts(_policy(attempts=2, backoff=0.0), [], [])
    for _ in range(10):
        tracker.failed(ConnectionResetError("reset"))
        tracker.progressed()


def test_deadline_stops_retrying_before_the_attempts_are_spent():
    tracker = _attempts(_policy(attempts=100, backoff=10.0, max_backoff=10.0, deadline=0.5), [], [])
    with pytest.raises(RetriesExhaustedError, match="deadline"):
        for _ in range(100):
            tracker.failed(TimeoutError("stalled"))


def test_permanent_failure_is_raised_at_once_without_sleeping():
    sleeps: list[float] = []
    tracker = _attempts(_policy(attempts=5), sleeps, [])
    with pytest.raises(FileNotFoundError, match="s3://b/k"):
        tracker.failed(_StatusError(404))
    assert sleeps == []


def test_call_returns_the_result_after_transient_failures():
    outcomes = iter([TimeoutError("t"), ConnectionResetError("r")])

    def flaky():
        error = next(outcomes, None)
        if error is not None:
            raise error
        return 42

    assert _policy(attempts=3, backoff=0.0).call(flaky, "gs://b/k", "info") == 42


def _raised_from(outer: BaseException, inner: BaseException) -> BaseException:
    try:
        try:
            raise inner
        except BaseException as caught:
            raise outer from caught
    except BaseException as error:
        return error


def test_connection_failures_buried_under_not_found_say_what_they_were():
    import socket
    import ssl

    from fsspec_shards.storage.core.retry import connection_failure, permanent_error

    tls = _raised_from(
        FileNotFoundError("https://h/x"),
        ssl.SSLError(1, "[SSL: WRONG_VERSION_NUMBER] wrong version number"),
    )
    dns = _raised_from(
        FileNotFoundError("http://h.invalid/x"), socket.gaierror(-2, "Name or service not known")
    )
    refused = _raised_from(
        FileNotFoundError("http://h/x"), ConnectionRefusedError(111, "Connect call failed")
    )
    assert "does not speak TLS" in connection_failure(tls)
    assert connection_failure(dns) == "the host name does not resolve (DNS)"
    assert connection_failure(refused) == "connection refused by"
    assert connection_failure(FileNotFoundError("http://h/x")) is None
    assert not is_transient(tls)  # retrying cannot make a plain server speak TLS
    assert is_transient(refused)
    converted = permanent_error(tls, "https://h/x")
    assert isinstance(converted, ConnectionError) and "https://h/x" in str(converted)
