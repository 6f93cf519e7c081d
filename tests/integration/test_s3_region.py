"""The region of an S3 bucket, asked of the server (``storage/transfer/s3_region.py``)."""

from __future__ import annotations

from fsspec_shards.storage.transfer.s3_region import bucket_region


def test_the_bucket_region_comes_from_the_bucket(s3_backend):
    assert bucket_region(s3_backend.bucket, base_url=s3_backend.endpoint_url) == "us-east-1"
