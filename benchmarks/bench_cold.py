"""Benchmark cold downloads from local servers: what each reader gets out of them.

moto's S3 server runs in a process of its own on loopback (so its work does not share our
interpreter) and holds a few objects of 64 MiB and their SHA256SUMS; then nginx serves the
same as files (moto copies the whole object for every ranged GET, about 0.1 s per 64 MiB,
so readers that make several requests per object pay a cost real S3 does not; nginx
serves ranges with sendfile). On each server, every round, every reader reads every object
cold (fresh cache directories), in an order that rotates from round to round; the table
gives the median MB/s and the median of the per-round ratios to the plain GET of the same
bytes (and to ``simplecache::``). The readers:

- plain GET: one ``urllib`` stream (of a presigned URL on S3), bytes read and dropped: the
  line rate
- no network: the same bytes written from memory to a file and fsynced, the disk's ceiling
  for any cache fill that makes its files durable
- obstore ``get``: one streamed GET through the Rust client, bytes dropped
- the fsspec backend's ``open`` + ``read`` (s3fs, fsspec's http); ``simplecache::`` cold
- ``wds::`` cold (open + read of each object, which fills the cache) through each download
  transport (``transport="fsspec"`` / ``"obstore"``), with ``verify=False`` and with
  ``verify="auto"`` + SHA256SUMS, with ``ranges_in_flight=1``
- ``wds::`` with its defaults (``ranges_in_flight="auto"``, ``verify="auto"`` +
  SHA256SUMS) through each transport, each round as a new process with a new cache finds
  the store (nothing learned: the first object probes); "vs one stream" is the ratio to
  the same transport's ``ranges_in_flight=1`` row
- the obstore fill with ``verify="auto"`` in three variants, to show what each choice of
  the download path is worth here: ``ranges_in_flight=4`` (16 MiB ranges written with
  ``os.pwrite``), hashing inline instead of on a worker thread, and no early writeback
- the obstore transport alone filling a file with sha256 on a thread but no fsync: what
  the fsync every cached file gets costs

    python benchmarks/bench_cold.py [--rounds 5] [--objects 4] [--mib 64] [--servers moto nginx]
                                    [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import fsspec  # noqa: E402

from fsspec_shards.storage.transfer import one_stream, planner, range_plan, ranges  # noqa: E402
from fsspec_shards.storage.transfer.obstore_transport import ObstoreTransport, choose_transport  # noqa: E402
from fsspec_shards.storage.transfer.one_stream import OrderedHasher  # noqa: E402
from tests.integration import servers  # noqa: E402

MiB = 1024 * 1024
BUCKET = "bench"
KEY, SECRET = "testing", "testing"
TIMEOUT = 60.0


@dataclass(frozen=True)
class Setup:
    """The server and the objects every reader reads: each as an fsspec URL, the backend
    path the transport takes, and a URL a plain HTTP client can GET (presigned for S3)."""

    server: str
    protocol: str
    options: dict
    urls: tuple[str, ...]
    paths: tuple[str, ...]
    plain_urls: tuple[str, ...]
    sizes: dict[str, int]
    digests: dict[str, str]
    sums_url: str
    workdir: str

    @property
    def objects(self) -> Iterator[tuple[str, str, int, str]]:
        """(fsspec URL, backend path, size, sha256) of every object."""
        for url, path in zip(self.urls, self.paths, strict=True):
            yield url, path, self.sizes[url], self.digests[url]

    def fresh_dir(self, name: str) -> str:
        return tempfile.mkdtemp(prefix=f"{name}-", dir=self.workdir)


@contextlib.contextmanager
def moto_process(workdir: str) -> Iterator[str]:
    """moto's S3 server in a child process; yields its endpoint URL."""
    port = servers.free_port()
    log = open(os.path.join(workdir, "moto.log"), "wb")  # noqa: SIM115
    process = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", servers.LOOPBACK, "-p", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        servers.wait_for_port(servers.LOOPBACK, port, process=process)
        yield f"http://{servers.LOOPBACK}:{port}"
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()


def _objects(objects: int, mib: int) -> Iterator[tuple[str, bytes]]:
    rng = random.Random(7)
    for number in range(objects):
        yield f"shard-{number:04d}.tar", b"".join(rng.randbytes(MiB) for _ in range(mib))


def _sums(named: dict[str, str]) -> bytes:
    return "".join(f"{digest}  {name}\n" for name, digest in named.items()).encode()


def s3_setup(endpoint: str, objects: int, mib: int, workdir: str) -> Setup:
    """The objects in a bucket of the S3 server at ``endpoint``."""
    import botocore.session

    options = {
        "key": KEY,
        "secret": SECRET,
        "client_kwargs": {"endpoint_url": endpoint},
        "skip_instance_cache": True,
    }
    fs = fsspec.filesystem("s3", **options)
    fs.mkdir(BUCKET)
    signer = botocore.session.get_session().create_client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id=KEY,
        aws_secret_access_key=SECRET,
    )
    urls, paths, plain, sizes, digests, named = [], [], [], {}, {}, {}
    for name, data in _objects(objects, mib):
        path = f"{BUCKET}/cold/{name}"
        fs.pipe_file(path, data)
        url = f"s3://{path}"
        urls.append(url)
        paths.append(path)
        plain.append(
            signer.generate_presigned_url(
                "get_object", Params={"Bucket": BUCKET, "Key": f"cold/{name}"}, ExpiresIn=86400
            )
        )
        sizes[url], digests[url] = len(data), hashlib.sha256(data).hexdigest()
        named[name] = digests[url]
    fs.pipe_file(f"{BUCKET}/cold/SHA256SUMS", _sums(named))
    return Setup(
        "moto S3",
        "s3",
        options,
        tuple(urls),
        tuple(paths),
        tuple(plain),
        sizes,
        digests,
        f"s3://{BUCKET}/cold/SHA256SUMS",
        workdir,
    )


def http_setup(backend: servers.HttpBackend, objects: int, mib: int, workdir: str) -> Setup:
    """The objects as files nginx serves."""
    urls, sizes, digests, named = [], {}, {}, {}
    for name, data in _objects(objects, mib):
        url = backend.put(name, data)
        urls.append(url)
        sizes[url], digests[url] = len(data), hashlib.sha256(data).hexdigest()
        named[name] = digests[url]
    return Setup(
        "nginx",
        "http",
        {"skip_instance_cache": True},
        tuple(urls),
        tuple(urls),
        tuple(urls),
        sizes,
        digests,
        backend.put("SHA256SUMS", _sums(named)),
        workdir,
    )


# --------------------------------------------------------------------------- readers


def plain_get(setup: Setup) -> None:
    for url in setup.plain_urls:
        with urllib.request.urlopen(url) as response:
            while response.read(MiB):
                pass


def obstore_get(setup: Setup) -> None:
    import obstore
    from obstore.store import HTTPStore, S3Store

    if setup.protocol == "s3":
        store = S3Store(
            BUCKET,
            endpoint=setup.options["client_kwargs"]["endpoint_url"],
            access_key_id=KEY,
            secret_access_key=SECRET,
            region="us-east-1",
            client_options={"allow_http": True},
        )
        keys = [path.split("/", 1)[1] for path in setup.paths]
    else:
        origin = "/".join(setup.urls[0].split("/")[:3])
        store = HTTPStore.from_url(origin, client_options={"allow_http": True})
        keys = [url[len(origin) + 1 :] for url in setup.urls]
    for key in keys:
        for _ in obstore.get(store, key).stream(min_chunk_size=0):
            pass


def read_through(handle) -> int:
    """Read an open file to its end as a streaming consumer does (a tar reader, a copy):
    1 MiB at a time into one buffer, so what is measured is the file's delivery, not the
    allocation of one object-sized ``bytes``. Returns the bytes read."""
    buffer = bytearray(1024 * 1024)
    total = 0
    while got := handle.readinto(buffer):
        total += got
    return total


def fsspec_read(setup: Setup) -> None:
    fs = fsspec.filesystem(setup.protocol, **setup.options)
    for url in setup.urls:
        with fs.open(url, "rb") as handle:
            read_through(handle)


def simplecache_cold(setup: Setup) -> None:
    directory = setup.fresh_dir("simplecache")
    try:
        for url in setup.urls:
            with fsspec.open(
                f"simplecache::{url}",
                "rb",
                simplecache={"cache_storage": directory},
                **{setup.protocol: setup.options},
            ) as handle:
                read_through(handle)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@contextlib.contextmanager
def _variant(hash_inline: bool = False, no_writeback: bool = False) -> Iterator[None]:
    """The download path with one of its choices undone, for the comparison rows: hashing
    inline (no object is large enough for the worker thread), no early writeback (never
    enough bytes written to start it)."""
    saved = planner.HASH_ON_A_THREAD_ABOVE, one_stream.WRITEBACK_EVERY
    if hash_inline:
        planner.HASH_ON_A_THREAD_ABOVE = 1 << 62
    if no_writeback:  # (one stream's Writeback and the ranges' writeback thread)
        one_stream.WRITEBACK_EVERY = ranges.WRITEBACK_EVERY = 1 << 62
    try:
        yield
    finally:
        planner.HASH_ON_A_THREAD_ABOVE = saved[0]
        one_stream.WRITEBACK_EVERY = ranges.WRITEBACK_EVERY = saved[1]


def wds_cold(
    transport: str, verify: str | bool, ranges_in_flight: int | str = 1, **variant: bool
) -> Callable[[Setup], None]:
    """``wds::`` cold into a fresh cache directory. With ``ranges_in_flight="auto"`` (the
    default) each read also starts with nothing learned about the store
    (``range_plan.forget``), as a new process with a new cache directory does: every
    object of the round after the first starts where the first settled."""

    def read(setup: Setup) -> None:
        if ranges_in_flight == "auto":
            range_plan.forget()
        directory = setup.fresh_dir("wds")
        options = {"verify": verify, "transport": transport, "ranges_in_flight": ranges_in_flight}
        if verify == "auto":
            options["checksums"] = setup.sums_url
        fs = fsspec.filesystem(
            "wds",
            target_protocol=setup.protocol,
            target_options=setup.options,
            cache_dir=directory,
            skip_instance_cache=True,
            **options,
        )
        try:
            with _variant(**variant):
                for url in setup.urls:
                    with fs.open(url, "rb") as handle:
                        read_through(handle)
        finally:
            shutil.rmtree(directory, ignore_errors=True)

    return read


def _transport(setup: Setup) -> ObstoreTransport:
    return choose_transport(setup.protocol, setup.options, "obstore")


def _check(path: str, digest: str, expected: str) -> None:
    if digest != expected:
        raise RuntimeError(f"sha256 mismatch for {path}")


def transport_no_fsync(setup: Setup) -> None:
    """One GET per object through the obstore transport; the receiving thread writes, a
    worker thread hashes; no fsync (what the cache's fsync costs, by difference)."""
    transport = _transport(setup)
    directory = setup.fresh_dir("nofsync")
    try:
        for _, key, size, expected in setup.objects:
            hasher = OrderedHasher(("sha256",))
            with open(os.path.join(directory, "part"), "wb") as out:

                def sink(data: bytes, out=out, hasher=hasher) -> None:
                    out.write(data)
                    hasher.update(data)

                transport.stream(key, 0, size, sink, TIMEOUT)
            _check(key, hasher.checksums()[0].hexdigest, expected)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def local_write_fsync(setup: Setup) -> None:
    """No network: the same number of bytes written from memory and fsynced, the ceiling
    the disk sets for any cache fill."""
    data = bytes(MiB)
    directory = setup.fresh_dir("disk")
    try:
        for _, _, size, _ in setup.objects:
            with open(os.path.join(directory, "part"), "wb") as out:
                for start in range(0, size, MiB):
                    out.write(data[: min(MiB, size - start)])
                out.flush()
                os.fsync(out.fileno())
    finally:
        shutil.rmtree(directory, ignore_errors=True)


READERS: dict[str, Callable[[Setup], None]] = {
    "plain_get": plain_get,
    "local_write_fsync": local_write_fsync,
    "obstore_get": obstore_get,
    "fsspec_open_read": fsspec_read,
    "simplecache_cold": simplecache_cold,
    "wds_fsspec_default": wds_cold("fsspec", "auto", ranges_in_flight="auto"),
    "wds_obstore_default": wds_cold("obstore", "auto", ranges_in_flight="auto"),
    "wds_fsspec_verify_off": wds_cold("fsspec", False),
    "wds_fsspec_verify_auto_sha256sums": wds_cold("fsspec", "auto"),
    "wds_obstore_verify_off": wds_cold("obstore", False),
    "wds_obstore_verify_auto_sha256sums": wds_cold("obstore", "auto"),
    "wds_obstore_auto_4_ranges_in_flight": wds_cold("obstore", "auto", ranges_in_flight=4),
    "wds_obstore_auto_hash_inline": wds_cold("obstore", "auto", hash_inline=True),
    "wds_obstore_auto_no_early_writeback": wds_cold("obstore", "auto", no_writeback=True),
    "transport_file_sha256_no_fsync": transport_no_fsync,
}
SERVERS = ("moto", "nginx")
QUICK = (
    "plain_get",
    "simplecache_cold",
    "wds_fsspec_default",
    "wds_fsspec_verify_auto_sha256sums",
    "wds_obstore_default",
    "wds_obstore_verify_auto_sha256sums",
)
"""``--quick``: the readers of the default-vs-one-stream comparison (issue 29)."""


@contextlib.contextmanager
def serving(server: str, objects: int, mib: int, workdir: str) -> Iterator[Setup]:
    """The objects on ``server`` ("moto": S3 in a process of its own; "nginx": files)."""
    if server == "moto":
        with moto_process(workdir) as endpoint:
            yield s3_setup(endpoint, objects, mib, workdir)
    else:
        with servers.running(servers.start_http, os.path.join(workdir, "nginx")) as service:
            yield http_setup(service.backend("cold"), objects, mib, workdir)


def measure(
    setup: Setup, rounds: int, names: tuple[str, ...] = tuple(READERS)
) -> dict[str, dict[str, float]]:
    """Every reader of ``names``, interleaved round by round in a rotating order: ``{reader:
    {mb_per_s, vs_plain_get, vs_simplecache, vs_one_stream}}``, median MB/s and medians of
    the per-round speed ratios (above 1: faster than the plain GET / simplecache / the same
    transport with ``ranges_in_flight=1``, for the default rows)."""
    names = list(names)
    times: dict[str, list[float]] = {name: [] for name in names}
    for name in names:  # warm-up: imports, connections, the server's first answers
        READERS[name](setup)
    for round_number in range(rounds):
        shift = round_number % len(names)
        for name in names[shift:] + names[:shift]:
            started = time.perf_counter()
            READERS[name](setup)
            times[name].append(time.perf_counter() - started)
    total = sum(setup.sizes.values())
    results = {}
    for name in names:
        results[name] = {
            "mb_per_s": total / 1e6 / statistics.median(times[name]),
            "vs_plain_get": statistics.median(
                plain / own for plain, own in zip(times["plain_get"], times[name], strict=True)
            ),
            "vs_simplecache": statistics.median(
                other / own
                for other, own in zip(times["simplecache_cold"], times[name], strict=True)
            ),
        }
        one_stream = name.replace("_default", "_verify_auto_sha256sums")
        if name.endswith("_default") and one_stream in times:
            results[name]["vs_one_stream"] = statistics.median(
                other / own for other, own in zip(times[one_stream], times[name], strict=True)
            )
    return results


def run(
    rounds: int = 5,
    objects: int = 4,
    mib: int = 64,
    directory: str | None = None,
    server_names: tuple[str, ...] = SERVERS,
    names: tuple[str, ...] = tuple(READERS),
) -> dict[str, dict[str, float]]:
    """``{"<server> <reader>": {mb_per_s, vs_plain_get, vs_simplecache}}`` for each server."""
    results = {}
    for server in server_names:
        with tempfile.TemporaryDirectory(prefix="bench-cold-", dir=directory) as workdir:
            with serving(server, objects, mib, workdir) as setup:
                for reader, values in measure(setup, rounds, names).items():
                    results[f"{server} {reader}"] = values
    return results


def print_table(results: dict[str, dict[str, float]], objects: int, mib: int) -> None:
    print(f"\ncold reads of {objects} x {mib} MiB on loopback (medians)\n")
    print("| server | reader | MB/s | vs plain GET | vs simplecache:: | vs one stream |")
    print("|---|---|---:|---:|---:|---:|")
    for case, values in results.items():
        server, reader = case.split(" ", 1)
        one = values.get("vs_one_stream")
        print(
            f"| {server} | {reader} | {values['mb_per_s']:,.0f} "
            f"| {values['vs_plain_get']:.2f}x | {values['vs_simplecache']:.2f}x "
            f"| {'' if one is None else f'{one:.2f}x'} |"
        )


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved repeats (default 5)")
    parser.add_argument("--objects", type=int, default=4, help="objects per round (default 4)")
    parser.add_argument("--mib", type=int, default=64, help="MiB per object (default 64)")
    parser.add_argument(
        "--servers", nargs="+", choices=SERVERS, default=list(SERVERS), help="default: both"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="only the default-vs-one-stream readers (" + ", ".join(QUICK) + ")",
    )
    arguments = parser.parse_args(argv)
    results = run(
        arguments.rounds,
        arguments.objects,
        arguments.mib,
        server_names=tuple(arguments.servers),
        names=QUICK if arguments.quick else tuple(READERS),
    )
    print_table(results, arguments.objects, arguments.mib)
    return results


if __name__ == "__main__":
    main()
