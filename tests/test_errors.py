import pickle

import pytest

from fsspec_shards import IntegrityError, ShardFormatError
from fsspec_shards.errors import redact_url, strip_secrets

SIGNED = (
    "https://user:hunter2@bucket.s3.amazonaws.com/train/0001.tar"
    "?X-Amz-Credential=AKIAEXAMPLE&X-Amz-Signature=deadbeef&versionId=7"
)
SAS = "https://acct.blob.core.windows.net/c/0001.tar?sv=2024&sig=c2VjcmV0&se=2030"


@pytest.mark.parametrize("url", [SIGNED, SAS, "wds::" + SIGNED])
def test_redacted_urls_keep_no_secret(url):
    shown = redact_url(url)
    for secret in ("hunter2", "AKIAEXAMPLE", "deadbeef", "c2VjcmV0", "user:"):
        assert secret not in shown
    assert "0001.tar" in shown


def test_redaction_keeps_harmless_query_parameters_and_plain_paths():
    assert "versionId=7" in redact_url(SIGNED)
    assert redact_url("/data/shard-0001.tar") == "/data/shard-0001.tar"
    assert redact_url("s3://bucket/key.tar") == "s3://bucket/key.tar"
    assert redact_url("memory:///data/key.tar") == "memory:///data/key.tar"
    assert strip_secrets("memory:///data/key.tar") == "memory:///data/key.tar"


def test_two_signatures_of_one_object_strip_to_the_same_url():
    other = SIGNED.replace("deadbeef", "cafef00d")
    assert strip_secrets(SIGNED) == strip_secrets(other)
    assert "hunter2" not in strip_secrets(SIGNED)
    assert "versionId=7" in strip_secrets(SIGNED)


def test_integrity_error_is_an_oserror_naming_url_and_digests_without_secrets():
    err = IntegrityError(SIGNED, "sha256:aa", "sha256:bb")
    assert isinstance(err, OSError)
    assert "sha256:aa" in str(err) and "sha256:bb" in str(err)
    assert "0001.tar" in str(err) and "deadbeef" not in str(err)
    again = pickle.loads(pickle.dumps(err))
    assert str(again) == str(err)


def test_shard_format_error_is_a_value_error_naming_shard_and_offset():
    err = ShardFormatError("s3://b/0001.tar", 1536, "bad header checksum")
    assert isinstance(err, ValueError)
    assert "s3://b/0001.tar" in str(err) and "1536" in str(err)
    assert pickle.loads(pickle.dumps(err)).offset == 1536


@pytest.mark.parametrize(
    "template",
    [
        "https://b.s3.amazonaws.com/0001.tar?X-Amz-Algorithm=AWS4-HMAC-SHA256"
        "&X-Amz-Credential=AKIAEXAMPLE%2F{day}%2Fus-east-1%2Fs3%2Faws4_request"
        "&X-Amz-Date={day}T{time}Z&X-Amz-Expires={ttl}&X-Amz-SignedHeaders=host"
        "&X-Amz-Signature={sig}&versionId=7",
        "https://storage.googleapis.com/b/0001.tar?X-Goog-Algorithm=GOOG4-RSA-SHA256"
        "&X-Goog-Credential=sa%2F{day}%2Fauto%2Fstorage%2Fgoog4_request"
        "&X-Goog-Date={day}T{time}Z&X-Goog-Expires={ttl}&X-Goog-SignedHeaders=host"
        "&X-Goog-Signature={sig}&versionId=7",
        "https://d111.cloudfront.net/0001.tar?Expires={ttl}&Policy=eyJ{time}"
        "&Signature={sig}&Key-Pair-Id=K2{day}&versionId=7",
        "https://b.s3.amazonaws.com/0001.tar?AWSAccessKeyId=AKIAEXAMPLE&Expires={ttl}"
        "&Signature={sig}&versionId=7",
    ],
    ids=["s3-v4", "gcs-v4", "cloudfront", "s3-v2"],
)
def test_one_object_signed_at_two_times_strips_to_the_same_url(template):
    """The cache key: a URL signed again (new date, expiry, signature) is the same object."""
    first = template.format(day="20260101", time="000000", ttl=3600, sig="deadbeef")
    second = template.format(day="20260102", time="120000", ttl=900, sig="cafef00d")
    assert strip_secrets(first) == strip_secrets(second)
    assert "0001.tar" in strip_secrets(first) and "versionId=7" in strip_secrets(first)
