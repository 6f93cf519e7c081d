"""azure-storage-blob and azure-core beyond their public API.

Uses:

- ``BlobServiceClient._config.retry_policy`` (azure-core's ``RetryPolicy``: its
  ``total_retries``, ``connect_retries``, ``read_retries``, ``status_retries``): the SDK's
  own retries, set to none on our private instance.
- ``BlobClient._client.blob.download(..., cls=...)`` and
  ``azure.storage.blob._generated.models.ModifiedAccessConditions``: one raw Get Blob
  request through the SDK's pipeline, conditional on an ETag. The public downloader
  buffers pieces whole and retries a cut piece inside itself, out of sight of our
  retry counters.
"""

from __future__ import annotations

from typing import Any

_RETRIES = ("total_retries", "connect_retries", "read_retries", "status_retries")


def no_retries(service_client: Any) -> bool:
    """Set the retry policy of ``service_client`` to no retries; False if the SDK no longer
    has one where we look (its retries then stay on)."""
    config = getattr(service_client, "_config", None)
    policy = getattr(config, "retry_policy", None)
    if policy is None or not hasattr(policy, "total_retries"):
        return False
    for attribute in _RETRIES:
        setattr(policy, attribute, 0)
    return True


def if_match(etag: str | None) -> Any:
    """The access conditions of a request valid only for ``etag`` (None: unconditional)."""
    if etag is None:
        return None
    from azure.storage.blob._generated.models import ModifiedAccessConditions

    return ModifiedAccessConditions(if_match=etag)


async def raw_download(blob_client: Any, **kwargs: Any) -> tuple[Any, Any, Any]:
    """One Get Blob request: ``(pipeline_response, body iterator, headers)``."""
    return await blob_client._client.blob.download(
        cls=lambda response, deserialized, headers: (response, deserialized, headers),
        **kwargs,
    )
