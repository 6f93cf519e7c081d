"""The backends package (storage/backends/__init__.py): the backends' own retries are turned
down before wds wraps them (user settings win), and an object's identity: what makes two paths
one object or two (the cache key)."""

from __future__ import annotations

import aiohttp
import fsspec
import pytest

from fsspec_shards.storage.backends import KEY_FORMAT, backend_for, backend_location, object_id
from fsspec_shards.storage.backends.base import protocol_of
from tests.aws_config import aws_config_fixture  # noqa: F401 (the aws_config fixture)

AZURITE = (
    "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;"
    "AccountKey=Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==;"
    "BlobEndpoint=http://127.0.0.1:1/devstoreaccount1;"
)


def test_private_instances_keep_no_listing_cache_and_share_nothing_with_the_users():
    for protocol in ("s3", "gcs", "https"):
        tamed = backend_for(protocol).tamed_options({"use_listings_cache": True}, 5.0)
        assert tamed["use_listings_cache"] is False and tamed["skip_instance_cache"] is True
    assert "use_listings_cache" not in backend_for("file").tamed_options({}, 5.0)


def test_the_shortest_socket_time_out_the_user_gave_the_backend_is_found():
    def built(protocol: str, options: dict):
        return fsspec.filesystem(protocol, **backend_for(protocol).tamed_options(options, 30.0))

    def backend_timeout(fs: fsspec.AbstractFileSystem) -> float | None:
        return backend_for(protocol_of(fs)).timeout(fs)

    assert backend_timeout(built("s3", {"anon": True, "config_kwargs": {"read_timeout": 3}})) == 3
    assert backend_timeout(built("s3", {"anon": True})) == 30.0  # ours, set on the client
    assert backend_timeout(built("gcs", {"token": "anon", "requests_timeout": 2})) == 2
    assert backend_timeout(built("gcs", {"token": "anon"})) is None
    az = {"connection_string": AZURITE, "read_timeout": 2, "connection_timeout": 4}
    assert backend_timeout(built("az", az)) == 2
    mine = aiohttp.ClientTimeout(total=None, sock_connect=9, sock_read=2.5)
    assert backend_timeout(built("https", {"client_kwargs": {"timeout": mine}})) == 2.5
    assert backend_timeout(fsspec.filesystem("file")) is None


AZURITE_ACCOUNT = (
    "DefaultEndpointsProtocol=http;AccountName={account};"
    "AccountKey=Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==;"
    "BlobEndpoint=http://127.0.0.1:{port}/{account};"
)


def _s3(**options):
    return fsspec.filesystem("s3", skip_instance_cache=True, anon=True, **options)


def test_s3_objects_at_two_endpoints_are_two_objects():
    a = _s3(client_kwargs={"endpoint_url": "http://127.0.0.1:9000"})
    b = _s3(endpoint_url="http://127.0.0.1:9001")
    same = _s3(client_kwargs={"endpoint_url": "http://127.0.0.1:9000"})
    assert object_id(a, "bkt/x.bin").key != object_id(b, "bkt/x.bin").key
    assert object_id(a, "bkt/x.bin").key == object_id(same, "bkt/x.bin").key
    assert object_id(a, "bkt/x.bin").shown == "s3://bkt/x.bin"


def test_s3_endpoint_from_the_environment_and_profile_and_region_are_part_of_the_location(
    aws_config,
):
    aws_config("[profile r2]\nregion = auto\n")
    aws = backend_location(_s3())
    assert backend_location(_s3(profile="r2")) != aws
    assert backend_location(_s3(client_kwargs={"region_name": "cn-north-1"})) != aws
    aws_config.env.setenv("AWS_ENDPOINT_URL", "http://minio.internal:9000")
    assert backend_location(_s3()) == "endpoint=http://minio.internal:9000"


def test_gcs_objects_at_two_endpoints_are_two_objects(monkeypatch):
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    a = fsspec.filesystem("gcs", skip_instance_cache=True, token="anon")
    b = fsspec.filesystem(
        "gcs", skip_instance_cache=True, token="anon", endpoint_url="http://127.0.0.1:4443"
    )
    assert object_id(a, "bkt/x.bin").key != object_id(b, "bkt/x.bin").key
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:4443")
    c = fsspec.filesystem("gcs", skip_instance_cache=True, token="anon")
    assert object_id(c, "bkt/x.bin").key == object_id(b, "bkt/x.bin").key


def test_azure_blobs_of_two_accounts_are_two_objects():
    def az(account: str, port: int):
        return fsspec.filesystem(
            "az",
            skip_instance_cache=True,
            connection_string=AZURITE_ACCOUNT.format(account=account, port=port),
        )

    keys = {object_id(az(a, p), "c/x.bin").key for a, p in [("one", 1), ("two", 1), ("one", 2)]}
    assert len(keys) == 3
    assert object_id(az("one", 1), "c/x.bin").key == object_id(az("one", 1), "c/x.bin").key


def test_query_selectors_are_kept_and_signatures_dropped():
    http = fsspec.filesystem("http", skip_instance_cache=True)
    base = "https://h.example/get"
    keys = {object_id(http, f"{base}?{query}").key for query in ("key=1", "key=2", "id=1")}
    assert len(keys) == 3
    signed = [
        f"{base}?key=1&X-Amz-Date={date}&X-Amz-Signature={sig}&X-Amz-Credential=AK"
        for date, sig in (("20260101T000000Z", "aa"), ("20260202T000000Z", "bb"))
    ]
    assert object_id(http, signed[0]).key == object_id(http, signed[1]).key
    assert object_id(http, signed[0]).key == object_id(http, f"{base}?key=1").key
    assert "aa" not in object_id(http, signed[0]).shown


def test_the_password_of_a_url_is_no_part_of_the_key_and_never_shown():
    http = fsspec.filesystem("http", skip_instance_cache=True)
    with_password = object_id(http, "https://alice:hunter2@h.example/x.bin")
    assert with_password.key == object_id(http, "https://h.example/x.bin").key
    assert "hunter2" not in with_password.shown


class _HostFileSystem(fsspec.AbstractFileSystem):
    """A backend whose location is an option fsspec-shards knows nothing about."""

    protocol = "hostfs"

    def __init__(self, host: str, port: int = 21, **options) -> None:
        super().__init__(host=host, port=port, **options)


LOCATIONS = [{"host": "a.example"}, {"host": "b.example"}, {"host": "a.example", "port": 2121}]


@pytest.mark.parametrize("options", LOCATIONS)
def test_other_backends_are_located_by_the_options_they_were_built_with(options):
    located = _HostFileSystem(skip_instance_cache=True, **options)
    assert backend_location(located).startswith("options=")
    for other in LOCATIONS:
        clone = _HostFileSystem(skip_instance_cache=True, use_listings_cache=False, **other)
        same = backend_location(clone) == backend_location(located)
        assert same == (other == options)


def test_keys_carry_their_format_version():
    assert KEY_FORMAT.endswith("-v3")
    memory = fsspec.filesystem("memory")
    assert len(object_id(memory, "/x").key) == 64


def test_every_spelling_of_a_local_file_is_one_key_and_object_store_paths_stay_as_given(tmp_path):
    (tmp_path / "d" / "e").mkdir(parents=True)
    (tmp_path / "d" / "f").write_bytes(b"x")
    (tmp_path / "link").symlink_to(tmp_path / "d")
    local = fsspec.filesystem("file")
    spellings = ["d/f", "d/./f", "d//f", "d/e/../f", "link/f"]
    keys = {object_id(local, f"{tmp_path}/{spelling}").key for spelling in spellings}
    assert len(keys) == 1
    assert object_id(local, f"{tmp_path}/d/./f").shown == f"file://{tmp_path}/d/./f"
    s3 = _s3(client_kwargs={"endpoint_url": "http://127.0.0.1:9000"})
    assert len({object_id(s3, path).key for path in ("bkt/d/f", "bkt/d/./f", "bkt/d//f")}) == 3
