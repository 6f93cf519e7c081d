"""Fixtures for tests against real storage servers and the fault-injecting proxy.

Servers start lazily, once per session, on free loopback ports, when a test first asks for
them, and stop when the session ends. Each `*_backend` fixture is a `servers.Backend` under a
fresh prefix, so tests sharing a server never see each other's files.

    def test_something(backend, fault_proxy):           # runs for file, http, s3, gcs, az
        url = backend.put("shard-0.tar", data)
    def test_faults(remote_backend, fault_proxy):       # http, s3, gcs, az (they have servers)
        proxy, proxied = fault_proxy(remote_backend)
        proxy.add(Cut(after_bytes=100), method="GET", times=1)
        fsspec.filesystem(proxied.protocol, **proxied.storage_options).cat_file(proxied.url(p))
    def test_both(remote_backend, transport):           # through fsspec, then through obstore
        fsspec.filesystem("wds", ..., transport=served(remote_backend, transport))
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.integration import servers
from tests.integration.fault_proxy import FaultProxy
from tests.integration.gcs_xml_front import GcsXmlFront

BACKENDS = ["file", "http", "s3", "gcs", "az"]
REMOTE_BACKENDS = ["http", "s3", "gcs", "az"]
TRANSPORTS = ["fsspec", "obstore"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test here `integration`, so `-m "not integration"` leaves them out."""
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.fspath).parents:
            item.add_marker(pytest.mark.integration)


def _serve(starter: Callable, workdir: Path) -> Iterator:
    try:
        service = starter(workdir)
    except servers.Unavailable as reason:
        pytest.skip(str(reason))
    try:
        yield service
    finally:
        service.stop()


@pytest.fixture(scope="session")
def s3_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    """moto's S3 server (or FSSPEC_SHARDS_TEST_S3_ENDPOINT) with bucket `test-bucket`."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("AWS_ACCESS_KEY_ID", os.environ.get("AWS_ACCESS_KEY_ID", "testing"))
        env.setenv("AWS_SECRET_ACCESS_KEY", os.environ.get("AWS_SECRET_ACCESS_KEY", "testing"))
        yield from _serve(servers.start_s3, tmp_path_factory.mktemp("s3"))


@pytest.fixture(scope="session")
def gcs_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    """gcp-storage-emulator (or FSSPEC_SHARDS_TEST_GCS_ENDPOINT) with bucket `test-bucket`."""
    yield from _serve(servers.start_gcs, tmp_path_factory.mktemp("gcs"))


@pytest.fixture(scope="session")
def az_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    """Azurite (or FSSPEC_SHARDS_TEST_AZURE_CONNECTION_STRING) with container `test-container`."""
    yield from _serve(servers.start_azure, tmp_path_factory.mktemp("azurite"))


@pytest.fixture(scope="session")
def http_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    """nginx (or FSSPEC_SHARDS_TEST_HTTP_URL) serving a directory, with Range and autoindex."""
    yield from _serve(servers.start_http, tmp_path_factory.mktemp("nginx"))


@pytest.fixture
def s3_backend(s3_service) -> servers.S3Backend:
    return s3_service.backend(servers.unique_prefix())


@pytest.fixture
def gcs_backend(gcs_service) -> servers.GcsBackend:
    return gcs_service.backend(servers.unique_prefix())


@pytest.fixture
def az_backend(az_service) -> servers.AzureBackend:
    return az_service.backend(servers.unique_prefix())


@pytest.fixture(scope="session")
def gcs_front(gcs_service) -> Iterator[GcsXmlFront]:
    """A front for the emulator that answers obstore's GCS reads too (gcs_xml_front.py)."""
    with GcsXmlFront(gcs_service.endpoint_url) as front:
        yield front


@pytest.fixture
def gcs_front_backend(gcs_service, gcs_front) -> servers.GcsBackend:
    """A GCS bucket reached through ``gcs_front``: gcsfs and obstore both read it."""
    backend = gcs_service.backend(servers.unique_prefix())
    return dataclasses.replace(
        backend, endpoint_url=gcs_front.url, server=f"{backend.server} + XML front"
    )


@pytest.fixture
def http_backend(http_service) -> servers.HttpBackend:
    return http_service.backend(servers.unique_prefix())


@pytest.fixture
def file_backend(tmp_path: Path) -> servers.FileBackend:
    return servers.FileBackend("file", servers.unique_prefix(), "local", root=str(tmp_path))


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> servers.Backend:
    """Each of the five backends in turn; servers start only when a test asks for them."""
    return request.getfixturevalue(f"{request.param}_backend")


@pytest.fixture(params=REMOTE_BACKENDS)
def remote_backend(request: pytest.FixtureRequest) -> servers.Backend:
    """Each backend that has a server (and so can sit behind the fault proxy). In a test
    that also takes ``transport``, GCS on obstore is the emulator behind ``gcs_front``."""
    return request.getfixturevalue(backend_fixture(request, request.param))


def backend_fixture(request: pytest.FixtureRequest, name: str) -> str:
    """The fixture that gives backend ``name`` for the transport the test runs through."""
    if (
        name == "gcs"
        and "transport" in request.fixturenames
        and request.getfixturevalue("transport") == "obstore"
    ):
        return "gcs_front_backend"
    return f"{name}_backend"


@pytest.fixture(params=TRANSPORTS)
def transport(request: pytest.FixtureRequest) -> str:
    """Each download transport of the wds filesystem (its ``transport`` option) in turn;
    pass it through :func:`served` to skip the backends obstore cannot serve."""
    if request.param == "obstore":
        pytest.importorskip("obstore")
    return request.param


def served(backend: servers.Backend, transport: str) -> str:
    """``transport`` for ``backend``; skips obstore on the bare GCS emulator, which obstore
    cannot read (no Last-Modified, no decoding of encoded paths: see docs/transport.md).
    Behind ``gcs_front`` it can (``remote_backend`` gives that one to obstore tests)."""
    if (
        transport == "obstore"
        and backend.protocol in ("gcs", "gs")
        and "front" not in backend.server
    ):
        pytest.skip("obstore cannot read gcp-storage-emulator without the XML front")
    return transport


@pytest.fixture
def fault_proxy() -> Iterator[Callable[..., tuple[FaultProxy, servers.Backend]]]:
    """Factory: `fault_proxy(backend, **options)` -> (proxy, backend seen through the proxy).

    Options go to `FaultProxy` (e.g. `bandwidth=`, `latency=`). Proxies close at test end.
    """
    proxies: list[FaultProxy] = []

    def make(backend: servers.Backend, **options) -> tuple[FaultProxy, servers.Backend]:
        address = backend.address()
        if address is None:
            raise ValueError(f"the {backend.protocol} backend has no server to put a proxy before")
        proxy = FaultProxy(address, **options)
        proxies.append(proxy)
        return proxy, backend.through(proxy)

    yield make
    for proxy in proxies:
        proxy.close()


@pytest.fixture
def no_splits(monkeypatch):
    """Ranges of a parallel fill as laid out, never split for a stream that ended early
    (which depends on timing; splits are tested in test_ranges_in_flight.py): for faults
    aimed at one range of the layout, and for moto, which can answer a GET that starts
    while the object is being replaced with an ETag of neither version."""
    from fsspec_shards.storage.transfer import range_plan

    monkeypatch.setattr(range_plan, "SPLIT_MIN", 1 << 62)
