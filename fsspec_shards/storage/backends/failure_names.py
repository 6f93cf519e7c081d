"""What each backend's library calls its failures (:class:`~..core.retry.ErrorNames`), in one
light module: the retry classification must know every backend's names before the first
failure of any, while the backend modules themselves are imported on first ask
(:func:`~fsspec_shards.storage.backends.backend_for`). :data:`EVERY` is taught to
``core/retry.py`` when ``storage.backends`` is imported; each backend's ``errors`` is its
entry here. The names of one library serve several backends (aiohttp's under gcsfs and
s3fs), so the classification knows them all at once."""

from __future__ import annotations

from fsspec_shards.storage.core.retry import ErrorNames

S3 = ErrorNames(
    transient=frozenset(
        {
            "EndpointConnectionError",
            "ConnectionClosedError",
            "ReadTimeoutError",
            "ConnectTimeoutError",
            "ResponseStreamingError",
            "IncompleteReadError",
            "HTTPClientError",
        }
    ),
    not_found=frozenset({"NoSuchKey"}),
    # no credentials found for a signed request
    denied=frozenset({"NoCredentialsError", "PartialCredentialsError"}),
    throttle_codes=frozenset(
        {
            "SlowDown",
            "Throttling",
            "ThrottlingException",
            "ThrottledException",
            "RequestLimitExceeded",
            "TooManyRequestsException",
            "ProvisionedThroughputExceededException",
            "RequestThrottled",
            "ServiceUnavailable",
            "InternalError",
            "RequestTimeout",
        }
    ),
)
"""botocore's failures and AWS's error codes."""

GCS = ErrorNames(
    status_code_types=frozenset({"HttpError"}),
    denied_texts=("Forbidden",),
    invalid_texts=("Bad Request:",),
)
"""gcsfs's ``HttpError`` carries the status as ``.code``; its 403 is a message
beginning "Forbidden", its 400 a ``ValueError`` beginning "Bad Request:"."""

AZURE = ErrorNames(
    transient=frozenset({"ServiceRequestError", "ServiceResponseError"}),
    not_found=frozenset({"ResourceNotFoundError"}),
    denied=frozenset({"ClientAuthenticationError"}),
    throttle_codes=frozenset({"ServerBusy", "OperationTimedOut", "InternalError"}),
)
"""azure-core's failures and Azure Storage's error codes."""

HTTP = ErrorNames(
    transient=frozenset(
        {
            "ClientPayloadError",
            "ServerDisconnectedError",
            "ClientConnectionError",
            "ClientConnectionResetError",
            "ServerTimeoutError",
        }
    )
)
"""aiohttp's network failures (also under gcsfs and s3fs, which make requests with it)."""

OTHER = ErrorNames(
    transient=frozenset(
        {
            # requests / urllib3 / http.client
            "ChunkedEncodingError",
            "ProtocolError",
            "IncompleteRead",
            "ReadTimeout",
            "ConnectTimeout",
            "ConnectionError",
            "Timeout",
        }
    )
)
"""The synchronous HTTP clients' (requests, urllib3, http.client) network failures, which
backends not known here (and gcsfs's authentication) use."""


EVERY = S3 | GCS | AZURE | HTTP | OTHER
"""Every backend's names: what the classification knows."""
