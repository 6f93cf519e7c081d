"""The region of an S3 bucket, asked of S3 itself: what the obstore store of an AWS bucket
needs when the configuration names no region (``StoreSpec.bucket_region``)."""

from __future__ import annotations

import errno
import urllib.error
import urllib.request

from fsspec_shards.storage.core.retry import TransientError


def bucket_region(
    bucket: str, base_url: str = "https://s3.amazonaws.com", timeout: float = 30.0
) -> str:
    """The region of an S3 bucket, from the ``x-amz-bucket-region`` header that S3 sends on
    any answer to an unsigned HEAD of the bucket (what s3fs and object_store do too)."""
    request = urllib.request.Request(f"{base_url.rstrip('/')}/{bucket}", method="HEAD")
    error: OSError = OSError(errno.EINVAL, f"S3 names no region for bucket {bucket}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            region = response.headers.get("x-amz-bucket-region")
    except urllib.error.HTTPError as answer:
        region = answer.headers.get("x-amz-bucket-region")
    except OSError as exc:
        region = None
        error = TransientError(f"cannot reach S3 to find the region of {bucket}: {exc}")
    if region:
        return region
    raise error
