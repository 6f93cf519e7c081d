"""Benchmark cold downloads from a local S3 server: what each reader gets out of it.

moto's S3 server runs in a process of its own on loopback (so its work does not share our
interpreter) and holds a few objects of 64 MiB and their SHA256SUMS. Every round, every
reader reads every object cold (fresh cache directories), in an order that rotates from
round to round; the table gives the median MB/s and the median of the per-round ratios to
the plain GET of the same bytes (and to ``simplecache::``). The readers:

- plain GET: one ``urllib`` stream of a presigned URL, bytes read and dropped: the line rate
- obstore ``get``: one streamed GET through the Rust client, bytes dropped
- s3fs ``open`` + ``read``; fsspec ``simplecache::`` cold
- ``wds::`` cold with ``verify=False`` and with ``verify="auto"`` + SHA256SUMS (the download
  path of today, over the fsspec backend)
- no network: the same bytes written from memory to a file and fsynced, the disk's ceiling
- the obstore transport alone (``storage/obstore_transport.py``) filling a file as the cache
  does (written, sha256 checked, fsynced): hashing inline in the receiving thread; hashing on
  a worker thread; writing and hashing on a worker thread; several ranges in flight written
  with ``os.pwrite`` into a preallocated file while a worker hashes the finished ranges in
  order.

    python benchmarks/bench_cold.py [--rounds 5] [--objects 4] [--mib 64]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import queue
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import fsspec  # noqa: E402

from fsspec_shards.storage.obstore_transport import ObstoreTransport, choose_transport  # noqa: E402
from tests.integration import servers  # noqa: E402

MiB = 1024 * 1024
BUCKET = "bench"
KEY, SECRET = "testing", "testing"
RANGE_BYTES = 16 * MiB
RANGES_IN_FLIGHT = 4
HASH_PIECE = 8 * MiB
TIMEOUT = 60.0


@dataclass(frozen=True)
class Setup:
    """The server and the objects every reader reads."""

    endpoint: str
    keys: tuple[str, ...]
    sizes: dict[str, int]
    digests: dict[str, str]
    workdir: str

    @property
    def options(self) -> dict:
        return {
            "key": KEY,
            "secret": SECRET,
            "client_kwargs": {"endpoint_url": self.endpoint, "region_name": "us-east-1"},
            "skip_instance_cache": True,
        }

    def fresh_dir(self, name: str) -> str:
        path = tempfile.mkdtemp(prefix=f"{name}-", dir=self.workdir)
        return path


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


def upload(endpoint: str, objects: int, mib: int, workdir: str) -> Setup:
    fs = fsspec.filesystem("s3", key=KEY, secret=SECRET, client_kwargs={"endpoint_url": endpoint})
    fs.mkdir(BUCKET)
    rng = random.Random(7)
    keys, sizes, digests = [], {}, {}
    for number in range(objects):
        key = f"{BUCKET}/cold/shard-{number:04d}.tar"
        data = rng.randbytes(mib * MiB)
        fs.pipe_file(key, data)
        keys.append(key)
        sizes[key] = len(data)
        digests[key] = hashlib.sha256(data).hexdigest()
    sums = "".join(f"{digests[k]}  {k.rsplit('/', 1)[1]}\n" for k in keys)
    fs.pipe_file(f"{BUCKET}/cold/SHA256SUMS", sums.encode())
    return Setup(endpoint, tuple(keys), sizes, digests, workdir)


# --------------------------------------------------------------------------- readers


def plain_get(setup: Setup) -> None:
    import botocore.session

    client = botocore.session.get_session().create_client(
        "s3",
        endpoint_url=setup.endpoint,
        region_name="us-east-1",
        aws_access_key_id=KEY,
        aws_secret_access_key=SECRET,
    )
    for key in setup.keys:
        bucket, name = key.split("/", 1)
        url = client.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": name})
        with urllib.request.urlopen(url) as response:
            while response.read(MiB):
                pass


def obstore_get(setup: Setup) -> None:
    import obstore
    from obstore.store import S3Store

    store = S3Store(
        BUCKET,
        endpoint=setup.endpoint,
        access_key_id=KEY,
        secret_access_key=SECRET,
        region="us-east-1",
        client_options={"allow_http": True},
    )
    for key in setup.keys:
        for _ in obstore.get(store, key.split("/", 1)[1]).stream(min_chunk_size=0):
            pass


def s3fs_read(setup: Setup) -> None:
    fs = fsspec.filesystem("s3", **setup.options)
    for key in setup.keys:
        with fs.open(key, "rb") as handle:
            handle.read()


def simplecache_cold(setup: Setup) -> None:
    directory = setup.fresh_dir("simplecache")
    try:
        for key in setup.keys:
            with fsspec.open(
                f"simplecache::s3://{key}",
                "rb",
                s3=setup.options,
                simplecache={"cache_storage": directory},
            ) as handle:
                handle.read()
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def wds_cold(verify: str | bool) -> Callable[[Setup], None]:
    def read(setup: Setup) -> None:
        directory = setup.fresh_dir("wds")
        options = {"verify": verify}
        if verify == "auto":
            options["checksums"] = f"s3://{BUCKET}/cold/SHA256SUMS"
        fs = fsspec.filesystem(
            "wds",
            target_protocol="s3",
            target_options=setup.options,
            cache_dir=directory,
            skip_instance_cache=True,
            **options,
        )
        try:
            for key in setup.keys:
                with fs.open(f"s3://{key}", "rb") as handle:
                    handle.read()
        finally:
            shutil.rmtree(directory, ignore_errors=True)

    return read


def _transport(setup: Setup) -> ObstoreTransport:
    return choose_transport("s3", setup.options, "obstore")


def _check(setup: Setup, key: str, digest: str) -> None:
    if digest != setup.digests[key]:
        raise RuntimeError(f"sha256 mismatch for {key}")


def transport_inline(setup: Setup) -> None:
    """One GET per object; the receiving thread writes and hashes each piece."""
    transport = _transport(setup)
    directory = setup.fresh_dir("inline")
    try:
        for key in setup.keys:
            hasher = hashlib.sha256()
            with open(os.path.join(directory, "part"), "wb") as out:

                def sink(data: bytes, out=out, hasher=hasher) -> None:
                    out.write(data)
                    hasher.update(data)

                transport.stream(key, 0, setup.sizes[key], sink, TIMEOUT)
                out.flush()
                os.fsync(out.fileno())
            _check(setup, key, hasher.hexdigest())
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def transport_hash_thread(setup: Setup) -> None:
    """One GET per object; the receiving thread writes, a worker thread hashes."""
    transport = _transport(setup)
    directory = setup.fresh_dir("thread")
    try:
        for key in setup.keys:
            pieces: queue.Queue = queue.Queue(maxsize=64)
            hasher = hashlib.sha256()

            def hash_pieces(pieces=pieces, hasher=hasher) -> None:
                while (piece := pieces.get()) is not None:
                    hasher.update(piece)

            worker = threading.Thread(target=hash_pieces)
            worker.start()
            try:
                with open(os.path.join(directory, "part"), "wb") as out:

                    def sink(data: bytes, out=out, pieces=pieces) -> None:
                        out.write(data)
                        pieces.put(data)

                    transport.stream(key, 0, setup.sizes[key], sink, TIMEOUT)
                    out.flush()
                    os.fsync(out.fileno())
            finally:
                pieces.put(None)
                worker.join()
            _check(setup, key, hasher.hexdigest())
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def transport_write_thread(setup: Setup) -> None:
    """One GET per object; the receiving thread only receives, a worker writes and hashes
    (the network read never waits for the disk)."""
    transport = _transport(setup)
    directory = setup.fresh_dir("writer")
    try:
        for key in setup.keys:
            pieces: queue.Queue = queue.Queue(maxsize=256)
            hasher = hashlib.sha256()
            out = open(os.path.join(directory, "part"), "wb")  # noqa: SIM115

            def write_pieces(pieces=pieces, hasher=hasher, out=out) -> None:
                while (piece := pieces.get()) is not None:
                    out.write(piece)
                    hasher.update(piece)

            worker = threading.Thread(target=write_pieces)
            worker.start()
            try:
                transport.stream(key, 0, setup.sizes[key], pieces.put, TIMEOUT)
            finally:
                pieces.put(None)
                worker.join()
                out.flush()
                os.fsync(out.fileno())
                out.close()
            _check(setup, key, hasher.hexdigest())
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def transport_parallel(setup: Setup) -> None:
    """Ranges of RANGE_BYTES, RANGES_IN_FLIGHT at a time, written with ``os.pwrite`` into a
    preallocated file; a worker hashes the finished ranges in order (read back with
    ``os.pread``, from the page cache)."""
    transport = _transport(setup)
    directory = setup.fresh_dir("parallel")
    try:
        with ThreadPoolExecutor(RANGES_IN_FLIGHT) as pool:
            for key in setup.keys:
                path = os.path.join(directory, "part")
                digest = _fill_in_ranges(transport, key, setup.sizes[key], path, pool)
                _check(setup, key, digest)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _fill_in_ranges(
    transport: ObstoreTransport, key: str, size: int, path: str, pool: ThreadPoolExecutor
) -> str:
    """Fill ``path`` with object ``key`` by ranges in flight on ``pool``; its sha256."""
    starts = range(0, size, RANGE_BYTES)
    finished = {start: threading.Event() for start in starts}
    hasher = hashlib.sha256()
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)

    def fetch(start: int) -> None:
        offset = start

        def sink(data: bytes) -> None:
            nonlocal offset
            os.pwrite(descriptor, data, offset)
            offset += len(data)

        transport.stream(key, start, min(size, start + RANGE_BYTES), sink, TIMEOUT)
        finished[start].set()

    def hash_in_order() -> None:
        for start in starts:
            finished[start].wait()
            end = min(size, start + RANGE_BYTES)
            for piece in range(start, end, HASH_PIECE):
                hasher.update(os.pread(descriptor, min(HASH_PIECE, end - piece), piece))

    try:
        os.posix_fallocate(descriptor, 0, size)
        hashing = threading.Thread(target=hash_in_order)
        hashing.start()
        try:
            for future in [pool.submit(fetch, start) for start in starts]:
                future.result()
        finally:
            for event in finished.values():
                event.set()  # a failed range must not leave the hasher waiting
            hashing.join()
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
    return hasher.hexdigest()


def local_write_fsync(setup: Setup) -> None:
    """No network: the same number of bytes written from memory and fsynced, the ceiling
    the disk sets for any cache fill."""
    data = bytes(max(setup.sizes.values()))
    directory = setup.fresh_dir("disk")
    try:
        for key in setup.keys:
            with open(os.path.join(directory, "part"), "wb") as out:
                for start in range(0, setup.sizes[key], MiB):
                    out.write(data[start : start + MiB])
                out.flush()
                os.fsync(out.fileno())
    finally:
        shutil.rmtree(directory, ignore_errors=True)


READERS: dict[str, Callable[[Setup], None]] = {
    "plain_get": plain_get,
    "local_write_fsync": local_write_fsync,
    "obstore_get": obstore_get,
    "s3fs_read": s3fs_read,
    "simplecache_cold": simplecache_cold,
    "wds_cold_verify_off": wds_cold(False),
    "wds_cold_verify_auto_sha256sums": wds_cold("auto"),
    "transport_file_sha256_inline": transport_inline,
    "transport_file_sha256_thread": transport_hash_thread,
    "transport_file_write_thread": transport_write_thread,
    "transport_file_4_ranges_pwrite": transport_parallel,
}


def run(
    rounds: int = 5, objects: int = 4, mib: int = 64, directory: str | None = None
) -> dict[str, dict[str, float]]:
    """``{reader: {mb_per_s, vs_plain_get, vs_simplecache}}``: median MB/s and medians of the
    per-round ratios of speed (above 1: faster than the plain GET / simplecache)."""
    with tempfile.TemporaryDirectory(prefix="bench-cold-", dir=directory) as workdir:
        with moto_process(workdir) as endpoint:
            setup = upload(endpoint, objects, mib, workdir)
            total = sum(setup.sizes.values())
            names = list(READERS)
            times: dict[str, list[float]] = {name: [] for name in names}
            for name in names:  # warm-up: imports, connections, the server's first answers
                READERS[name](setup)
            for round_number in range(rounds):
                shift = round_number % len(names)
                for name in names[shift:] + names[:shift]:
                    started = time.perf_counter()
                    READERS[name](setup)
                    times[name].append(time.perf_counter() - started)
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
    return results


def print_table(results: dict[str, dict[str, float]], objects: int, mib: int) -> None:
    print(f"\ncold reads of {objects} x {mib} MiB from moto S3 on loopback (medians)\n")
    print("| reader | MB/s | vs plain GET | vs simplecache:: |\n|---|---:|---:|---:|")
    for name, values in results.items():
        print(
            f"| {name} | {values['mb_per_s']:,.0f} | {values['vs_plain_get']:.2f}x "
            f"| {values['vs_simplecache']:.2f}x |"
        )


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved repeats (default 5)")
    parser.add_argument("--objects", type=int, default=4, help="objects per round (default 4)")
    parser.add_argument("--mib", type=int, default=64, help="MiB per object (default 64)")
    arguments = parser.parse_args(argv)
    results = run(arguments.rounds, arguments.objects, arguments.mib)
    print_table(results, arguments.objects, arguments.mib)
    return results


if __name__ == "__main__":
    main()
