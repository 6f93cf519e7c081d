import pickle

from fsspec_shards import IntegrityError, ShardFormatError

SIGNED = (
    "https://user:hunter2@bucket.s3.amazonaws.com/train/0001.tar"
    "?X-Amz-Credential=AKIAEXAMPLE&X-Amz-Signature=deadbeef&versionId=7"
)


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
