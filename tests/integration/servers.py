"""Real storage servers on loopback ports, and one `Backend` view per protocol over them.

The integration tests talk to real protocol servers rather than mocks: moto's S3 server,
gcp-storage-emulator, Azurite and nginx, each started on a free loopback port, or an
external endpoint named by environment variables (see docs/testing.md). A `Backend` gives
every test the same handful of operations on any of them: a URL for a path, an upload, a
fresh fsspec filesystem, the server's address, and the same data seen through a proxy.

This module does not depend on pytest, so benchmarks can start the same servers.
"""

from __future__ import annotations

import abc
import contextlib
import ctypes
import dataclasses
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit

import fsspec

log = logging.getLogger("fsspec_shards.tests.servers")

LOOPBACK = "127.0.0.1"
BUCKET = "test-bucket"
AZURE_CONTAINER = "test-container"
AZURITE_ACCOUNT = "devstoreaccount1"
# Azurite's published development key: not a secret.
AZURITE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)
START_TIMEOUT = 60.0


class Proxy(Protocol):
    """What `Backend.through` needs of a proxy: where it listens."""

    host: str
    port: int


def free_port() -> int:
    """Return a loopback TCP port that was free a moment ago (for servers that need a number)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return sock.getsockname()[1]


def wait_for_port(host: str, port: int, timeout: float = START_TIMEOUT, process=None) -> None:
    """Block until `host:port` accepts TCP connections; fail early if `process` exits."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, port), timeout=1.0):
                return
        except OSError:
            if process is not None and process.poll() is not None:
                raise RuntimeError(f"server process exited with {process.returncode}") from None
            if time.monotonic() > deadline:
                raise TimeoutError(f"nothing listens on {host}:{port} after {timeout}s") from None
            time.sleep(0.1)


def wait_for_http(url: str, timeout: float = START_TIMEOUT) -> None:
    """Block until `url` gives any HTTP answer (an error status counts: the server is up)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5):
                return
        except urllib.error.HTTPError:
            return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url} gave no HTTP answer after {timeout}s") from None
            time.sleep(0.1)


def unique_prefix() -> str:
    """A fresh directory name, so tests sharing one session server never collide."""
    return f"t-{uuid.uuid4().hex[:12]}"


def _address_of(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    default = 443 if parts.scheme == "https" else 80
    return parts.hostname or LOOPBACK, parts.port or default


def _proxy_url(proxy: Proxy) -> str:
    return f"http://{proxy.host}:{proxy.port}"


# --------------------------------------------------------------------------- backends


_writers: dict[tuple, fsspec.AbstractFileSystem] = {}
_writers_lock = threading.Lock()


def _writer(protocol: str, storage_options: dict) -> fsspec.AbstractFileSystem:
    """One filesystem per server and process for uploads: a fresh s3fs or gcsfs instance
    takes most of a second to set up, which test fixtures would otherwise pay per file."""
    key = (os.getpid(), protocol, repr(sorted(storage_options.items())))
    with _writers_lock:
        if key not in _writers:
            _writers[key] = fsspec.filesystem(protocol, **storage_options)
        return _writers[key]


@dataclasses.dataclass(frozen=True)
class Backend(abc.ABC):
    """One protocol's storage under a per-test prefix, seen through fsspec.

    `url(path)` names `path` under the prefix; `put` uploads through the plain backend
    filesystem; `filesystem()` is a fresh instance built from `storage_options`.
    """

    protocol: str
    prefix: str
    server: str = ""  # what serves it: local, nginx, moto, gcp-storage-emulator, azurite, external
    proxied: bool = False  # seen through a proxy (`through`); uploads then use a fresh client

    @property
    @abc.abstractmethod
    def storage_options(self) -> dict:
        """Options for `fsspec.filesystem(protocol, **options)`, giving a fresh instance."""

    @abc.abstractmethod
    def url(self, path: str = "") -> str:
        """The URL of `path` under this backend's prefix ("" names the prefix itself)."""

    def put(self, path: str, data: bytes) -> str:
        """Store `data` at `path` and return its URL (through a writer shared per server)."""
        url = self.url(path)
        fs = self.filesystem() if self.proxied else _writer(self.protocol, self.storage_options)
        fs.pipe_file(url, data)
        return url

    def filesystem(self) -> fsspec.AbstractFileSystem:
        """A fresh plain backend filesystem (no instance cache, no listings cache shared)."""
        return fsspec.filesystem(self.protocol, **self.storage_options)

    @abc.abstractmethod
    def address(self) -> tuple[str, int] | None:
        """Host and port of the server, or None when there is none (local files)."""

    @abc.abstractmethod
    def through(self, proxy: Proxy) -> Backend:
        """The same data, with clients pointed at `proxy` instead of the server."""


@dataclasses.dataclass(frozen=True)
class FileBackend(Backend):
    """Local files under a directory; no server, so no proxy either."""

    root: str = ""

    @property
    def storage_options(self) -> dict:
        return {}

    def url(self, path: str = "") -> str:
        return Path(self.root, self.prefix, path).as_uri().rstrip("/")

    def put(self, path: str, data: bytes) -> str:
        target = Path(self.root, self.prefix, path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        return self.url(path)

    def address(self) -> None:
        return None

    def through(self, proxy: Proxy) -> Backend:
        raise ValueError("local files are not served over the network; there is nothing to proxy")


@dataclasses.dataclass(frozen=True)
class HttpBackend(Backend):
    """Files served by a range-capable HTTP server from `root`, written to disk directly."""

    base_url: str = ""
    root: str = ""

    @property
    def storage_options(self) -> dict:
        return {"skip_instance_cache": True}

    def url(self, path: str = "") -> str:
        return f"{self.base_url.rstrip('/')}/{self.prefix}/{path}"

    def put(self, path: str, data: bytes) -> str:
        target = Path(self.root, self.prefix, path)
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = target.with_name(f".{target.name}.{uuid.uuid4().hex}.part")
        staging.write_bytes(data)
        staging.replace(target)
        return self.url(path)

    def address(self) -> tuple[str, int]:
        return _address_of(self.base_url)

    def through(self, proxy: Proxy) -> Backend:
        return dataclasses.replace(self, base_url=_proxy_url(proxy), proxied=True)


@dataclasses.dataclass(frozen=True)
class S3Backend(Backend):
    """An S3 bucket at `endpoint_url` (moto or MinIO), through s3fs."""

    endpoint_url: str = ""
    bucket: str = BUCKET
    key: str = "testing"
    secret: str = "testing"

    @property
    def storage_options(self) -> dict:
        return {
            "key": self.key,
            "secret": self.secret,
            "client_kwargs": {"endpoint_url": self.endpoint_url},
            "skip_instance_cache": True,
        }

    def url(self, path: str = "") -> str:
        return f"s3://{self.bucket}/{self.prefix}/{path}".rstrip("/")

    def address(self) -> tuple[str, int]:
        return _address_of(self.endpoint_url)

    def through(self, proxy: Proxy) -> Backend:
        return dataclasses.replace(self, endpoint_url=_proxy_url(proxy), proxied=True)


@dataclasses.dataclass(frozen=True)
class GcsBackend(Backend):
    """A GCS bucket at `endpoint_url` (gcp-storage-emulator or fake-gcs-server), through gcsfs."""

    endpoint_url: str = ""
    bucket: str = BUCKET

    @property
    def storage_options(self) -> dict:
        return {"endpoint_url": self.endpoint_url, "token": "anon", "skip_instance_cache": True}

    def url(self, path: str = "") -> str:
        return f"gcs://{self.bucket}/{self.prefix}/{path}".rstrip("/")

    def address(self) -> tuple[str, int]:
        return _address_of(self.endpoint_url)

    def through(self, proxy: Proxy) -> Backend:
        return dataclasses.replace(self, endpoint_url=_proxy_url(proxy), proxied=True)


@dataclasses.dataclass(frozen=True)
class AzureBackend(Backend):
    """An Azure blob container (Azurite), through adlfs, addressed by a connection string."""

    connection_string: str = ""
    container: str = AZURE_CONTAINER

    @property
    def storage_options(self) -> dict:
        return {"connection_string": self.connection_string, "skip_instance_cache": True}

    def url(self, path: str = "") -> str:
        return f"az://{self.container}/{self.prefix}/{path}".rstrip("/")

    def blob_endpoint(self) -> str:
        """The BlobEndpoint of the connection string."""
        fields = dict(
            item.split("=", 1) for item in self.connection_string.split(";") if "=" in item
        )
        if "BlobEndpoint" not in fields:
            raise ValueError("the Azure connection string names no BlobEndpoint to test against")
        return fields["BlobEndpoint"]

    def address(self) -> tuple[str, int]:
        return _address_of(self.blob_endpoint())

    def through(self, proxy: Proxy) -> Backend:
        endpoint = urlsplit(self.blob_endpoint())
        proxied = f"{_proxy_url(proxy)}{endpoint.path}"
        return dataclasses.replace(
            self,
            connection_string=self.connection_string.replace(self.blob_endpoint(), proxied),
            proxied=True,
        )


def azurite_connection_string(blob_endpoint: str) -> str:
    """The well-known development-account connection string for an Azurite blob endpoint."""
    return (
        f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};"
        f"AccountKey={AZURITE_KEY};BlobEndpoint={blob_endpoint};"
    )


# --------------------------------------------------------------------------- servers


class MotoS3Server:
    """moto's S3 server in this process, with one bucket."""

    def __init__(self, bucket: str = BUCKET):
        self.bucket = bucket
        self._server = None
        self.endpoint_url = ""

    def start(self) -> MotoS3Server:
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise
        self._server = ThreadedMotoServer(ip_address=LOOPBACK, port=0, verbose=False)
        self._server.start()
        host, port = self._server.get_host_and_port()
        self.endpoint_url = f"http://{host}:{port}"
        wait_for_port(host, port)
        self.backend("").filesystem().mkdir(self.bucket)
        log.info("moto S3 server at %s", self.endpoint_url)
        return self

    def backend(self, prefix: str) -> S3Backend:
        return S3Backend("s3", prefix, "moto", endpoint_url=self.endpoint_url, bucket=self.bucket)

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None


def _quiet_about_vanished_clients(handle_error):
    """A socketserver error handler that logs a client hanging up (which fault tests make
    clients do) at debug level instead of printing a traceback; other errors still print."""

    def handle(request, client_address) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError):
            log.debug("client %s went away mid-answer", client_address)
            return
        handle_error(request, client_address)

    return handle


class GcsEmulatorServer:
    """gcp-storage-emulator in this process, in memory, with one bucket."""

    def __init__(self, bucket: str = BUCKET):
        self.bucket = bucket
        self._server = None
        self.endpoint_url = ""

    def start(self) -> GcsEmulatorServer:
        from gcp_storage_emulator.server import create_server

        self._server = create_server(LOOPBACK, 0, in_memory=True, default_bucket=self.bucket)
        self._server.start()
        httpd = self._server._api._httpd
        httpd.handle_error = _quiet_about_vanished_clients(httpd.handle_error)
        host, port = httpd.server_address[:2]
        self.endpoint_url = f"http://{host}:{port}"
        log.info("gcp-storage-emulator at %s", self.endpoint_url)
        return self

    def backend(self, prefix: str) -> GcsBackend:
        return GcsBackend(
            "gcs",
            prefix,
            "gcp-storage-emulator",
            endpoint_url=self.endpoint_url,
            bucket=self.bucket,
        )

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None


def find_executable(env_var: str, name: str, *candidates: str | Path) -> str | None:
    """The first of: the path in `env_var`, `name` on PATH, the existing `candidates`."""
    explicit = os.environ.get(env_var)
    if explicit:
        return explicit
    on_path = shutil.which(name)
    if on_path:
        return on_path
    for candidate in candidates:
        if Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


REPO_ROOT = Path(__file__).resolve().parents[2]


def find_azurite() -> str | None:
    """Azurite's blob server: $AZURITE_BIN, `azurite-blob` on PATH, or the project's npm copy."""
    local = REPO_ROOT / ".ci" / "tools" / "node_modules" / ".bin" / "azurite-blob"
    return find_executable("AZURITE_BIN", "azurite-blob", local)


def find_nginx() -> str | None:
    """nginx: $NGINX_BIN, `nginx` on PATH, or Debian's /usr/sbin/nginx."""
    return find_executable("NGINX_BIN", "nginx", "/usr/sbin/nginx")


PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child: have Linux send SIGTERM when the thread that started it dies, so a test
    run killed outright leaves no server behind."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


class _SubprocessServer(abc.ABC):
    """A server run as a child process on a free port; retried if another process took the port."""

    name = "server"
    attempts = 3

    def __init__(self, workdir: str | Path):
        self.workdir = Path(workdir)
        self.port = 0
        self._process: subprocess.Popen | None = None
        self._output = None

    @abc.abstractmethod
    def command(self, port: int) -> list[str]:
        """The command line that starts the server on `port`."""

    def start(self):
        self.workdir.mkdir(parents=True, exist_ok=True)
        last_error: Exception | None = None
        for _ in range(self.attempts):
            port = free_port()
            self._output = open(self.workdir / f"{self.name}.out", "ab")  # noqa: SIM115
            self._process = subprocess.Popen(
                self.command(port),
                stdin=subprocess.DEVNULL,
                stdout=self._output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent if sys.platform == "linux" else None,
            )
            try:
                wait_for_port(LOOPBACK, port, process=self._process)
                wait_for_http(f"http://{LOOPBACK}:{port}/")
            except (RuntimeError, TimeoutError) as error:
                last_error = error
                self.stop()
                continue
            self.port = port
            log.info("%s listening on %s:%d", self.name, LOOPBACK, port)
            return self
        output = (self.workdir / f"{self.name}.out").read_text(errors="replace")[-2000:]
        raise RuntimeError(f"{self.name} did not start: {last_error}\n{output}")

    def stop(self) -> None:
        if self._process is not None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(timeout=10)
            self._process = None
        if self._output is not None:
            self._output.close()
            self._output = None


class AzuriteServer(_SubprocessServer):
    """Azurite's blob service with one container, data kept under `workdir`."""

    name = "azurite"

    def __init__(self, executable: str, workdir: str | Path, container: str = AZURE_CONTAINER):
        super().__init__(workdir)
        self.executable = executable
        self.container = container

    def command(self, port: int) -> list[str]:
        return [
            self.executable,
            "--blobHost",
            LOOPBACK,
            "--blobPort",
            str(port),
            "--location",
            str(self.workdir / "data"),
            "--skipApiVersionCheck",
            "--loose",
            "--disableTelemetry",
            "--silent",
        ]

    @property
    def connection_string(self) -> str:
        return azurite_connection_string(f"http://{LOOPBACK}:{self.port}/{AZURITE_ACCOUNT}")

    def start(self) -> AzuriteServer:
        super().start()
        self.backend("").filesystem().mkdir(self.container)
        return self

    def backend(self, prefix: str) -> AzureBackend:
        return AzureBackend(
            "az",
            prefix,
            "azurite",
            connection_string=self.connection_string,
            container=self.container,
        )


NGINX_CONFIG = """\
daemon off;
master_process off;
worker_processes 1;
pid {work}/nginx.pid;
error_log {work}/error.log;
events {{ worker_connections 512; }}
http {{
    access_log {work}/access.log;
    client_body_temp_path {work}/tmp-body;
    proxy_temp_path {work}/tmp-proxy;
    fastcgi_temp_path {work}/tmp-fastcgi;
    uwsgi_temp_path {work}/tmp-uwsgi;
    scgi_temp_path {work}/tmp-scgi;
    default_type application/octet-stream;
    sendfile on;
    keepalive_timeout 300s;
    server {{
        listen {host}:{port};
        root {root};
        autoindex on;
    }}
}}
"""


class NginxServer(_SubprocessServer):
    """nginx serving the files under `root` with autoindex listings and Range support."""

    name = "nginx"

    def __init__(self, executable: str, workdir: str | Path):
        super().__init__(workdir)
        self.executable = executable
        self.root = self.workdir / "root"

    def command(self, port: int) -> list[str]:
        self.root.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "nginx.conf"
        config.write_text(
            NGINX_CONFIG.format(work=self.workdir, host=LOOPBACK, port=port, root=self.root)
        )
        return [
            self.executable,
            "-c",
            str(config),
            "-p",
            str(self.workdir),
            "-e",
            str(self.workdir / "error.log"),
        ]

    @property
    def base_url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def backend(self, prefix: str) -> HttpBackend:
        return HttpBackend("http", prefix, "nginx", base_url=self.base_url, root=str(self.root))


# --------------------------------------------------------------------------- external endpoints


class ExternalS3:
    """An S3 endpoint named by FSSPEC_SHARDS_TEST_S3_ENDPOINT (+ _KEY, _SECRET, _BUCKET)."""

    def __init__(self, endpoint_url: str):
        self.endpoint_url = endpoint_url
        self.bucket = os.environ.get("FSSPEC_SHARDS_TEST_S3_BUCKET", BUCKET)
        self.key = os.environ.get("FSSPEC_SHARDS_TEST_S3_KEY", "testing")
        self.secret = os.environ.get("FSSPEC_SHARDS_TEST_S3_SECRET", "testing")

    def start(self) -> ExternalS3:
        fs = self.backend("").filesystem()
        if not fs.exists(self.bucket):
            fs.mkdir(self.bucket)
        return self

    def backend(self, prefix: str) -> S3Backend:
        return S3Backend(
            "s3",
            prefix,
            "external",
            endpoint_url=self.endpoint_url,
            bucket=self.bucket,
            key=self.key,
            secret=self.secret,
        )

    def stop(self) -> None:
        """Nothing to stop: the endpoint belongs to the user."""


class ExternalGcs:
    """A GCS endpoint named by FSSPEC_SHARDS_TEST_GCS_ENDPOINT (+ _BUCKET)."""

    def __init__(self, endpoint_url: str):
        self.endpoint_url = endpoint_url
        self.bucket = os.environ.get("FSSPEC_SHARDS_TEST_GCS_BUCKET", BUCKET)

    def start(self) -> ExternalGcs:
        fs = self.backend("").filesystem()
        if not fs.exists(self.bucket):
            fs.mkdir(self.bucket)
        return self

    def backend(self, prefix: str) -> GcsBackend:
        return GcsBackend(
            "gcs", prefix, "external", endpoint_url=self.endpoint_url, bucket=self.bucket
        )

    def stop(self) -> None:
        """Nothing to stop: the endpoint belongs to the user."""


class ExternalAzure:
    """An Azure blob endpoint named by FSSPEC_SHARDS_TEST_AZURE_CONNECTION_STRING (+ _CONTAINER)."""

    def __init__(self, connection_string: str):
        self.connection_string = connection_string
        self.container = os.environ.get("FSSPEC_SHARDS_TEST_AZURE_CONTAINER", AZURE_CONTAINER)

    def start(self) -> ExternalAzure:
        fs = self.backend("").filesystem()
        if not fs.exists(self.container):
            fs.mkdir(self.container)
        return self

    def backend(self, prefix: str) -> AzureBackend:
        return AzureBackend(
            "az",
            prefix,
            "external",
            connection_string=self.connection_string,
            container=self.container,
        )

    def stop(self) -> None:
        """Nothing to stop: the endpoint belongs to the user."""


class ExternalHttp:
    """An HTTP server at FSSPEC_SHARDS_TEST_HTTP_URL serving FSSPEC_SHARDS_TEST_HTTP_DIR."""

    def __init__(self, base_url: str, root: str):
        self.base_url = base_url
        self.root = root

    def start(self) -> ExternalHttp:
        Path(self.root).mkdir(parents=True, exist_ok=True)
        return self

    def backend(self, prefix: str) -> HttpBackend:
        return HttpBackend("http", prefix, "external", base_url=self.base_url, root=self.root)

    def stop(self) -> None:
        """Nothing to stop: the server belongs to the user."""


class Unavailable(RuntimeError):
    """A backend cannot run here (a server binary is missing); the message says what to install."""


def start_s3(workdir: Path):
    """The S3 service: the external endpoint if configured, else moto in-process."""
    endpoint = os.environ.get("FSSPEC_SHARDS_TEST_S3_ENDPOINT")
    return (ExternalS3(endpoint) if endpoint else MotoS3Server()).start()


def start_gcs(workdir: Path):
    """The GCS service: the external endpoint if configured, else gcp-storage-emulator."""
    endpoint = os.environ.get("FSSPEC_SHARDS_TEST_GCS_ENDPOINT")
    return (ExternalGcs(endpoint) if endpoint else GcsEmulatorServer()).start()


def start_azure(workdir: Path):
    """The Azure service: the external connection string if configured, else Azurite."""
    connection_string = os.environ.get("FSSPEC_SHARDS_TEST_AZURE_CONNECTION_STRING")
    if connection_string:
        return ExternalAzure(connection_string).start()
    executable = find_azurite()
    if executable is None:
        raise Unavailable(
            "Azurite not found: set AZURITE_BIN, put azurite-blob on PATH, or run "
            "`npm install --prefix .ci/tools azurite@3.35.0`"
        )
    return AzuriteServer(executable, workdir).start()


def start_http(workdir: Path):
    """The HTTP service: the external server if configured, else nginx serving `workdir`/root."""
    base_url = os.environ.get("FSSPEC_SHARDS_TEST_HTTP_URL")
    if base_url:
        root = os.environ.get("FSSPEC_SHARDS_TEST_HTTP_DIR")
        if not root:
            raise Unavailable(
                "FSSPEC_SHARDS_TEST_HTTP_URL needs FSSPEC_SHARDS_TEST_HTTP_DIR, "
                "the local directory that server serves"
            )
        return ExternalHttp(base_url, root).start()
    executable = find_nginx()
    if executable is None:
        raise Unavailable("nginx not found: set NGINX_BIN or install nginx (e.g. nginx-light)")
    return NginxServer(executable, workdir).start()


@contextlib.contextmanager
def running(starter, workdir: str | Path | None = None):
    """Start a service with `starter(workdir)` and stop it on exit (for scripts and benchmarks)."""
    with contextlib.ExitStack() as stack:
        if workdir is None:
            workdir = stack.enter_context(tempfile.TemporaryDirectory(prefix="fsspec-shards-"))
        service = starter(Path(workdir))
        try:
            yield service
        finally:
            service.stop()
