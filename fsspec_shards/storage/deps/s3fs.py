"""s3fs beyond its public API.

Uses:

- ``S3FileSystem._call_s3(method, **kwargs)``: one botocore call through s3fs's client,
  with its credentials and error translation; the streaming GET needs the raw
  ``get_object`` response (its body stream and headers), which no public method returns.
"""

from __future__ import annotations

from typing import Any

import fsspec


async def call_s3(fs: fsspec.AbstractFileSystem, method: str, **kwargs: Any) -> Any:
    """The response of botocore call ``method`` through s3fs instance ``fs``."""
    return await fs._call_s3(method, **kwargs)
